"""Chat templates: a Hugging Face tokenizer's `chat_template` (Jinja) rendered the way `transformers` does.

`transformers`' `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` renders the
template in a sandboxed Jinja environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter that does not HTML-escape (plain `json.dumps` with `ensure_ascii=False`), and
the globals `raise_exception(message)` and `strftime_now(format)`; the variables are `messages`,
`add_generation_prompt`, `tools`, `documents` and the tokenizer's special tokens by their config names
(`bos_token`, `eos_token`, ...). `ChatTemplate` reproduces that (tested against `transformers` when it is
installed), and `PLAIN_TEMPLATE` is the fallback for a tokenizer without a template: BOS, then
"role: content\\n" per message and "assistant: " to prompt a reply, the format `jaxlab.lm.sft_data.ChatFormat`
trains with by default.

Templates are read from a checkpoint folder as transformers saves them: `chat_template.jinja`, or the
`chat_template` key of `tokenizer_config.json` (a string, or a list of {"name", "template"} whose "default"
entry is used).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Mapping, Sequence

from jaxlab.errors import DataError, require

PLAIN_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                  "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


class TemplateError(DataError):
  """A chat template failed to parse or render (or raised on purpose, e.g. roles must alternate)."""


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
  raise TemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
  """A compiled chat template.

  Args:
    source: the Jinja template text (None: `PLAIN_TEMPLATE`).
    special_tokens: {"bos_token": "<s>", "eos_token": "</s>", ...} passed to the template as variables.
    where: where the template came from (for error messages).

  Raises:
    MissingDependencyError: `jinja2` is not installed (extra `jaxlab[llm]`).
    TemplateError: the template does not parse.
  """

  def __init__(self, source: str | None = None, special_tokens: Mapping[str, str | None] | None = None,
               where: str = "chat template"):
    jinja2 = require("jinja2", "llm")
    from jinja2 import sandbox  # pylint: disable=g-import-not-at-top
    self.source = PLAIN_TEMPLATE if source is None else source
    self.is_plain = source is None
    self.where = where
    self.special_tokens = {k: ("" if v is None else v) for k, v in (special_tokens or {}).items()}
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
      self._template = env.from_string(self.source)
    except jinja2.TemplateSyntaxError as e:
      raise TemplateError(f"{where}: the chat template does not parse (line {e.lineno}: {e.message})") from None

  def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
             tools: Sequence[Any] | None = None, **extra) -> str:
    """The prompt text of `messages` (with the assistant's turn opened when `add_generation_prompt`)."""
    jinja2 = require("jinja2", "llm")
    values = {**self.special_tokens, **extra, "messages": [dict(m) for m in messages],
              "add_generation_prompt": add_generation_prompt}
    if tools is not None:
      values["tools"] = list(tools)
    try:
      return self._template.render(**values)
    except TemplateError:
      raise
    except jinja2.TemplateError as e:
      raise TemplateError(f"{self.where}: rendering failed: {e}") from None

  def __repr__(self) -> str:
    return f"ChatTemplate({'plain' if self.is_plain else self.where})"


def read_template(folder: str) -> str | None:
  """The chat template saved in a checkpoint folder (see the module docstring), or None when there is none."""
  file = os.path.join(folder, "chat_template.jinja")
  if os.path.isfile(file):
    with open(file, encoding="utf-8") as f:
      return f.read()
  cfg_file = os.path.join(folder, "tokenizer_config.json")
  if not os.path.isfile(cfg_file):
    return None
  with open(cfg_file, encoding="utf-8") as f:
    try:
      cfg = json.load(f)
    except json.JSONDecodeError as e:
      raise DataError(f"{cfg_file}: not valid JSON ({e})") from None
  t = cfg.get("chat_template") if isinstance(cfg, dict) else None
  if isinstance(t, list):
    named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
    t = named.get("default")
    if t is None:
      raise DataError(f"{cfg_file}: chat_template is a list without a 'default' entry (names: {sorted(named)})")
  if t is not None and not isinstance(t, str):
    raise DataError(f"{cfg_file}: chat_template must be a string, got {type(t).__name__}")
  return t


def special_tokens_of(tokenizer) -> dict[str, str | None]:
  """{"bos_token", "eos_token", "pad_token"} strings of a jaxlab tokenizer (None where it has no such token)."""
  names = {}
  for role in ("bos", "eos", "pad"):
    i = getattr(tokenizer, f"{role}_id", None)
    names[f"{role}_token"] = None if i is None else tokenizer.decode([i])
  return names
