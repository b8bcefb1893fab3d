"""Pure functions of the focus-dilution experiment: data, the GD/Adam chunk step with instrumentation, summary.

Paper: Chen, Lin, Xu, Luo, "Focus and Dilution: The Multi-stage Learning Process of Attention", ICML 2026
(arXiv 2605.01199). Implements next-token cross-entropy of `jaxlab.nn.attention_only` trained by full-batch GD
(eq. of the README) and the logged metrics of `jaxlab.dynamics.instrument`; reconstructed details are in README.

One "step" of `jaxlab.train.run_loop` is a chunk of `method.chunk` full-batch optimiser steps under `lax.scan`
(gradient descent with a small learning rate approximates the gradient flow the paper analyses), followed by the
instrumentation of `jaxlab.dynamics.instrument` on the full batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.dynamics import instrument, markov, stages, text
from jaxlab.nn import attention_only as ao


def load_tokens(config, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
  """The fixed training set and, for Markov data, the chain's stationary distribution.

  Returns:
    ((n_seq, length) int32 tokens, (V,) float64 pi or None for text).
  """
  dc = config.data
  if dc.source == "markov":
    p = markov.make_chain(dc.vocab, dc.alpha, dc.zipf_s, dc.concentration, seed=seed)
    return markov.sample(p, dc.n_seq, dc.length, seed=seed + 7919), markov.stationary(p)
  if dc.source == "pydoc":
    raw = text.pydoc_text()
  elif dc.source == "file":
    raw = text.read_text(dc.path)
  else:  # wikitext through tfds (user side; needs the prepared dataset)
    from jaxlab.data import tfds as tfds_lib  # pylint: disable=g-import-not-at-top
    src = tfds_lib.TfdsSource(dc.tfds_name, "train", keys=("text",))
    rows = src[np.arange(min(len(src), dc.max_docs))]["text"]
    raw = "\n".join(t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in rows)
  ids, _ = text.encode(text.tokenize(raw, dc.level), dc.vocab)
  return text.windows(ids, dc.n_seq, dc.length, seed=seed), None


def top_tokens(tokens: np.ndarray, vocab: int, k: int) -> np.ndarray:
  """The k most frequent token ids of the training set (ties by id), (k,) int32."""
  counts = np.bincount(np.asarray(tokens).ravel(), minlength=vocab)
  return np.argsort(-counts, kind="stable")[:k].astype(np.int32)


def init_state(config, key, std: float) -> dict:
  """{"params", "opt", "qk0"}: parameters at init scale `std`, optimiser state, ||W_Q W_K^T||_F at init."""
  mc = config.model
  params = ao.init_params(key, config.data.vocab, mc.d, std, mc.value_identity)
  return {"params": params, "opt": make_optimizer(config.method.optimizer, config.method.lr).init(params),
          "qk0": jnp.linalg.norm(params["W_Q"] @ params["W_K"].T)}


def make_optimizer(optimizer: str, lr: float) -> optax.GradientTransformation:
  """Plain gradient descent ("gd": the mechanistic run) or Adam ("adam": robustness variant)."""
  if optimizer == "adam":
    return optax.adam(lr)
  return optax.sgd(lr)


def dynamics_metrics(params: dict, tokens_bt: jax.Array, top: jax.Array, pi: jax.Array | None,
                     rank_rel: float) -> dict:
  """The logged quantities (float32 scalars): spectra shares/ranks, focus, entropy, alignment with the closed form."""
  out = {}
  e_v = params["W_E"] @ params["W_V"]   # Phi = (W_E W_V) W_P, decomposed from its factors (rank <= d)
  for name, f in (("E", (params["W_E"],)), ("P", (params["W_P"],)), ("Phi", (e_v, params["W_P"]))):
    s = instrument.singular_values(*f)
    out[f"dyn/share_{name}"] = instrument.top_share(s)
    out[f"dyn/rank_{name}"] = instrument.numerical_rank(s, rank_rel)
    if name == "E":
      for i in range(3):
        out[f"dyn/sv_E{i + 1}"] = s[i]
  _, attn = ao.forward(params, tokens_bt[:, :-1])
  out["dyn/focus"] = instrument.focus_index(attn, tokens_bt[:, :-1], top)
  out["dyn/entropy"] = instrument.attention_entropy(attn)
  out["dyn/qk_norm"] = jnp.linalg.norm(params["W_Q"] @ params["W_K"].T)
  if pi is not None:
    u, _, vt = instrument.product_svd(e_v, params["W_P"])
    cos = lambda a, b: jnp.abs(a @ b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b))
    out["dyn/cos_u_pi"] = cos(u[:, 0], pi)
    out["dyn/cos_v_pi"] = cos(vt[0], pi - 1.0 / pi.shape[0])
  return out


def chunk_args(config) -> dict:
  """The keyword arguments of `make_chunk_step` from a config (hashable values)."""
  m = config.method
  return dict(optimizer=m.optimizer, lr=float(m.lr), steps=int(m.chunk), rank_rel=float(m.rank_rel),
              value_identity=bool(config.model.value_identity), last_only=bool(config.model.last_only))


def make_chunk_step(*, optimizer: str, lr: float, steps: int, rank_rel: float, value_identity: bool,
                    last_only: bool):
  """Returns `(state, tokens, top, pi) -> (state, metrics)`: `steps` optimiser steps, then the logged metrics.

  Args (see `chunk_args`): optimizer "gd" | "adam" and its lr; steps: GD steps per call (method.chunk);
    rank_rel: numerical-rank threshold; value_identity: W_V = I (not trained); last_only: last-position loss.

  The returned function takes `tokens` (B, T) int32 (the full batch), `top` (k,) int32 (the high-frequency
  token ids) and `pi` (V,) float32 (the chain's stationary distribution) or None (text).
  """
  mask = ao.trainable_mask(value_identity)
  opt = make_optimizer(optimizer, lr)

  def chunk(state, tokens, top, pi):
    def body(carry, _):
      params, opt_state = carry
      loss, g = jax.value_and_grad(ao.next_token_loss)(params, tokens, last_only)
      g = {n: g[n] if mask[n] else jnp.zeros_like(g[n]) for n in g}
      upd, opt_state = opt.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(body, (state["params"], state["opt"]), None, length=steps)
    m = dynamics_metrics(params, tokens, top, pi, rank_rel)
    m["train/loss"] = ao.next_token_loss(params, tokens, last_only)
    m["train/loss_chunk_start"] = losses[0]
    m["dyn/qk_ratio"] = m["dyn/qk_norm"] / state["qk0"]
    return {"params": params, "opt": opt_state, "qk0": state["qk0"]}, m

  return chunk


def s1_config(config):
  """The config of the S1 companion run: the same data and init with W_V = I, for method.s1_steps GD steps."""
  c = config.copy_and_resolve_references()
  c.unlock()
  c.model.value_identity = True
  c.method.steps = c.method.s1_steps
  c.lock()
  return c


def condensation(rows: list[dict], config) -> dict:
  """The condensation point of a run's logged rows (`jaxlab.dynamics.stages.detect_stages`) and the metrics there.

  Returns:
    {"step" (logged chunk), "gd_steps", "frozen_until", "share_E", "qk_ratio", "rank_E", "cos_u_pi",
     "cos_v_pi" (Markov data)}; {"share_E": 0.0} when attention was never frozen.
  """
  mc = config.method
  cond = stages.detect_stages(rows, frozen_ratio=mc.frozen_ratio, reversal=mc.reversal,
                              min_peak_excess=mc.min_peak_excess)["condensation"]
  if cond is None:
    return {"share_E": 0.0}
  r = rows[[i for i, rr in enumerate(rows) if rr["step"] == cond["step"]][0]]
  out = {"step": cond["step"], "gd_steps": cond["step"] * mc.chunk, "frozen_until": cond["range"][1],
         "share_E": cond["share_E"], "qk_ratio": cond["qk_ratio"], "rank_E": int(r["dyn/rank_E"])}
  for k in ("cos_u_pi", "cos_v_pi"):
    if f"dyn/{k}" in r:
      out[k] = r[f"dyn/{k}"]
  return out


def summarise(rows: list[dict], config) -> dict:
  """Claim keys of the main model from its logged rows: its condensation point (cond/*), the per-chain cycle
  test (`jaxlab.dynamics.stages.cycle_check`: cycle/*), the first cycle's peak and trough (cycle1/*), the second
  focus (cycle2/*), and the detected stages (`detected`, for the plots)."""
  mc = config.method
  kw = dict(frozen_ratio=mc.frozen_ratio, reversal=mc.reversal, min_peak_excess=mc.min_peak_excess)
  out = {f"cond/{k}": v for k, v in condensation(rows, config).items()}
  chk = stages.cycle_check(rows, min_share=mc.min_share, min_drop=mc.min_drop, **kw)
  for k in ("present", "s1", "first_peak", "diluted", "loss_down", "rank_rises", "second_peak", "first"):
    out[f"cycle/{k}"] = chk[k]
  for k in ("rank_cond", "rank_peak", "rank_trough", "rank_second"):
    out[f"cycle/{k}"] = chk[k]
  out.update({"cycle1/peak": chk["peak"], "cycle1/peak_step": chk["peak_step"], "cycle1/trough": chk["trough"],
              "cycle1/trough_step": chk["trough_step"], "cycle1/drop_frac": chk["drop_frac"],
              "cycle2/peak": chk["second"], "cycle2/peak_step": chk["second_step"]})
  out["detected"] = stages.detect_stages(rows, **kw)
  return out
