"""Supervised fine-tuning (SFT) loss and evaluation of decoder LMs on masked rows (`jaxlab.lm.sft_data`).

`sft_loss` / `make_loss_fn`: mean token cross-entropy over masked-in (completion) tokens (float32,
numerically the standard log-softmax CE; masked positions get exactly zero gradient) and token accuracy.
The loss fn for `jaxlab.train.fit` also returns the reserved metric `"weight"`, the number of loss tokens
its means are over, so the training loop averages train metrics over a logging window token-weighted
(sum(value * weight) / sum(weight)) rather than batch-weighted.

`make_eval_fn`: per-row loss, token accuracy and sequence exact match (all completion tokens are the argmax
under teacher forcing, which is exactly "greedy decoding reproduces the completion").

Batches are the dicts of `jaxlab.lm.sft_data.build_padded` / `build_packed`: {"inputs", "targets",
"loss_mask", "positions", "segment_ids"}.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

Batch = Mapping[str, jax.Array]


def token_stats(logits_blv: jax.Array, targets_bl: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy and argmax correctness.

  Args:
    logits_blv: (batch, length, vocab) logits, any float dtype (computed in float32).
    targets_bl: (batch, length) int target ids.

  Returns:
    (ce_bl float32 = logsumexp(logits) - logits[target], correct_bl bool = argmax(logits) == target).
  """
  logits = logits_blv.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  # One-hot contraction rather than a gather: stays local when the vocab axis is sharded.
  target_logit = jnp.sum(logits * jax.nn.one_hot(targets_bl, logits.shape[-1], dtype=logits.dtype), axis=-1)
  correct = jnp.argmax(logits, axis=-1) == targets_bl
  return lse - target_logit, correct


def sft_loss(logits_blv: jax.Array, targets_bl: jax.Array,
             loss_mask_bl: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean token cross-entropy over the masked-in (completion) tokens.

  Positions with `loss_mask == 0` are selected away with `jnp.where`, so they receive exactly zero gradient
  (even if their logits are extreme). Nonzero mask values act as token weights.

  Args:
    logits_blv: (batch, length, vocab) logits.
    targets_bl: (batch, length) int target ids.
    loss_mask_bl: (batch, length) float mask/weights (1 on completion tokens).

  Returns:
    (loss float32 scalar = sum(mask * ce) / max(sum(mask), 1),
     {"token_accuracy": weighted fraction of argmax hits, "tokens": sum(mask)}).
  """
  ce, correct = token_stats(logits_blv, targets_bl)
  mask = loss_mask_bl.astype(jnp.float32)
  on = mask > 0
  tokens = jnp.sum(jnp.where(on, mask, 0.0))
  denom = jnp.maximum(tokens, 1.0)
  loss = jnp.sum(jnp.where(on, ce * mask, 0.0)) / denom
  acc = jnp.sum(jnp.where(on & correct, mask, 0.0)) / denom
  return loss, {"token_accuracy": acc, "tokens": tokens}


def default_apply(model: Callable, batch: Batch) -> jax.Array:
  """Calls a `jaxlab.lm` transformer on an SFT batch: logits (batch, length, vocab)."""
  return model(batch["inputs"], batch["positions"], segment_ids_bl=batch["segment_ids"])


def make_loss_fn(apply: Callable[[Any, Batch], jax.Array] = default_apply):
  """`loss_fn(model, batch, key) -> (loss, {"token_accuracy", "tokens", "weight"})` for `jaxlab.train.fit`.

  The loss is `sft_loss`'s. `"weight"` (float32 scalar, = "tokens", the summed loss mask) is the reserved
  metric telling the training loop how many tokens the batch's means are over, so train metrics over a
  logging window are token-weighted: sum(value * weight) / sum(weight).

  Args:
    apply: `(model, batch) -> logits (batch, length, vocab)`; the default calls
      `model(inputs, positions, segment_ids_bl=segment_ids)`.
  """
  def loss_fn(model, batch, key):
    del key
    loss, metrics = sft_loss(apply(model, batch), batch["targets"], batch["loss_mask"])
    return loss, {**metrics, "weight": metrics["tokens"].astype(jnp.float32)}
  return loss_fn


def make_eval_fn(apply: Callable[[Any, Batch], jax.Array] = default_apply):
  """`eval_fn(model, batch) -> {"loss", "token_accuracy", "exact_match"}`, each per row (batch,) float32.

  Per row: mean CE over its completion tokens, fraction of them predicted by argmax, and 1.0 iff ALL are
  (teacher-forced exact match == greedy decoding reproduces the completion, EOS included). Use padded rows
  (one example per row) for per-example numbers; on packed rows the values are per row. Rows without
  completion tokens get 0 for all three.

  Args:
    apply: as in `make_loss_fn`.
  """
  def eval_fn(model, batch):
    ce, correct = token_stats(apply(model, batch), batch["targets"])
    on = batch["loss_mask"] > 0
    n = jnp.sum(on, axis=-1).astype(jnp.float32)
    denom = jnp.maximum(n, 1.0)
    loss = jnp.sum(jnp.where(on, ce, 0.0), axis=-1) / denom
    acc = jnp.sum(on & correct, axis=-1) / denom
    exact = (n > 0) & jnp.all(correct | ~on, axis=-1)
    return {"loss": loss, "token_accuracy": acc, "exact_match": exact.astype(jnp.float32)}
  return eval_fn
