"""Focus-dilution experiment: full-batch GD on a one-layer attention-only Transformer, instrumented every chunk.

Launch: python -m jaxlab.main --config experiments/focus_dilution/config.py:tiny --workdir /tmp/focus_dilution
Expected (tiny, 2 CPU cores, about a minute per seed): W_E condenses to rank one while W_Q W_K^T is frozen, with
the leading singular pair of Phi = W_E W_P aligned with (pi, pi - 1/V); attention then grows and focuses on the
most frequent tokens (focus index > 1.3) and the focus dilutes while the loss keeps falling. See README for what
reproduced and what did not.

The run is `jaxlab.train.run_loop` over chunks (one loop step = `method.chunk` GD steps + instrumentation,
`method.steps // method.chunk` of them), so it is resumable at chunk granularity. The token set is sharded over
the "data" mesh axis (the loss is a mean over sequences, so the sharded gradient equals the single-device one);
parameters are replicated. When the loop ends (`summarise`), the stage detector reads the logged rows, a
standard-initialisation control (std = 1/sqrt(d)) is run for the same number of GD steps as the detected
condensation point, and summary.json is written once with both.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import configs, metrics
from jaxlab import mesh as mesh_lib
from jaxlab.dynamics import instrument
from jaxlab.errors import ConfigError
from jaxlab.nn import attention_only as ao
from jaxlab.train import run_loop

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains, detects the stages, runs the control; returns the summary (cond/*, cycle1/*, cycle2/*, control/*)."""
  configs.check_devices(config, jax.device_count())
  with mesh_lib.use_config(config) as mesh:
    data_axis = dict(mesh.shape).get("data", 1)
    if config.data.n_seq % data_axis:
      raise ConfigError(f"config.data.n_seq={config.data.n_seq} must be divisible by the data mesh axis "
                        f"({data_axis})")
    tokens_np, pi = method.load_tokens(config, config.seed)
    top = method.top_tokens(tokens_np, config.data.vocab, config.data.top_k)
    repl = NamedSharding(mesh, P())
    tokens = jax.device_put(jnp.asarray(tokens_np), NamedSharding(mesh, P("data")))
    std = ao.init_std(config.model.d, config.model.init_std, config.model.init_gamma)
    key = jax.random.key(config.seed)
    state = jax.jit(lambda k: method.init_state(config, k, std), out_shardings=repl)(key)
    shardings = jax.tree.map(lambda _: repl, state)
    chunk = jax.jit(method.make_chunk_step(config, top, pi), in_shardings=(shardings, tokens.sharding),
                    out_shardings=(shardings, repl), donate_argnums=0)

    def summarise(state, loop_summary):
      """The claim keys from the logged rows (stage detector) and the control; the loop's own keys dropped."""
      del state
      summary = method.summarise(metrics.read_metrics(workdir), config)
      summary.update(top_tokens=[int(t) for t in top], init_std=std, gd_steps=config.method.steps)
      if config.method.control and "cond/gd_steps" in summary:
        summary.update(control(config, tokens, top, summary["cond/gd_steps"]))
      summary.update(wall_s=loop_summary["wall_s"], resumes=loop_summary["resumes"])
      return summary

    _, summary = run_loop(config, workdir, state, shardings, chunk, lambda step: tokens,
                          num_steps=config_lib.num_chunks(config), summarise=summarise)
  return summary


def control(config, tokens, top, gd_steps: int) -> dict:
  """Standard initialisation (std = control_std or 1/sqrt(d)) trained for `gd_steps` GD steps; its W_E share."""
  std = config.method.control_std or 1.0 / math.sqrt(config.model.d)
  state = method.init_state(config, jax.random.fold_in(jax.random.key(config.seed), 1), std)
  c = config.copy_and_resolve_references()
  c.unlock()
  c.method.chunk = max(int(gd_steps), 1)
  state, m = jax.jit(method.make_chunk_step(c, top, None))(state, tokens)
  s = np.asarray(instrument.singular_values(state["params"]["W_E"]))
  return {"control/share_E": float(m["dyn/share_E"]), "control/qk_ratio": float(m["dyn/qk_ratio"]),
          "control/std": std, "control/rank_E": int(np.sum(s > config.method.rank_rel * s[0]))}


def plot(runs, workdirs, out_dir):
  """All logged dynamics against GD steps, one column per seed, with the detected stages shaded."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  panels = (("train/loss", "loss"), ("dyn/share_E", "top-1 share"), ("dyn/rank_E", "numerical rank"),
            ("dyn/qk_ratio", "||W_Q W_K^T|| / init"), ("dyn/focus", "focus index"), ("dyn/entropy", "attention entropy"))
  n = max(len(workdirs), 1)
  fig, axes = plt.subplots(len(panels), n, figsize=(4.2 * n, 2.0 * len(panels)), squeeze=False, sharex="col")
  for j, (run, wd) in enumerate(zip(runs, workdirs)):
    rows = metrics.read_metrics(wd)
    cfg = metrics.read_json(os.path.join(wd, "config.json")) if os.path.exists(os.path.join(wd, "config.json")) else {}
    k = cfg.get("method", {}).get("chunk", 1) if isinstance(cfg, dict) else 1
    x = np.array([r["step"] for r in rows]) * k
    st = run.get("stages", {})
    spans = []
    if st.get("condensation"):
      spans.append((0, st["condensation"]["step"] * k, "tab:blue", "S1 condense"))
    for ci, cy in enumerate(st.get("cycles", [])):
      spans.append((cy["focus"][0] * k, cy["peak_step"] * k, "tab:orange", f"S2 focus {ci + 1}"))
      spans.append((cy["peak_step"] * k, cy["trough_step"] * k, "tab:green", f"S3 dilute {ci + 1}"))
    if st.get("next_cycle"):
      spans.append((st["next_cycle"]["start"] * k, x[-1], "tab:purple", "S4 next cycle"))
    for i, (key, label) in enumerate(panels):
      ax = axes[i, j]
      y = [r.get(key, np.nan) for r in rows]
      ax.plot(x, y, color="k", lw=1.2, label="W_E" if key in ("dyn/share_E", "dyn/rank_E") else None)
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
  path = save(fig, out_dir, "focus_dilution_dynamics.png", dpi=100)
  return [path]
