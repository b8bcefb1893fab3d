"""The four LLM roles of the verification loop and their prompt templates.

`formulator` writes a model from a description; `structure_checker` restates a model as requirements and
compares them with the description; `solution_interpreter` reads a solved plan back against the description;
`corrector` revises a model from the verifiers' findings. The defaults below can be replaced by a folder
holding `<role>.txt` files (`Prompts.from_folder`): Python format strings with the fields {description},
{model}, {plan}, {feedback} and {format} (the model format's description) as each role uses them.
"""

from __future__ import annotations

import dataclasses
import os

from jaxlab.errors import ConfigError

FORMAT = """Write the model as ONE JSON object in a ```json block with keys:
"sets": {name: [elements]}, "parameters": {name: number or {element: number}},
"units" (optional): {parameter: "unit"},
"variables": [{"name", "over": [set names], "type": "continuous"|"integer"|"binary", "lb", "ub", "meaning"}],
"constraints": [{"name", "forall": "i in I" (optional), "expr": "linear expression <= / >= / == expression", "meaning"}],
"objective": {"sense": "maximize"|"minimize", "expr": "linear expression"}.
Expressions use + - * /, parentheses, parameters and variables indexed like cost[i, j] and x[i], and
sum(i in I, j in J, expression). Use every number of the description, and only those."""

DEFAULTS = {
    "formulator": ("You are an operations research expert. Build a mathematical optimization model of the problem "
                   "below.\n\n{format}\n\nProblem:\n{description}"),
    "structure_checker": ("Restate the optimization model below as a list of requirements (variables, their types, "
                          "each constraint, the objective), then compare them item by item with the problem. Reply "
                          "with the single word OK if they match; otherwise list each mismatch on its own line.\n\n"
                          "Problem:\n{description}\n\nModel:\n{model}"),
    "solution_interpreter": ("Here is the solution of an optimization model, as a plan. Read it as a decision a "
                             "manager would take and judge whether it satisfies every requirement of the problem. "
                             "Reply with the single word VALID if it does; otherwise list each violated "
                             "requirement.\n\nProblem:\n{description}\n\nModel:\n{model}\n\nPlan:\n{plan}"),
    "corrector": ("The optimization model below was checked against the problem and these issues were found:\n"
                  "{feedback}\n\nFix every issue and return the complete corrected model.\n\n{format}\n\n"
                  "Problem:\n{description}\n\nModel:\n{model}"),
}
ROLES = tuple(DEFAULTS)
SYSTEM = "You are a careful operations research assistant."


@dataclasses.dataclass(frozen=True)
class Prompts:
  """Templates of the four roles (see the module docstring) and the answer budget `max_tokens`."""
  templates: tuple[tuple[str, str], ...] = tuple(DEFAULTS.items())
  max_tokens: int = 2048

  @classmethod
  def from_folder(cls, folder: str, max_tokens: int = 2048) -> "Prompts":
    """Defaults overridden by the `<role>.txt` files found in `folder`."""
    if not os.path.isdir(folder):
      raise ConfigError(f"prompt folder {folder!r} does not exist; it holds <role>.txt files for roles {list(ROLES)}")
    t = dict(DEFAULTS)
    for role in ROLES:
      path = os.path.join(folder, f"{role}.txt")
      if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
          t[role] = f.read()
    unknown = sorted(n[:-4] for n in os.listdir(folder) if n.endswith(".txt") and n[:-4] not in ROLES)
    if unknown:
      raise ConfigError(f"{folder}: unknown prompt file(s) {unknown}; the roles are {list(ROLES)}")
    return cls(tuple(t.items()), max_tokens)

  def _messages(self, role: str, **fields) -> list[dict[str, str]]:
    template = dict(self.templates)[role]
    try:
      text = template.format(format=FORMAT, **fields)
    except (KeyError, IndexError) as e:
      raise ConfigError(f"the {role} prompt uses an unknown field {e}; use {{description}}, {{model}}, {{plan}}, "
                        "{feedback}, {format}") from None
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]

  def formulator(self, description: str):
    return self._messages("formulator", description=description)

  def structure_checker(self, description: str, model: str):
    return self._messages("structure_checker", description=description, model=model)

  def solution_interpreter(self, description: str, model: str, plan: str):
    return self._messages("solution_interpreter", description=description, model=model, plan=plan)

  def corrector(self, description: str, model: str, feedback: str):
    return self._messages("corrector", description=description, model=model, feedback=feedback)
