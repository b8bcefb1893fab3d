"""GRPO: group-relative policy optimisation with a clipped ratio and a KL penalty (Tunix semantics).

For completion tokens t of sequence i (mask m_it = 1), with current log-probs l_it, rollout-time ("old")
log-probs o_it and reference log-probs q_it:

    ratio_it = exp(clip(l_it - o_it, -20, 20))
    pg_it    = max(-A_i ratio_it, -A_i clip(ratio_it, 1 - epsilon, 1 + epsilon_high))
               (dual clip, epsilon_c > 1: for A_i < 0, pg_it = min(pg_it, -A_i epsilon_c))
    kl_it    = l - q                      ("kl",  k1: unbiased, high variance)
               1/2 (l - q)^2              ("mse_kl", k2)
               exp(q - l) - (q - l) - 1   ("low_var_kl", k3: unbiased for KL(pi || ref), >= 0)
    loss     = agg(pg) + beta * agg(kl)

with `agg` the `loss_agg_mode` over the masked (B, T) values:

    token-mean                    sum(x m) / sum(m)                                    (TRL bnpo / dapo)
    sequence-mean-token-mean      mean over rows with tokens of sum_t(x m) / sum_t(m)  (TRL grpo; default)
    sequence-mean-token-scale     mean over rows with tokens of sum_t(x m) / T          (TRL dr_grpo)
    seq-mean-token-sum            mean over rows with tokens of sum_t(x m)
    sequence-mean-token-sum-norm  sum(x m) / (number of rows with tokens)

When `num_iterations == 1` the old log-probs are `stop_gradient(l)` (ratio 1, as in Tunix); with several
iterations per rollout batch they are computed once, before the first update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxlab import mesh as mesh_lib
from jaxlab.lm.sft import token_stats
from jaxlab.posttrain.advantages import ESTIMATORS
from jaxlab.train import accumulate

AGG_MODES = ("token-mean", "sequence-mean-token-mean", "sequence-mean-token-scale", "seq-mean-token-sum",
             "sequence-mean-token-sum-norm")
AGG_ALIASES = {"grpo": "sequence-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
               "dr_grpo": "sequence-mean-token-scale"}
KL_MODES = ("kl", "mse_kl", "low_var_kl")
KL_ALIASES = {"k1": "kl", "k2": "mse_kl", "k3": "low_var_kl"}


# Batch keys that are extra model inputs, passed to the model by name (a VLM's per-row images, `jaxlab.lm.vlm`).
MODEL_INPUT_KEYS = ("images",)


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
  """The extra model inputs of a batch (`MODEL_INPUT_KEYS` it holds), as keyword arguments of the model."""
  return {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """GRPO hyperparameters (Tunix `GRPOConfig` names).

  Attributes:
    num_generations: G completions per prompt (> 1).
    num_iterations: mu, gradient updates per rollout batch.
    beta: KL coefficient (0 skips the reference model).
    epsilon: lower clip range (ratio >= 1 - epsilon).
    epsilon_high: upper clip range (default: epsilon).
    epsilon_c: dual-clip constant (> 1) bounding the loss of negative-advantage tokens; None = off.
    kl_loss_mode: "kl" | "mse_kl" | "low_var_kl" (aliases k1 | k2 | k3).
    kl_clamp: symmetric clamp of the per-token KL; None = off.
    loss_agg_mode: one of AGG_MODES or a TRL alias (grpo, bnpo, dapo, dr_grpo).
    advantage_estimator: "grpo" | "rloo" | "drgrpo".
    per_reward_normalize: normalise each reward component separately (GDPO-style).
    micro_batches: take each update's rows (and each log-prob pass's) in this many micro-batches: the same
      gradient (`jaxlab.train.accumulate`), about 1/micro_batches of the activations.
  """
  num_generations: int = 2
  num_iterations: int = 1
  beta: float = 0.04
  epsilon: float = 0.2
  epsilon_high: float | None = None
  epsilon_c: float | None = None
  kl_loss_mode: str = "kl"
  kl_clamp: float | None = None
  loss_agg_mode: str = "sequence-mean-token-mean"
  advantage_estimator: str = "grpo"
  per_reward_normalize: bool = False
  micro_batches: int = 1

  def __post_init__(self):
    if self.num_generations < 2:
      raise ValueError(f"GRPOConfig.num_generations must be > 1 (group baseline), got {self.num_generations}")
    if self.num_iterations < 1:
      raise ValueError(f"GRPOConfig.num_iterations must be >= 1, got {self.num_iterations}")
    if self.micro_batches < 1:
      raise ValueError(f"GRPOConfig.micro_batches must be >= 1, got {self.micro_batches}")
    if self.beta < 0:
      raise ValueError(f"GRPOConfig.beta must be >= 0, got {self.beta}")
    if not 0 < self.epsilon < 1 or (self.epsilon_high is not None and self.epsilon_high <= 0):
      raise ValueError(f"GRPOConfig.epsilon must be in (0, 1) and epsilon_high > 0, got {self.epsilon}, "
                       f"{self.epsilon_high}")
    if self.epsilon_c is not None and self.epsilon_c <= 1:
      raise ValueError(f"GRPOConfig.epsilon_c (dual clip) must be > 1, got {self.epsilon_c}")
    mode = KL_ALIASES.get(self.kl_loss_mode, self.kl_loss_mode)
    if mode not in KL_MODES:
      raise ValueError(f"GRPOConfig.kl_loss_mode={self.kl_loss_mode!r}: use one of {KL_MODES} or k1/k2/k3")
    agg = AGG_ALIASES.get(self.loss_agg_mode, self.loss_agg_mode)
    if agg not in AGG_MODES:
      raise ValueError(f"GRPOConfig.loss_agg_mode={self.loss_agg_mode!r}: use one of {AGG_MODES} or a TRL alias "
                       f"{tuple(AGG_ALIASES)}")
    if self.advantage_estimator not in ESTIMATORS:
      raise ValueError(f"GRPOConfig.advantage_estimator={self.advantage_estimator!r}: use one of {ESTIMATORS}")
    object.__setattr__(self, "kl_loss_mode", mode)
    object.__setattr__(self, "loss_agg_mode", agg)

  @property
  def eps_high(self) -> float:
    return self.epsilon if self.epsilon_high is None else self.epsilon_high

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "GRPOConfig":
    """From an experiment's `config.grpo` section: the fields above by name (0 / None for epsilon_high,
    epsilon_c and kl_clamp mean off); other keys of the section (temperature, reward weights, ...) are ignored."""
    names = [f.name for f in dataclasses.fields(cls)]
    kw = {k: section[k] for k in names if k in section}
    for k in ("epsilon_high", "epsilon_c", "kl_clamp"):
      if k in kw:
        kw[k] = kw[k] or None
    return cls(**kw)


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, mode: str = "kl", clamp: float | None = None) -> jax.Array:
  """Per-token KL estimate between the policy and the reference (see the module docstring)."""
  mode = KL_ALIASES.get(mode, mode)
  logp, ref_logp = logp.astype(jnp.float32), ref_logp.astype(jnp.float32)
  if mode == "kl":
    kl = logp - ref_logp
  elif mode == "mse_kl":
    kl = 0.5 * jnp.square(logp - ref_logp)
  elif mode == "low_var_kl":
    d = ref_logp - logp
    kl = jnp.exp(d) - d - 1.0
  else:
    raise ValueError(f"kl mode {mode!r}: use one of {KL_MODES}")
  return kl if clamp is None else jnp.clip(kl, -clamp, clamp)


def aggregate(x_bt: jax.Array, mask_bt: jax.Array, mode: str = "sequence-mean-token-mean") -> jax.Array:
  """Masked (B, T) values -> scalar by `loss_agg_mode` (masked entries are selected away: zero gradient)."""
  mode = AGG_ALIASES.get(mode, mode)
  on = mask_bt > 0
  m = on.astype(jnp.float32)
  xm = jnp.where(on, x_bt.astype(jnp.float32), 0.0)
  per_row = jnp.sum(xm, axis=-1)
  counts = jnp.sum(m, axis=-1)
  rows = jnp.maximum(jnp.sum(counts > 0), 1)
  if mode == "token-mean":
    return jnp.sum(per_row) / jnp.maximum(jnp.sum(counts), 1.0)
  if mode == "sequence-mean-token-mean":
    return jnp.sum(jnp.where(counts > 0, per_row / jnp.maximum(counts, 1.0), 0.0)) / rows
  if mode == "sequence-mean-token-scale":
    return jnp.sum(per_row / x_bt.shape[-1]) / rows
  if mode in ("seq-mean-token-sum", "sequence-mean-token-sum-norm"):
    return jnp.sum(per_row) / rows
  raise ValueError(f"loss_agg_mode {mode!r}: use one of {AGG_MODES}")


def aggregate_units(mask_bt: jax.Array, mode: str = "sequence-mean-token-mean") -> jax.Array:
  """How many units `aggregate` averages over: trained tokens for "token-mean", rows with tokens otherwise (the
  "weight" that makes a weighted mean of micro-batch losses the whole batch's loss, `jaxlab.train.accumulate`)."""
  mode = AGG_ALIASES.get(mode, mode)
  on = mask_bt > 0
  if mode == "token-mean":
    return jnp.sum(on.astype(jnp.float32))
  return jnp.sum(jnp.any(on, axis=-1).astype(jnp.float32))


def per_token_logps(model: Callable, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                    segment_ids_bt: jax.Array | None = None, *, temperature: float = 1.0, with_entropy: bool = False,
                    **inputs):
  """Teacher-forced log p(token_t | tokens_<t) of every position (position 0 gets 0).

  Args:
    model: a `jaxlab.lm.Transformer` (or any `(tokens, positions, segment_ids_bl=) -> logits`).
    tokens_bt: (B, T) int tokens (prompt + completion, right padded).
    positions_bt: (B, T) positions (default arange).
    segment_ids_bt: (B, T) segment ids (1 real, 0 padding); None = all real.
    temperature: the log-probs of the sampling policy softmax(logits / temperature) (as Tunix computes them;
      use the rollout temperature so the policy gradient is that of the distribution that was sampled).
    with_entropy: also return the (B, T) entropy of the predictive distribution at each position.
    **inputs: extra model inputs (e.g. a VLM's `images`), passed to the model.

  Returns:
    (B, T) float32 log-probs aligned with the tokens; with `with_entropy`, (logps, entropy).
  """
  logits = model(tokens_bt, positions_bt, segment_ids_bl=segment_ids_bt, **inputs)[:, :-1].astype(jnp.float32)
  if temperature != 1.0:
    logits = logits / temperature
  ce, _ = token_stats(logits, tokens_bt[:, 1:])
  lp = jnp.pad(-ce, ((0, 0), (1, 0)))
  if not with_entropy:
    return lp
  logz = jax.nn.logsumexp(logits, axis=-1)
  p = jax.nn.softmax(logits, axis=-1)
  ent = jnp.pad(logz - jnp.sum(p * logits, axis=-1), ((0, 0), (1, 0)))
  return lp, ent


def grpo_loss(logps_bt: jax.Array, old_logps_bt: jax.Array | None, ref_logps_bt: jax.Array | None,
              advantages_b: jax.Array, mask_bt: jax.Array, config: GRPOConfig) -> tuple[jax.Array, dict]:
  """The GRPO objective from per-token log-probs (see the module docstring).

  Args:
    logps_bt: (B, T) current log-probs (differentiated).
    old_logps_bt: (B, T) rollout-policy log-probs; None = stop_gradient(logps) (num_iterations == 1).
    ref_logps_bt: (B, T) reference log-probs; needed when beta > 0.
    advantages_b: (B,) sequence advantages.
    mask_bt: (B, T) 1 on completion tokens that are trained (0 on prompt, padding, tool observations).
    config: the GRPO config.

  Returns:
    (loss scalar, {"pg_loss", "kl", "clip_low", "clip_high", "ratio"}); clip_* are the fractions of trained
    tokens whose ratio was clipped (from below / above) with a nonzero gradient lost.
  """
  c = config
  old = jax.lax.stop_gradient(logps_bt) if old_logps_bt is None else old_logps_bt
  ratio = jnp.exp(jnp.clip(logps_bt - old, -20.0, 20.0))
  adv = advantages_b.astype(jnp.float32)[:, None]
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - c.epsilon, 1.0 + c.eps_high)
  pg = jnp.maximum(pg1, pg2)
  if c.epsilon_c is not None:
    pg = jnp.where(adv < 0, jnp.minimum(pg, -adv * c.epsilon_c), pg)
  loss = aggregate(pg, mask_bt, c.loss_agg_mode)
  metrics = {"pg_loss": loss}
  if c.beta > 0:
    if ref_logps_bt is None:
      raise ValueError("grpo_loss: beta > 0 needs ref_logps")
    kl_tok = kl_estimate(logps_bt, ref_logps_bt, c.kl_loss_mode, c.kl_clamp)
    kl = aggregate(kl_tok, mask_bt, c.loss_agg_mode)
    loss = loss + c.beta * kl
    metrics["kl"] = kl
  token_mean = lambda x: aggregate(x, mask_bt, "token-mean")
  metrics["clip_low"] = token_mean((adv < 0) & (ratio < 1.0 - c.epsilon))
  metrics["clip_high"] = token_mean((adv > 0) & (ratio > 1.0 + c.eps_high))
  metrics["ratio"] = token_mean(ratio)
  return loss, metrics


