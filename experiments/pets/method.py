"""PETS experiment glue: pools (simulated or from a PETS JSONL file), the allocator from the config, scoring.

The algorithms live in the library (`jaxlab.tts`): votes and the self-consistency rate
(`self_consistency`), the offline OKG allocator (`allocation`), the online bucket policy (`online`), the
simulator and the JSONL format (`simulate`, `pools`). Here:

* pseudo-labels: the pool majority y_q = MV(pool) (or the file's `final`), the paper's "infinite-budget"
  majority; SC rate = mean_q [prediction_q == y_q]. One tie rule (`config.method.tie_break`, default "min":
  the smallest option, as the official online code labels and votes) serves the labels and every vote
  (uniform, OKG, online), so a method that holds a question's whole pool always votes its label;
* uniform allocation at budget B = each question's first B pool answers (the official baseline);
* OKG draws a question's unused answers in a random order (its pool shuffled once by the seed);
* online: calibrate on the first online.train_size questions, apply the plan to the others in order
  (prefix answers, as the official evaluation does);
* budget savings (`budget_savings`, `saving_table`): on the budget sweeps, the first budget at which a method
  reaches perfect self-consistency, its realised spend there, and 1 - spend / (uniform's first budget at
  SC = 1), the statistic behind the paper's "up to 75% (offline) / 55% (online) less budget".
"""

from __future__ import annotations

import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.tts import allocation, online, pools, self_consistency as sc, simulate

from . import config as config_lib


def load_pools(config, key) -> dict:
  """Pools as host arrays: answers (K, N) int32 (-1 padding), lengths, conf, labels, gold, num_options, ...

  Simulated pools' gold answer is the population majority argmax theta_q (so `acc/*` measures agreement with
  the true infinite-budget majority, not only with the 64-answer proxy).
  """
  d = config.data
  tie = config.method.tie_break
  if config.variant == "full" and not d.pool_file:
    raise ConfigError("the full variant reads answer pools: pass --config.data.pool_file=POOLS.jsonl (official PETS "
                      "JSONL, e.g. gpqa_conf_qwen3_64.jsonl, or the output of python -m jaxlab.tts.sample_pools)")
  if not d.pool_file:
    sim = simulate.dirichlet_mixture_pools(d.num_questions, d.num_options, d.pool_size, easy_prob=d.easy_prob,
                                           easy_alpha=d.easy_alpha, hard_alpha=d.hard_alpha, seed=config.seed)
    answers = sim["answers"]
    k, n = answers.shape
    out = dict(answers=answers, lengths=np.full((k,), n, np.int32), conf=np.ones((k, n), np.float32),
               gold=sim["majority"], num_options=d.num_options, skipped_answers=0, final=None)
  else:
    choices = [s.strip() for s in d.choices.split(",") if s.strip()]
    p = pools.read_pools(d.pool_file, choices=choices or None, max_options=d.max_options, conf_metric=d.conf_metric,
                         tie_break=tie)
    answers, conf, lengths = p.answers, p.confidences, p.lengths
    if d.shuffle:
      answers, conf = allocation.shuffle_rows(key, answers, lengths, conf)
    if d.pool_size:
      answers, conf = answers[:, :d.pool_size], conf[:, :d.pool_size]
      lengths = np.minimum(lengths, d.pool_size).astype(np.int32)
    keep_final = not d.relabel_mv
    out = dict(answers=np.ascontiguousarray(answers), lengths=lengths, conf=np.ascontiguousarray(conf),
               gold=p.gold, num_options=p.num_options, skipped_answers=p.skipped_answers,
               final=p.labels if keep_final else None)
    if (lengths == 0).all():
      raise DataError(f"{d.pool_file}: no question has a usable answer (check data.choices={d.choices!r})")
    check_pool_sizes(config, lengths, p.ids)
  weights = out["conf"] if config.method.weighted else None
  labels = np.asarray(sc.vote(out["answers"], out["num_options"], weights_kn=weights, tie_break=tie))
  if out["final"] is not None and not config.method.weighted:
    labels = np.where(out["final"] >= 0, out["final"], labels).astype(np.int32)
  out["labels"] = labels
  return out


def check_pool_sizes(config, lengths, ids) -> None:
  """Every pool must hold the largest budget the config asks for (else the high budgets silently reuse a
  truncated pool and their rates mean nothing).

  Raises:
    DataError: one line naming the pool file, its smallest pool, the budget key and the fixes.
  """
  need, key = config_lib.largest_budget(config)
  smallest = int(np.min(lengths))
  if smallest < need:
    q = ids[int(np.argmin(lengths))]
    d = config.data
    cut = f" (data.pool_size={d.pool_size} keeps the first {d.pool_size})" if d.pool_size == smallest else ""
    raise DataError(f"{d.pool_file}: the smallest pool (question {q!r}) holds {smallest} usable answers{cut} but "
                    f"config.{key} asks for {need} per question; lower config.{key} to <= {smallest} "
                    "(and the other budgets with it) or use pools with more answers")
  o = config.online
  usable = int(np.sum(lengths >= o.k0))
  if o.enabled and usable <= o.train_size:   # checked here, before the offline stages run and write the workdir
    fix = (f"--config.online.train_size={usable // 2} (half of them calibrate, half test)" if usable >= 2 else
           f"pools with at least online.k0={o.k0} answers")
    raise DataError(f"{config.data.pool_file}: {usable} questions have >= online.k0={o.k0} answers, but the online "
                    f"stage calibrates on online.train_size={o.train_size} of them and needs more to test on; set "
                    f"{fix}, or --config.online.enabled=false to run the offline stages only")


