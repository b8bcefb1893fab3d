"""Focus-dilution experiment: full-batch GD on one-layer attention-only Transformers, instrumented every chunk.

Launch: python -m jaxlab.main --config experiments/focus_dilution/config.py:tiny --workdir /tmp/focus_dilution
Expected (tiny, 2 shared CPU cores, about 2 minutes per seed): the W_V = I model condenses to rank one while
W_Q W_K^T is frozen, with the leading singular pair of Phi = W_E W_P aligned with (pi, pi - 1/V); the
standard-init control does not condense; the trained-W_V model condenses, focuses on the most frequent tokens,
dilutes while the loss keeps falling, opens new embedding directions and focuses again. See README.

The run is `jaxlab.train.run_stages`:
  s1       (method.s1_steps > 0) the W_V = I model (`jaxlab.train.run_loop` over chunks, in workdir/stages/s1/,
           resumable on its own) for method.s1_steps GD steps; its condensation point and the closed-form
           alignment there (s1/*: the S1 claims);
  control  (method.control; right after s1, or after cycles when s1_steps = 0) standard initialisation
           (std = 1/sqrt(d)) of the s1 model (of the main model when s1_steps = 0) on the same data for as many
           GD steps as that model's condensation point (control/*);
  train    the main model (`model.value_identity`; default False: W_V trained, the predecessor paper's model),
           run_loop over method.steps // method.chunk chunks in workdir/stages/train/;
  cycles   the stage detector and the per-chain cycle test on the train stage's logged rows (cond/*, cycle1/*,
           cycle2/*, cycle/*).
Each run_loop step is `method.chunk` GD steps + instrumentation. The token set is sharded over the "data" mesh
axis (the loss is a mean over sequences, so the sharded gradient equals the single-device one); parameters are
replicated. summary.json is written once, after the last stage.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import configs, metrics
from jaxlab.dynamics import instrument
from jaxlab.errors import ConfigError
from jaxlab.nn import attention_only as ao
from jaxlab.train import run_loop, run_stages

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method

# The stage names, in order (the sub-runs of s1 and train live in workdir/stages/<name>/).
S1, CONTROL, TRAIN, CYCLES = "s1", "control", "train", "cycles"


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary (s1/*, control/*, cond/*, cycle1/*, cycle2/*, cycle/*)."""
  configs.check_devices(config, jax.device_count())
  tokens_np, pi = method.load_tokens(config, config.seed)   # reads / generates the data before the workdir
  top = method.top_tokens(tokens_np, config.data.vocab, config.data.top_k)
  data = {"tokens": tokens_np, "pi": pi, "top": top}
  stages = {}
  if config.method.s1_steps > 0:
    stages[S1] = lambda ctx: s1_stage(ctx, data)
  stages[TRAIN] = lambda ctx: train_stage(ctx, data)
  stages[CYCLES] = cycles_stage
  if config.method.control:   # after the model whose condensation point it needs
    stages = _insert_after(stages, S1 if S1 in stages else CYCLES, CONTROL, lambda ctx: control_stage(ctx, data))
  return run_stages(config, workdir, stages, summarise=summarise,
                    extra_summary={"top_tokens": [int(t) for t in top], "gd_steps": config.method.steps})


def _insert_after(stages: dict, after: str, name: str, fn) -> dict:
  out = {}
  for k, v in stages.items():
    out[k] = v
    if k == after:
      out[name] = fn
  return out


def _sharded_tokens(ctx, tokens_np):
  data_axis = dict(ctx.mesh.shape).get("data", 1)
  if tokens_np.shape[0] % data_axis:
    raise ConfigError(f"config.data.n_seq={tokens_np.shape[0]} must be divisible by the data mesh axis "
                      f"({data_axis})")
  return jax.device_put(jnp.asarray(tokens_np), NamedSharding(ctx.mesh, P("data")))


def run_model(ctx, config, data) -> list[dict]:
  """run_loop of one model (`config`'s model / method) in ctx.subdir(); returns its logged metric rows."""
  repl = NamedSharding(ctx.mesh, P())
  tokens = _sharded_tokens(ctx, data["tokens"])
  top, pi = _put_aux(data, repl)
  std = ao.init_std(config.model.d, config.model.init_std, config.model.init_gamma)
  state = jax.device_put(method.init_state(config, jax.random.key(config.seed), std), repl)
  shardings = jax.tree.map(lambda _: repl, state)
  step = compiled_chunk(tuple(sorted(method.chunk_args(config).items())), repl)
  workdir = ctx.subdir()
  run_loop(config, workdir, state, shardings, lambda st, tok: step(st, tok, top, pi), lambda i: tokens,
           num_steps=config_lib.num_chunks(config))
  return metrics.read_metrics(workdir)