def make_grpo_loss_fn(config: GRPOConfig, temperature: float = 1.0):
  """`loss_fn(model, batch, key) -> (loss, metrics)` for `jaxlab.train.step.make_train_step`.

  `temperature` is the rollout temperature: log-probs are those of softmax(logits / temperature).

  The batch holds "tokens", "positions", "segment_ids", "loss_mask" (B, T), "advantages" (B,) and, when used,
  "old_logps" (num_iterations > 1) and "ref_logps" (beta > 0), each (B, T), plus any extra model inputs
  (`MODEL_INPUT_KEYS`, e.g. a VLM's "images"). Metrics add the mean entropy of the trained tokens, and the
  reserved "weight" is the number of units the loss averages (`aggregate_units`), so micro-batched updates
  (`jaxlab.train.accumulate`) take the whole batch's gradient.
  """
  def loss_fn(model, batch: Mapping[str, Any], key):
    del key
    lp, ent = per_token_logps(model, batch["tokens"], batch["positions"], batch["segment_ids"],
                              temperature=temperature, with_entropy=True, **model_inputs(batch))
    old = batch.get("old_logps") if config.num_iterations > 1 else None
    loss, m = grpo_loss(lp, old, batch.get("ref_logps"), batch["advantages"], batch["loss_mask"], config)
    m["entropy"] = aggregate(ent, batch["loss_mask"], "token-mean")
    m["weight"] = aggregate_units(batch["loss_mask"], config.loss_agg_mode)
    return loss, m
  return loss_fn


