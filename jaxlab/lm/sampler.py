"""Batched KV-cache sampling from a `jaxlab.lm.Transformer`: greedy, temperature, top-k, top-p, stop tokens.

Algorithm (one jit-compiled function per shape / static setting):

1. Prompts of different lengths are LEFT-padded to the longest, P tokens: row b is
   [pad] * (P - n_b) + prompt_b. Slot s of row b holds position max(s - (P - n_b), 0) and segment id
   1 for real tokens, 0 for padding, so real tokens never attend to padding (`Transformer` masks).
2. Prefill: one forward over the (batch, P) padded prompts writes slots 0..P-1 of a fresh `KVCache` of
   `max_len` slots and gives the logits of each prompt's last token.
3. Decode: a `lax.while_loop`; step i picks token t_i from the current logits, stores it, and feeds it at
   slot P + i with position n_b + i. The loop ends when every row has produced a stop token or after
   `max_new_tokens` steps.

Token choice at temperature T > 0 follows the usual order: logits / T, keep the top_k largest (top_k > 0),
then keep the smallest set of most likely tokens whose probability reaches top_p (nucleus; the most likely
token is always kept), then sample. T == 0 is greedy argmax (first index on ties).

Per-sequence results (our conventions; the stop token is kept, as in HF `generate`): generated tokens up
to and including the first stop token, `pad_id` after it; `lengths` count the generated tokens including
the stop token; `logprobs` are the log-probabilities of the chosen tokens under the model's unmodified
distribution log_softmax(logits) (no temperature or filtering), 0 at padding. The loop runs one forward
after the last chosen token (its logits are unused), so the cache needs longest prompt + max_new_tokens
slots.

Sharding: the sampler reads the mesh and rules from the context (`jaxlab.mesh.use`). On a multi-device
mesh the batch is split over the mesh axes of logical "batch" (a batch that does not divide is padded
with copies of its last prompt, whose results are dropped) and parameters not yet on the mesh are placed
by their logical axis names. Rows are independent and the sampling noise of a row depends only on its
index, so the result equals the single-device one. Without a mesh, or on one device, nothing is placed.
"""

from __future__ import annotations

from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.lm.model import Transformer


@flax.struct.dataclass
class SampleOutput:
  """Result of `generate`.

  Attributes:
    tokens: (batch, max_new_tokens) int32 generated tokens; `pad_id` after each row's first stop token.
    lengths: (batch,) int32 number of generated tokens of each row, the stop token included.
    logprobs: (batch, max_new_tokens) float32 log p(token) under log_softmax(logits) of the model
      (before temperature / top-k / top-p); 0 after the stop token.
    stopped: (batch,) bool, True where the row ended with a stop token (False: it hit max_new_tokens).
  """
  tokens: jax.Array
  lengths: jax.Array
  logprobs: jax.Array
  stopped: jax.Array


def _as_batch(prompts, prompt_lengths) -> tuple[np.ndarray, np.ndarray]:
  """(tokens (B, P) right-padded int32, lengths (B,) int32) from lists or an array + lengths."""
  if isinstance(prompts, (list, tuple)) and (len(prompts) == 0 or not np.isscalar(prompts[0])):
    if prompt_lengths is not None:
      raise ValueError("generate: prompt_lengths applies to an array of prompts, not to a list of lists")
    if len(prompts) == 0:
      raise ValueError("generate: no prompts")
    rows = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
    lengths = np.asarray([len(r) for r in rows], np.int32)
    tokens = np.zeros((len(rows), max(int(lengths.max()), 1)), np.int32)
    for b, r in enumerate(rows):
      tokens[b, :len(r)] = r
    return tokens, lengths
  tokens = np.asarray(prompts)
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"generate: prompts must be a list of token lists or a (batch, length) int array, got "
                     f"{tokens.dtype} shape {tokens.shape}")
  lengths = (np.full((tokens.shape[0],), tokens.shape[1], np.int32) if prompt_lengths is None
             else np.asarray(prompt_lengths, np.int32).reshape(-1))
  if lengths.shape[0] != tokens.shape[0]:
    raise ValueError(f"generate: {lengths.shape[0]} prompt_lengths for {tokens.shape[0]} prompts")
  if (lengths > tokens.shape[1]).any():
    raise ValueError(f"generate: a prompt length {int(lengths.max())} exceeds the prompt array width "
                     f"{tokens.shape[1]}")
  return tokens.astype(np.int32), lengths