@functools.lru_cache(maxsize=16)
def compiled_chunk(args: tuple, out_sharding=None):
  """`method.make_chunk_step(**dict(args))` jitted (outputs on `out_sharding`, the state donated; or plain jit
  when None); cached, so the runs of one config in one process compile it once."""
  fn = method.make_chunk_step(**dict(args))
  if out_sharding is None:
    return jax.jit(fn)
  return jax.jit(fn, out_shardings=out_sharding, donate_argnums=0)


def _put_aux(data, repl):
  top = jax.device_put(jnp.asarray(data["top"], jnp.int32), repl)
  pi = None if data["pi"] is None else jax.device_put(jnp.asarray(data["pi"], jnp.float32), repl)
  return top, pi


def s1_stage(ctx, data) -> dict:
  """The W_V = I model for method.s1_steps GD steps: its condensation point and closed-form alignment (s1/*)."""
  c = method.s1_config(ctx.config)
  cond = method.condensation(run_model(ctx, c, data), c)
  return {f"s1/{k}": v for k, v in cond.items()}


def control_stage(ctx, data) -> dict:
  """Standard initialisation (std = control_std or 1/sqrt(d)) of the S1 model, trained for as many GD steps as
  its condensation point (that model's, from the s1 stage; the main model's own when there is none)."""
  config = ctx.config
  if S1 in ctx.results:
    c, gd_steps = method.s1_config(config), ctx.results[S1].get("s1/gd_steps")
  else:   # no s1 stage: the control follows the cycles stage
    c, gd_steps = config, ctx.results[CYCLES].get("cond/gd_steps")
  if gd_steps is None:   # the model never condensed: no step to compare at
    return {}
  return control(c, _sharded_tokens(ctx, data["tokens"]), data["top"], gd_steps)


def control(config, tokens, top, gd_steps: int) -> dict:
  """Standard initialisation trained for `gd_steps` GD steps in one chunk; its W_E share and rank."""
  std = config.method.control_std or 1.0 / math.sqrt(config.model.d)
  state = method.init_state(config, jax.random.fold_in(jax.random.key(config.seed), 1), std)
  args = {**method.chunk_args(config), "steps": max(int(gd_steps), 1)}   # one chunk of gd_steps GD steps
  state, m = compiled_chunk(tuple(sorted(args.items())))(state, tokens, jnp.asarray(top, jnp.int32), None)
  s = np.asarray(instrument.singular_values(state["params"]["W_E"]))
  return {"control/share_E": float(m["dyn/share_E"]), "control/qk_ratio": float(m["dyn/qk_ratio"]),
          "control/std": std, "control/gd_steps": int(gd_steps),
          "control/rank_E": int(np.sum(s > config.method.rank_rel * s[0]))}


def train_stage(ctx, data) -> dict:
  """The main model for method.steps GD steps (run_loop in workdir/stages/train/); its final metrics."""
  rows = run_model(ctx, ctx.config, data)
  return {"final/loss": rows[-1]["train/loss"], "final/focus": rows[-1]["dyn/focus"],
          "final/rank_E": rows[-1]["dyn/rank_E"], "max/focus": max(r["dyn/focus"] for r in rows),
          "init_std": ao.init_std(ctx.config.model.d, ctx.config.model.init_std, ctx.config.model.init_gamma)}


def cycles_stage(ctx) -> dict:
  """The stage detector and the per-chain cycle test on the train stage's rows (cond/*, cycle*/*)."""
  rows = metrics.read_metrics(os.path.join(ctx.workdir, "stages", TRAIN))
  return method.summarise(rows, ctx.config)


def summarise(results: dict) -> dict:
  """The union of the stages' results."""
  out = {}
  for r in results.values():
    out.update(r)
  return out