def make_logps_fn(modeldef, temperature: float = 1.0, micro_batches: int = 1):
  """`(params, model_state, batch) -> (B, T) log-probs` (reference / old-policy passes), jitted.

  With `micro_batches` = k > 1 the rows are taken k micro-batches at a time (`jaxlab.train.accumulate.map_micro`,
  the same split as the micro-batched update): the same log-probs, one micro-batch's logits alive at a time.

  Parameters keep the shardings they come with. With a multi-device mesh in context (`jaxlab.mesh.use`) a
  batch whose size divides the data split is put on the mesh's batch sharding first (a no-op when it is
  there already); otherwise it goes in as given.

  Args:
    modeldef: `jaxlab.state.ModelDef` of the policy.
    temperature: the sampling temperature the log-probs are taken at.
    micro_batches: rows per pass = rows / micro_batches.
  """
  def fn(params, model_state, batch):
    model = modeldef.merge(params, model_state)
    model.eval()

    def one(b):
      return per_token_logps(model, b["tokens"], b["positions"], b["segment_ids"], temperature=temperature,
                             **model_inputs(b))
    sharding = mesh_lib.batch_sharding() if mesh_lib.multi_device() else None
    return accumulate.map_micro(one, batch, micro_batches, sharding)

  jitted = jax.jit(fn)

  def logps(params, model_state, batch):
    rows = len(batch["tokens"])
    if mesh_lib.multi_device() and rows % mesh_lib.data_split() == 0:
      batch = jax.device_put(batch, mesh_lib.batch_sharding())
    return jitted(params, model_state, batch)
  logps.jitted = jitted   # the jitted pass itself (what `jaxlab.compile_check` compiles)
  return logps
