"""Pure functions of the focus-dilution experiment: data, the GD/Adam chunk step with instrumentation, summary.

Paper: Chen, Lin, Xu, Luo, "Focus and Dilution: The Multi-stage Learning Process of Attention", ICML 2026
(arXiv 2605.01199). Implements next-token cross-entropy of `jaxlab.nn.attention_only` trained by full-batch GD
(eq. of the README) and the logged metrics of `jaxlab.dynamics.instrument`; reconstructed details are in README.

One "step" of `jaxlab.train.run_loop` is a chunk of `method.chunk` full-batch optimiser steps under `lax.scan`
(gradient descent with a small learning rate approximates the gradient flow the paper analyses), followed by the
instrumentation of `jaxlab.dynamics.instrument` on the full batch.
"""

from __future__ import annotations

import math

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
  return {"params": params, "opt": make_optimizer(config).init(params),
          "qk0": jnp.linalg.norm(params["W_Q"] @ params["W_K"].T)}


def make_optimizer(config) -> optax.GradientTransformation:
  """Plain gradient descent (the mechanistic run) or Adam (robustness variant)."""
  if config.method.optimizer == "adam":
    return optax.adam(config.method.lr)
  return optax.sgd(config.method.lr)


def dynamics_metrics(params: dict, tokens_bt: jax.Array, top: jax.Array, pi: jax.Array | None,
                     rank_rel: float) -> dict:
  """The logged quantities (float32 scalars): spectra shares/ranks, focus, entropy, alignment with the closed form."""
  out = {}
  for name, m in (("E", params["W_E"]), ("P", params["W_P"]), ("Phi", ao.effective_map(params))):
    s = instrument.singular_values(m)
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
    u, _, vt = jnp.linalg.svd(ao.effective_map(params))
    cos = lambda a, b: jnp.abs(a @ b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b))
    out["dyn/cos_u_pi"] = cos(u[:, 0], pi)
    out["dyn/cos_v_pi"] = cos(vt[0], pi - 1.0 / pi.shape[0])
  return out


def make_chunk_step(config, top: np.ndarray, pi: np.ndarray | None):
  """Returns `(state, tokens) -> (state, metrics)`: `method.chunk` optimiser steps then the instrumentation."""
  mask = ao.trainable_mask(config.model.value_identity)
  opt = make_optimizer(config)
  top_j = jnp.asarray(top)
  pi_j = None if pi is None else jnp.asarray(pi, jnp.float32)
  last_only = config.model.last_only

  def chunk(state, tokens):
    def body(carry, _):
      params, opt_state = carry
      loss, g = jax.value_and_grad(ao.next_token_loss)(params, tokens, last_only)
      g = {n: g[n] if mask[n] else jnp.zeros_like(g[n]) for n in g}
      upd, opt_state = opt.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(body, (state["params"], state["opt"]), None,
                                               length=config.method.chunk)
    m = dynamics_metrics(params, tokens, top_j, pi_j, config.method.rank_rel)
    m["train/loss"] = ao.next_token_loss(params, tokens, last_only)
    m["train/loss_chunk_start"] = losses[0]
    m["dyn/qk_ratio"] = m["dyn/qk_norm"] / state["qk0"]
    return {"params": params, "opt": opt_state, "qk0": state["qk0"]}, m

  return chunk


def summarise(rows: list[dict], config) -> dict:
  """Claim keys from the logged rows via the stage detector (`jaxlab.dynamics.stages.detect_stages`)."""
  mc = config.method
  st = stages.detect_stages(rows, frozen_ratio=mc.frozen_ratio, reversal=mc.reversal,
                            min_peak_excess=mc.min_peak_excess)
  out = {"final/loss": rows[-1]["train/loss"], "final/focus": rows[-1]["dyn/focus"],
         "final/rank_E": rows[-1]["dyn/rank_E"], "max/focus": max(r["dyn/focus"] for r in rows)}
  cond = st["condensation"]
  if cond is not None:
    r = rows[[i for i, rr in enumerate(rows) if rr["step"] == cond["step"]][0]]
    out.update({"cond/step": cond["step"], "cond/share_E": cond["share_E"], "cond/qk_ratio": cond["qk_ratio"],
                "cond/gd_steps": cond["step"] * mc.chunk, "cond/frozen_until": cond["range"][1]})
    for k in ("cos_u_pi", "cos_v_pi"):
      if f"dyn/{k}" in r:
        out[f"cond/{k}"] = r[f"dyn/{k}"]
  else:
    out.update({"cond/share_E": 0.0, "cond/qk_ratio": math.inf})
  cyc = st["cycles"]
  out["cycles"] = len(cyc)
  out["cycle1/peak"] = cyc[0]["focus_peak"] if cyc else 1.0
  out["cycle1/peak_step"] = cyc[0]["peak_step"] if cyc else -1
  out["cycle1/trough_step"] = cyc[0]["trough_step"] if cyc else -1
  out["cycle1/drop_frac"] = cyc[0]["drop_frac"] if cyc else 0.0
  out["cycle1/loss_decreasing"] = float(cyc[0]["loss_decreasing"]) if cyc else 0.0
  nxt = st["next_cycle"]
  out["cycle2/rank"] = nxt["rank"] if nxt else (cyc[0]["rank_after"] if cyc else 0)
  out["cycle2/peak"] = nxt["refocus"] if nxt else 1.0
  out["cycle2/peak_step"] = nxt["refocus_step"] if nxt else -1
  out["stages"] = st
  return out