def generate(model: Transformer, prompts: Sequence[Sequence[int]] | np.ndarray | jax.Array,
             max_new_tokens: int, *, prompt_lengths: Sequence[int] | np.ndarray | None = None,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, stop_tokens: Sequence[int] = (),
             pad_id: int = 0, key: jax.Array | None = None, max_len: int | None = None) -> SampleOutput:
  """Samples continuations of a batch of prompts with a KV cache (prefill + jitted while-loop decode).

  Args:
    model: a `jaxlab.lm.Transformer` (e.g. `modeldef.merge(params, model_state)` or `from_pretrained`).
    prompts: a list of token-id lists (any lengths >= 1), or a (batch, length) int array whose row b holds
      its prompt in the first prompt_lengths[b] entries (right padding; any pad value).
    max_new_tokens: number of decoding steps (>= 1).
    prompt_lengths: (batch,) lengths for an array of prompts (default: the full width).
    temperature: 0 for greedy decoding, > 0 to sample from softmax(logits / temperature).
    top_k: keep only the k most likely tokens when sampling (0 = off).
    top_p: nucleus threshold in (0, 1] when sampling (1 = off).
    stop_tokens: token ids that end a sequence (kept in its output and counted in its length).
    pad_id: id written to the prompt padding and after each sequence's stop token.
    key: PRNG key, required when temperature > 0; step i uses fold_in(key, i).
    max_len: KV-cache slots per sequence (default: longest prompt + max_new_tokens).

  Returns:
    `SampleOutput` with tokens (batch, max_new_tokens) int32, lengths (batch,) int32, logprobs
    (batch, max_new_tokens) float32 and stopped (batch,) bool.

  Raises:
    ValueError: bad prompts or settings, a prompt + max_new_tokens longer than the cache or the model's
      max_position, temperature > 0 without a key.
  """
  if not isinstance(model, Transformer):
    raise ValueError(f"generate: model must be a jaxlab.lm.Transformer, got {type(model).__name__}")
  c = model.config
  tokens, lengths = _as_batch(prompts, prompt_lengths)
  batch = tokens.shape[0]
  max_new_tokens = int(max_new_tokens)
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
  if (lengths < 1).any():
    raise ValueError(f"generate: prompt {int(np.argmin(lengths))} is empty; every prompt needs >= 1 token")
  if not (temperature >= 0 and np.isfinite(temperature)):
    raise ValueError(f"generate: temperature must be finite and >= 0, got {temperature}")
  if not 0 < top_p <= 1:
    raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
  if int(top_k) < 0:
    raise ValueError(f"generate: top_k must be >= 0, got {top_k}")
  greedy = temperature == 0
  if not greedy and key is None:
    raise ValueError("generate: temperature > 0 samples tokens and needs key=jax.random.key(...)")
  width = int(lengths.max())
  need = width + max_new_tokens
  max_len = need if max_len is None else int(max_len)
  if need > max_len:
    raise ValueError(f"generate: the longest prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) = {need} "
                     f"exceeds the KV cache (max_len={max_len}); raise max_len or shorten the prompts")
  if need > c.max_position:
    raise ValueError(f"generate: the longest prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) = {need} "
                     f"exceeds the model's max_position={c.max_position}")
  # Left padding (host side).
  left = np.full((batch, width), pad_id, np.int32)
  for b in range(batch):
    n = int(lengths[b])
    left[b, width - n:] = tokens[b, :n]
  stop = np.asarray(list(stop_tokens) or [-1], np.int32)
  key = jax.random.key(0) if key is None else key
  graphdef, state = nnx.split(model)
  mesh = mesh_lib.current_mesh()
  mesh = mesh if isinstance(mesh, Mesh) and mesh_lib.multi_device(mesh) else None
  if mesh is None:
    batch_spec, args = None, [jnp.asarray(left), jnp.asarray(lengths)]
  else:
    extra = -batch % mesh_lib.data_split(mesh)      # pad the batch to a multiple of the data split
    left = np.concatenate([left, np.repeat(left[-1:], extra, axis=0)])
    lengths = np.concatenate([lengths, np.repeat(lengths[-1:], extra)])
    state = _place_state(state, mesh)
    batch_spec = mesh_lib.batch_spec(mesh=mesh)
    args = [jax.device_put(a, NamedSharding(mesh, batch_spec)) for a in (left, lengths)]
  out = _generate(graphdef, state, *args, jnp.asarray(stop), jnp.float32(max(float(temperature), 1e-6)),
                  jnp.float32(top_p), key, max_new_tokens=max_new_tokens, max_len=max_len, greedy=bool(greedy),
                  top_k=int(top_k), use_top_p=bool(top_p < 1), pad_id=int(pad_id), mesh=mesh,
                  batch_spec=batch_spec)
  if out.tokens.shape[0] != batch:
    out = jax.tree.map(lambda x: x[:batch], out)
  return out