def plot(runs, workdirs, out_dir):
  """The main model's dynamics against GD steps (first three seeds, detected stages shaded) and every seed's
  focus index with the rank of W_E and the cycle verdict."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  panels = (("train/loss", "loss"), ("dyn/share_E", "top-1 share"), ("dyn/rank_E", "numerical rank"),
            ("dyn/qk_ratio", "||W_Q W_K^T|| / init"), ("dyn/focus", "focus index"), ("dyn/entropy", "attention entropy"))
  data = []
  for run, wd in zip(runs, workdirs):
    sub = os.path.join(wd, "stages", TRAIN)
    rows = metrics.read_metrics(sub) if os.path.exists(os.path.join(sub, "metrics.jsonl")) else []
    cfg = metrics.read_json(os.path.join(wd, "config.json")) if os.path.exists(os.path.join(wd, "config.json")) else {}
    k = cfg.get("method", {}).get("chunk", 1) if isinstance(cfg, dict) else 1
    data.append((run, wd, rows, np.array([r["step"] for r in rows]) * k, k))
  paths = []
  shown = data[:3]
  n = max(len(shown), 1)
  fig, axes = plt.subplots(len(panels), n, figsize=(4.2 * n, 2.0 * len(panels)), squeeze=False, sharex="col")
  for j, (run, wd, rows, x, k) in enumerate(shown):
    spans = _spans(run.get("detected", {}), k, x)
    for i, (key, label) in enumerate(panels):
      ax = axes[i, j]
      ax.plot(x, [r.get(key, np.nan) for r in rows], color="k", lw=1.2,
              label="W_E" if key in ("dyn/share_E", "dyn/rank_E") else None)
      if key in ("dyn/share_E", "dyn/rank_E"):
        ax.plot(x, [r.get(key.replace("_E", "_Phi"), np.nan) for r in rows], color="tab:red", lw=0.8, label="Phi")
        ax.legend(fontsize=6)
      if key == "dyn/qk_ratio":
        ax.set_yscale("log")
      for a, b, color, name in spans:
        ax.axvspan(a, b, color=color, alpha=0.15, label=name if (i == 0) else None)
      ax.set_ylabel(label, fontsize=8)
      if i == 0:
        ax.set_title(os.path.basename(os.path.normpath(wd)), fontsize=9)
        ax.legend(fontsize=6)
    axes[-1, j].set_xlabel("GD steps")
  paths.append(save(fig, out_dir, "focus_dilution_dynamics.png", dpi=100))
  cols = min(len(data), 4) or 1
  rws = max(1, math.ceil(len(data) / cols))
  fig, axes = plt.subplots(rws, cols, figsize=(3.4 * cols, 2.3 * rws), squeeze=False)
  for j, (run, wd, rows, x, k) in enumerate(data):
    ax = axes[j // cols, j % cols]
    ax.plot(x, [r.get("dyn/focus", np.nan) for r in rows], color="k", lw=1.0)
    ax.axhline(1.0, color="0.6", lw=0.5)
    for a, b, color, _ in _spans(run.get("detected", {}), k, x):
      ax.axvspan(a, b, color=color, alpha=0.15)
    ax2 = ax.twinx()
    ax2.plot(x, [r.get("dyn/rank_E", np.nan) for r in rows], color="tab:red", lw=0.7)
    ax2.tick_params(labelsize=6, colors="tab:red")
    ax.tick_params(labelsize=6)
    verdict = "cycle" if run.get("cycle/present") else "no cycle"
    ax.set_title(f"{os.path.basename(os.path.normpath(wd))}: {verdict}", fontsize=8)
  for j in range(len(data), rws * cols):
    axes[j // cols, j % cols].axis("off")
  fig.suptitle("focus index (black) and rank of W_E (red) against GD steps", fontsize=9)
  paths.append(save(fig, out_dir, "focus_dilution_cycles.png", dpi=100))
  return paths


def _spans(st: dict, k: int, x) -> list[tuple[float, float, str, str]]:
  """Shaded (start, end, colour, label) spans of the detected stages, in GD steps."""
  spans = []
  if st.get("condensation"):
    spans.append((0, st["condensation"]["step"] * k, "tab:blue", "S1 condense"))
  for ci, cy in enumerate(st.get("cycles", [])):
    spans.append((cy["focus"][0] * k, cy["peak_step"] * k, "tab:orange", f"S2 focus {ci + 1}"))
    spans.append((cy["peak_step"] * k, cy["trough_step"] * k, "tab:green", f"S3 dilute {ci + 1}"))
  if st.get("next_cycle") and len(x):
    spans.append((st["next_cycle"]["start"] * k, x[-1], "tab:purple", "S4 next cycle"))
  return spans
