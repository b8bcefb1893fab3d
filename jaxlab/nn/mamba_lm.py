"""Mamba-1 causal language model (Flax NNX) with parallel prefill and O(1)-per-token recurrent generation.

The model (mamba_ssm `MixerModel` + `MambaLMHeadModel` / Hugging Face `MambaForCausalLM`): token embedding,
n_layer pre-norm residual blocks `h = h + Mamba(RMSNorm(h))` (`jaxlab.nn.mamba.MambaLayer`; residual stream
in float32 by default), final RMSNorm, head tied to the embedding. A recurrent `step` carries per layer the
last d_conv - 1 conv inputs and the (batch, d_inner, d_state) float32 SSM state, so generation costs O(1)
per token.

Initialisation follows mamba_ssm `MixerModel._init_weights`: embedding N(0, 0.02); out_proj divided by
sqrt(n_layer) (`rescale_prenorm_residual`); the blocks as in `jaxlab.nn.mamba`. Logits are float32
(reconstructed: not fixed by the paper or its code).

Checkpoints: `MambaLM.from_pretrained(dir)` / `save_pretrained(dir)` read and write the Hugging Face format
(config.json + *.safetensors; see `jaxlab.nn.mamba_hf`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.nn import layers
from jaxlab.nn.mamba import Cache, MambaLayer


class MambaLM(nnx.Module):
  """Mamba-1 causal language model (mamba_ssm `MambaLMHeadModel` / HF `MambaForCausalLM` layout).

  Parameters: embed.embedding (padded_vocab, d_model) ("vocab", "embed"); layers[i].norm.weight,
  layers[i].mixer.* (see `MambaBlock`); norm_f.weight; lm_head.kernel (d_model, padded_vocab)
  ("embed", "vocab") only when `tie_embeddings=False`.

  Args:
    vocab_size: number of tokens; the embedding has `padded_vocab_size` rows (rounded up to a multiple of
      `pad_vocab_size_multiple`) and logits have `padded_vocab_size` columns (as in mamba_ssm).
    d_model: width.
    n_layer: number of residual Mamba blocks.
    d_state, d_conv, expand, dt_rank, conv_bias, bias: `MambaBlock` settings.
    pad_vocab_size_multiple: see `vocab_size`.
    norm_eps: RMSNorm epsilon.
    tie_embeddings: the output head is the transposed embedding.
    residual_in_fp32: keep the residual stream in float32 (whatever `dtype`).
    scan_impl: selective-scan implementation of every block (see `set_scan_impl`).
    dtype: compute dtype (parameters are float32; logits are returned in float32).
    rngs: initialisation randomness (not stored).
    **block_kwargs: further `MambaBlock` settings (dt_min, dt_max, dt_init, dt_scale, dt_init_floor).
  """

  def __init__(self, vocab_size: int, d_model: int, n_layer: int, *, d_state: int = 16, d_conv: int = 4,
               expand: float = 2, dt_rank: int | str = "auto", conv_bias: bool = True, bias: bool = False,
               pad_vocab_size_multiple: int = 8, norm_eps: float = 1e-5, tie_embeddings: bool = True,
               residual_in_fp32: bool = True, scan_impl: str = "auto", dtype=jnp.float32, rngs: nnx.Rngs,
               **block_kwargs):
    m = max(int(pad_vocab_size_multiple), 1)
    padded = -(-vocab_size // m) * m
    self.vocab_size, self.padded_vocab_size = vocab_size, padded
    self.d_model, self.n_layer = d_model, n_layer
    # Hashable (the graphdef is a static jit argument in `generate`); read it through `config`.
    self._config = tuple(sorted(dict(
        vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, d_state=d_state, d_conv=d_conv,
        expand=expand, dt_rank=dt_rank, conv_bias=conv_bias, bias=bias, pad_vocab_size_multiple=m,
        norm_eps=norm_eps, tie_embeddings=tie_embeddings, residual_in_fp32=residual_in_fp32,
        **block_kwargs).items()))
    self.tie_embeddings, self.residual_in_fp32 = tie_embeddings, residual_in_fp32
    self.dtype = dtype
    with nnx.use_eager_sharding(False):
      self.embed = layers.embed(padded, d_model, names=("vocab", "embed"), init=layers.normal(0.02), dtype=dtype,
                                rngs=rngs)
      self.layers = nnx.List([
          MambaLayer(d_model, eps=norm_eps, dtype=dtype, rngs=rngs, d_state=d_state, d_conv=d_conv,
                     expand=expand, dt_rank=dt_rank, conv_bias=conv_bias, bias=bias, scan_impl=scan_impl,
                     out_proj_init_scale=1.0 / math.sqrt(n_layer), **block_kwargs)
          for _ in range(n_layer)])
      self.norm_f = layers.RMSNorm(d_model, eps=norm_eps, dtype=dtype)
      self.lm_head = None if tie_embeddings else layers.dense(
          d_model, padded, names=("embed", "vocab"), kernel_init=layers.fan_in_uniform(d_model), dtype=dtype,
          rngs=rngs)

  @property
  def config(self) -> dict[str, Any]:
    """The constructor's architecture arguments (without rngs, dtype and scan_impl)."""
    return dict(self._config)

  def set_scan_impl(self, impl: str) -> None:
    """Sets the `selective_scan` implementation of every block.

    Args:
      impl: "auto", "xla", "pallas", "interpret", ... (see `jaxlab.kernels.selective_scan`; a Pallas impl
        runs per shard when a multi-device mesh is in context).
    """
    for layer in self.layers:
      layer.mixer.scan_impl = impl

  def _embed(self, tokens):
    h = self.embed(tokens)
    return h.astype(jnp.float32) if self.residual_in_fp32 else h.astype(self.dtype)

  def _logits(self, h):
    x = self.norm_f(h)
    logits = self.embed.attend(x) if self.lm_head is None else self.lm_head(x)
    return logits.astype(jnp.float32)

  def __call__(self, tokens_bl: jax.Array, delta_scale=None) -> jax.Array:
    """Logits of every position.

    Args:
      tokens_bl: (batch, length) integer token ids.
      delta_scale: optional Delta multiplier applied in every block (see `MambaBlock.__call__`).

    Returns:
      (batch, length, padded_vocab_size) float32 logits.
    """
    h = self._embed(tokens_bl)
    for layer in self.layers:
      h = layer(h, delta_scale)
    return self._logits(h)

  def init_cache(self, batch: int) -> tuple[Cache, ...]:
    """Zero recurrent cache: one (conv_state, ssm_state) pair per layer (see `MambaBlock.init_cache`)."""
    return tuple(layer.mixer.init_cache(batch) for layer in self.layers)

  def prefill(self, tokens_bl: jax.Array, delta_scale=None) -> tuple[jax.Array, tuple[Cache, ...]]:
    """Runs a prompt with the parallel scan and returns the last logits and the cache after it.

    Args:
      tokens_bl: (batch, length) prompt, length >= 1.
      delta_scale: optional Delta multiplier.

    Returns:
      (logits_bv (batch, padded_vocab_size) float32 for the last position, cache).
    """
    h = self._embed(tokens_bl)
    cache = []
    for layer in self.layers:
      y, c = layer.mixer.prefill(layer.norm(h), delta_scale)
      h = h + y.astype(h.dtype)
      cache.append(c)
    return self._logits(h[:, -1]), tuple(cache)

  def step(self, token_b: jax.Array, cache: tuple[Cache, ...], delta_scale=None
           ) -> tuple[jax.Array, tuple[Cache, ...]]:
    """One token of recurrent inference.

    Args:
      token_b: (batch,) integer token ids.
      cache: from `init_cache`, `prefill` or a previous `step`.
      delta_scale: optional Delta multiplier.

    Returns:
      (logits_bv (batch, padded_vocab_size) float32, new cache).
    """
    h = self._embed(token_b)
    new = []
    for layer, c in zip(self.layers, cache):
      y, c = layer.mixer.step(layer.norm(h), c, delta_scale)
      h = h + y.astype(h.dtype)
      new.append(c)
    return self._logits(h), tuple(new)

  def generate(self, tokens_bl: jax.Array, max_new_tokens: int, *, temperature: float = 0.0,
               key: jax.Array | None = None) -> jax.Array:
    """Autoregressive generation: parallel prefill, then a jitted `lax.scan` of recurrent steps.

    Args:
      tokens_bl: (batch, length) integer prompt, length >= 1.
      max_new_tokens: number of tokens to append.
      temperature: 0 for greedy decoding, > 0 to sample from softmax(logits / temperature).
      key: PRNG key, required when temperature > 0.

    Returns:
      (batch, length + max_new_tokens) int32: the prompt followed by the generated tokens. Token ids
      >= vocab_size (vocabulary padding) are never produced.
    """
    tokens_bl = jnp.asarray(tokens_bl)
    if tokens_bl.ndim != 2 or tokens_bl.shape[1] < 1:
      raise ValueError(f"generate: tokens must be (batch, length >= 1), got shape {tokens_bl.shape}")
    if max_new_tokens <= 0:
      return tokens_bl.astype(jnp.int32)
    sample = temperature > 0
    if sample and key is None:
      raise ValueError("generate: temperature > 0 samples tokens and needs key=jax.random.key(...)")
    key = jax.random.key(0) if key is None else key
    graphdef, state = nnx.split(self)
    return _generate(graphdef, state, tokens_bl.astype(jnp.int32), jnp.float32(max(temperature, 1e-6)), key,
                     max_new_tokens=int(max_new_tokens), sample=bool(sample))

  # -- Hugging Face checkpoints (jaxlab.nn.mamba_hf) ---------------------------------------------------

  @classmethod
  def from_pretrained(cls, path: str, dtype=jnp.float32, scan_impl: str = "auto") -> "MambaLM":
    """Loads a local Hugging Face-format Mamba checkpoint directory (`jaxlab.nn.mamba_hf.from_pretrained`)."""
    del cls
    from jaxlab.nn import mamba_hf  # pylint: disable=g-import-not-at-top  (mamba_hf imports this module)
    return mamba_hf.from_pretrained(path, dtype=dtype, scan_impl=scan_impl)

  def save_pretrained(self, path: str) -> None:
    """Writes config.json + model.safetensors in the Hugging Face format (`jaxlab.nn.mamba_hf`)."""
    from jaxlab.nn import mamba_hf  # pylint: disable=g-import-not-at-top
    mamba_hf.save_pretrained(self, path)


def _generate_impl(graphdef, state, tokens_bl, temperature, key, *, max_new_tokens, sample):
  model = nnx.merge(graphdef, state)
  vocab_mask = jnp.arange(model.padded_vocab_size) < model.vocab_size

  def pick(logits_bv, k):
    logits_bv = jnp.where(vocab_mask, logits_bv, -jnp.inf)
    if sample:
      return jax.random.categorical(k, logits_bv / temperature, axis=-1).astype(jnp.int32)
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)

  keys = jax.random.split(key, max_new_tokens)
  logits, cache = model.prefill(tokens_bl)
  first = pick(logits, keys[0])

  def body(carry, k):
    tok, cache = carry
    logits, cache = model.step(tok, cache)
    nxt = pick(logits, k)
    return (nxt, cache), nxt

  _, rest = jax.lax.scan(body, (first, cache), keys[1:])
  return jnp.concatenate([tokens_bl, first[:, None], rest.T], axis=1)


_generate = jax.jit(_generate_impl, static_argnames=("graphdef", "max_new_tokens", "sample"))