def _place_state(state, mesh: Mesh):
  """Puts model state on `mesh`: leaves already there keep their sharding, others go by their logical axis
  names under the sharding rules in context (replicated where they have none)."""
  specs = nnx.get_partition_spec(state)

  def place(x, spec):
    sh = getattr(x, "sharding", None)
    if isinstance(sh, NamedSharding) and sh.mesh == mesh:
      return x
    mesh_spec = mesh_lib.logical_to_mesh(spec if isinstance(spec, P) else None, mesh=mesh)
    return jax.device_put(x, NamedSharding(mesh, mesh_spec))

  return jax.tree.map(place, state, specs, is_leaf=lambda x: isinstance(x, P))


def filter_logits(logits_bv: jax.Array, *, top_k: int = 0, top_p: jax.Array | float | None = None) -> jax.Array:
  """Top-k then top-p (nucleus) filtering: removed logits become -inf.

  Args:
    logits_bv: (batch, vocab) float32 (already divided by the temperature).
    top_k: keep the k largest logits per row (0 = no top-k); ties with the k-th value are kept.
    top_p: keep the smallest prefix of the sorted distribution whose probability mass reaches top_p
      (always at least the most likely token); None = no top-p.

  Returns:
    (batch, vocab) float32 with filtered entries at -inf.
  """
  x = logits_bv.astype(jnp.float32)
  neg = jnp.float32(-jnp.inf)
  if top_k and top_k < x.shape[-1]:
    kth = jax.lax.top_k(x, top_k)[0][:, -1:]
    x = jnp.where(x < kth, neg, x)
  if top_p is not None:
    s = -jnp.sort(-x, axis=-1)                                  # descending
    p = jax.nn.softmax(s, axis=-1)
    before = jnp.cumsum(p, axis=-1) - p                         # mass of strictly more likely tokens
    keep = before < top_p
    keep = keep.at[:, 0].set(True)
    cutoff = jnp.min(jnp.where(keep, s, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x < cutoff, neg, x)
  return x


def _generate_impl(graphdef, state, left_bp, lengths_b, stop_k, temperature, top_p, key, *, max_new_tokens,
                   max_len, greedy, top_k, use_top_p, pad_id, mesh, batch_spec):
  model = nnx.merge(graphdef, state)
  b, width = left_bp.shape
  starts = width - lengths_b                                     # first real slot of each row

  def constrain(x, spec):
    return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  bax = None if batch_spec is None or len(batch_spec) == 0 else batch_spec[0]
  cache = model.init_cache(b, max_len)
  cache = cache.replace(k=constrain(cache.k, P(None, bax)), v=constrain(cache.v, P(None, bax)),
                        segment_ids=constrain(cache.segment_ids, P(bax)))
  slots = jnp.arange(width, dtype=jnp.int32)[None, :]
  seg = (slots >= starts[:, None]).astype(jnp.int32)
  pos = jnp.maximum(slots - starts[:, None], 0)
  logits, cache = model(left_bp, pos, segment_ids_bl=seg, cache=cache, cache_index=0)
  logits = logits[:, -1]

  def pick(logits_bv, k):
    if greedy:
      return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
    x = filter_logits(logits_bv / temperature, top_k=top_k, top_p=top_p if use_top_p else None)
    return jax.random.categorical(k, x, axis=-1).astype(jnp.int32)

  def cond(carry):
    i, _, _, done, *_ = carry
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    i, logits, cache, done, toks, lps, lens = carry
    tok = pick(logits, jax.random.fold_in(key, i))
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tok[:, None], axis=-1)[:, 0]
    tok = jnp.where(done, pad_id, tok)
    lp = jnp.where(done, 0.0, lp)
    toks = jax.lax.dynamic_update_slice(toks, tok[:, None], (0, i))
    lps = jax.lax.dynamic_update_slice(lps, lp[:, None], (0, i))
    lens = lens + (~done).astype(jnp.int32)
    done = done | jnp.any(tok[:, None] == stop_k[None, :], axis=-1)
    logits, cache = model(tok[:, None], (lengths_b + i)[:, None], cache=cache, cache_index=width + i)
    return i + 1, logits[:, 0], cache, done, toks, lps, lens

  init = (jnp.int32(0), logits, cache, jnp.zeros((b,), bool),
          constrain(jnp.full((b, max_new_tokens), pad_id, jnp.int32), P(bax)),
          constrain(jnp.zeros((b, max_new_tokens), jnp.float32), P(bax)), jnp.zeros((b,), jnp.int32))
  _, _, _, done, toks, lps, lens = jax.lax.while_loop(cond, body, init)
  return SampleOutput(tokens=toks, lengths=lens, logprobs=lps, stopped=done)


_generate = jax.jit(_generate_impl, static_argnames=("graphdef", "max_new_tokens", "max_len", "greedy", "top_k",
                                                     "use_top_p", "pad_id", "mesh", "batch_spec"))