def pad_questions(data: dict, multiple: int) -> dict:
  """Pads the question axis to a multiple of the data-axis size with empty questions (length 0, label -1)."""
  k = data["answers"].shape[0]
  kp = -(-k // multiple) * multiple
  pad = kp - k

  def grow(x, value):
    return np.concatenate([x, np.full((pad,) + x.shape[1:], value, x.dtype)]) if pad else x

  return dict(answers=grow(data["answers"], -1), lengths=grow(data["lengths"], 0), conf=grow(data["conf"], 1.0),
              labels=grow(data["labels"], -1), gold=grow(data["gold"], -1))


def draw_order(padded: dict, key) -> dict:
  """OKG's random draw order: every pool shuffled once (row q by fold_in(key, q))."""
  answers, conf = allocation.shuffle_rows(key, padded["answers"], padded["lengths"], padded["conf"])
  return dict(answers=answers.astype(np.int32), conf=conf.astype(np.float32), lengths=padded["lengths"])


def allocator(config, num_options: int) -> allocation.OKGAllocator:
  m = config.method
  return allocation.OKGAllocator(num_options=int(num_options), nsamples=m.nsamples, c=m.c, batch_size=m.batch_size,
                                 warm_up=m.warm_up, weighted=m.weighted, conf_scale=m.conf_scale,
                                 tie_break=m.tie_break, coupled=m.coupled)


def uniform_predictions(config, answers, conf, budget: int, num_options: int):
  return allocation.uniform_vote(answers, num_options, budget, conf_kn=conf, tie_break=config.method.tie_break)


def rate(pred, labels, mask) -> float:
  """SC rate (or accuracy) as an exact fraction hits / questions in float64 (see `sc.sc_rate`)."""
  pred, labels, mask = (np.asarray(x) for x in (pred, labels, mask))
  use = mask & (labels != -1)
  return float(np.sum((pred == labels) & use) / max(int(use.sum()), 1))


def online_metrics(config, data: dict) -> dict:
  """Calibrates the bucket model on the first train_size questions and sweeps the average budget on the rest."""
  o = config.online
  m = data["num_options"]
  tie = config.method.tie_break
  ans, lengths, labels, gold = data["answers"], data["lengths"], data["labels"], data["gold"]
  conf = data["conf"] if config.method.weighted else None
  usable = lengths >= o.k0
  if usable.sum() <= o.train_size:   # simulated pools (a pool file is checked in `check_pool_sizes`)
    raise DataError(f"online: {int(usable.sum())} questions have >= online.k0={o.k0} answers; need more than "
                    f"online.train_size={o.train_size}: lower --config.online.train_size")
  idx = np.flatnonzero(usable)
  tr, te = idx[:o.train_size], idx[o.train_size:]
  model = online.calibrate(ans[tr], lengths[tr], labels[tr], m, k0=o.k0, k_min=o.k_min_curve, k_max=o.k_max_curve,
                           curve_k_max=o.max_per_question, draws=o.subsample_draws, seed=config.seed,
                           probit_eps=o.probit_eps)
  out = {"online/test_questions": len(te)}
  for t, pi in enumerate(model.pi_t):
    out[f"online/pi/t{t}"] = float(pi)
  a_test, c_test = ans[te], None if conf is None else conf[te]

  def score(budget_q):
    pred = np.asarray(sc.vote(a_test, m, weights_kn=c_test, budget_k=budget_q, tie_break=tie))
    res = {"sc": float(np.mean(pred == labels[te]))}
    known = gold[te] != -1
    if known.any():
      res["acc"] = float(np.mean(pred[known] == gold[te][known]))
    return res

  for bbar in o.budgets:
    plan = online.greedy_bucket_plan(model, bbar, b_max=o.max_per_question, k0=o.k0, kind=o.curve)
    free, _ = online.streaming_policy(a_test, lengths[te], plan, m, k0=o.k0)
    guarded, _ = online.streaming_policy(a_test, lengths[te], plan, m, k0=o.k0, avg_budget=bbar)
    used = guarded if o.budget_guard else free
    uni = np.minimum(lengths[te], bbar)
    for kind, budget_q in (("online", used), ("online_unguarded", free), ("uniform_test", uni)):
      for metric, v in score(budget_q).items():
        out[f"{'sc_rate' if metric == 'sc' else 'acc'}/{kind}/B{bbar}"] = v
    out[f"budget/online_spent/B{bbar}"] = float(np.mean(used))
    out[f"budget/online_unguarded_spent/B{bbar}"] = float(np.mean(free))
    out[f"budget/online_planned/B{bbar}"] = float(np.dot(model.pi_t, plan))
    for t, bt in enumerate(plan):
      out[f"online/plan/B{bbar}/t{t}"] = int(bt)
  return out


def _curve(summary: dict, key: str, budgets) -> dict:
  """{budget: summary[f"{key}/B{budget}"]} over the budgets the summary has."""
  return {b: summary[f"{key}/B{b}"] for b in budgets if f"{key}/B{b}" in summary}


def budget_savings(summary: dict, method_kind: str, base_kind: str, budgets, spend_key: str) -> dict:
  """The budget saving of `method_kind` over `base_kind` on the sweep `budgets` (see `sc.budget_saving`).

  At perfect self-consistency: `budget_at_sc1/{base}` and `budget_at_sc1/{method}` (first budgets with
  SC = 1), `spend_at_sc1/{method}` (the method's realised answers per question there, `spend_key`),
  `saving_sc1/{method}` = 1 - spend / budget_at_sc1/{base} and `nominal_saving_sc1/{method}` (its nominal
  budget instead of the spend). At the baseline's SC at budget 32 (when the sweep has it), the same with level
  = SC(base @ 32): `budget_at_uniform32/{base}`, `budget_at_uniform32/{method}`, `spend_at_uniform32/{method}`,
  `saving_at_uniform32/{method}`. None where a curve never reaches the level.
  """
  base = _curve(summary, f"sc_rate/{base_kind}", budgets)
  meth = _curve(summary, f"sc_rate/{method_kind}", budgets)
  spend = _curve(summary, spend_key, budgets)
  if not base or not meth:
    return {}
  at1 = sc.budget_saving(meth, spend, base, 1.0)
  out = {f"budget_at_sc1/{base_kind}": at1["base_budget"], f"budget_at_sc1/{method_kind}": at1["method_budget"],
         f"spend_at_sc1/{method_kind}": at1["method_spend"], f"saving_sc1/{method_kind}": at1["saving"],
         f"nominal_saving_sc1/{method_kind}": at1["nominal_saving"]}
  if 32 in base:
    at32 = sc.budget_saving(meth, spend, base, base[32])
    out.update({f"budget_at_uniform32/{base_kind}": at32["base_budget"],
                f"budget_at_uniform32/{method_kind}": at32["method_budget"],
                f"spend_at_uniform32/{method_kind}": at32["method_spend"],
                f"saving_at_uniform32/{method_kind}": at32["saving"]})
  return out


def saving_stats(values) -> dict:
  """{"n", "mean", "lb95"} of per-seed savings (lb95: one-sided 95% t lower bound; None with < 2 values)."""
  v = np.asarray([x for x in values if x is not None], np.float64)
  if not len(v):
    return {"n": 0, "mean": None, "lb95": None}
  return {"n": len(v), "mean": float(v.mean()), "lb95": config_lib.t_lower_bound(v) if len(v) > 1 else None}


def saving_table(runs, labels) -> str:
  """The budget-saving table over runs (seeds / multi-runs) as markdown, with the mean and its 95% lower bound.

  Offline columns: uniform's and OKG's first budget at SC = 1 and OKG's saving; online columns (test split):
  uniform's first budget at SC = 1, PETS online's first average budget at SC = 1 with its realised spend, the
  saving, and the saving at uniform@32's SC. "-" where a run lacks the curve or never reaches the level.
  """
  def fmt(x, digits=3):
    if x is None:
      return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)

  cols = (("uniform B@SC=1", "budget_at_sc1/uniform", 0), ("OKG B@SC=1", "budget_at_sc1/offline", 0),
          ("OKG saving", "saving_sc1/offline", 3), ("uniform (test) B@SC=1", "budget_at_sc1/uniform_test", 0),
          ("online B@SC=1", "budget_at_sc1/online", 0), ("online spend", "spend_at_sc1/online", 2),
          ("online saving", "saving_sc1/online", 3), ("online saving at uniform@32's SC",
                                                        "saving_at_uniform32/online", 3))
  lines = ["| run | " + " | ".join(c[0] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
  for label, r in zip(labels, runs):
    lines.append(f"| {label} | " + " | ".join(fmt(r.get(k), d) for _, k, d in cols) + " |")
  for stat in ("mean", "lb95"):
    cells = []
    for _, k, d in cols:
      if not k.startswith("saving"):
        cells.append("")
        continue
      st = saving_stats([r.get(k) for r in runs])
      cells.append(fmt(st[stat], d) + (f" ({st['n']}/{len(runs)} runs)" if 0 < st["n"] < len(runs) else ""))
    name = "mean" if stat == "mean" else "one-sided 95% t lower bound"
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
