"""jaxlab.lm KV cache and sampler: cached (left-padded, chunked) decoding == full forward, greedy == argmax
of repeated full forwards, top-k / top-p filters, stop tokens and lengths, errors, 4x2-mesh sharding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab import mesh as mesh_lib
from jaxlab.lm import Transformer, TransformerConfig, generate
from jaxlab.lm.sampler import filter_logits

V = 64
BASE = dict(vocab_size=V, hidden=32, n_layers=2, n_heads=4, mlp_hidden=64, max_position=24)
CONFIGS = {
    "llama": TransformerConfig(**BASE, arch="llama", n_kv_heads=2, qkv_bias=True, rope_theta=500.0),
    "opt": TransformerConfig(**BASE, arch="opt", qkv_bias=True, o_bias=True, mlp_bias=True, tie_embeddings=True),
}
PROMPTS = [[3, 14, 15, 9, 26], [5, 35], [8, 9, 7, 9, 3, 2, 38], [46]]   # 4 prompts: splits over data=4
N = 6                                                                  # max_new_tokens everywhere
W = 7 + N                                                              # full-forward reference width


@functools.lru_cache(maxsize=None)
def _model(name):
  """Shared perturbed test models (every parameter moved off its init by N(0, 0.2)); do not modify."""
  model = Transformer(CONFIGS[name], rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  nnx.update(model, jax.tree.unflatten(treedef, [x + 0.2 * jax.random.normal(k, x.shape) for x, k in
                                                 zip(leaves, keys)]))
  return model


@functools.partial(jax.jit, static_argnums=0)
def _full(graphdef, state, tokens_bw):
  return nnx.merge(graphdef, state)(tokens_bw)


def _full_logits(model, rows):
  """Full-forward logits of each row (any lengths <= W), right-padded to width W: (len(rows), W, V)."""
  buf = np.zeros((len(rows), W), np.int32)
  for b, r in enumerate(rows):
    buf[b, :len(r)] = r
  return np.asarray(_full(*nnx.split(model), jnp.asarray(buf)))


@functools.lru_cache(maxsize=None)
def _greedy(name):
  return generate(_model(name), PROMPTS, N)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_cached_decoding_equals_full_forward_with_left_padding(name):
  """Left-padded prefill, then a 2-token chunk, then single tokens: logits == unpadded full forward."""
  model = _model(name)
  gd, st = nnx.split(model)
  cont = np.asarray(jax.random.randint(jax.random.key(1), (len(PROMPTS), 4), 0, V))
  full = _full_logits(model, [p + list(c) for p, c in zip(PROMPTS, cont)])
  lens = np.array([len(p) for p in PROMPTS])
  width = lens.max()
  start = width - lens
  left = np.zeros((len(PROMPTS), width), np.int32)
  for b, p in enumerate(PROMPTS):
    left[b, start[b]:] = p
  slots = np.arange(width)[None]
  seg = (slots >= start[:, None]).astype(np.int32)
  pos = np.maximum(slots - start[:, None], 0)

  @functools.partial(jax.jit, static_argnums=0)
  def call(gd, st, tok, pos, seg, cache, idx):
    return nnx.merge(gd, st)(tok, pos, segment_ids_bl=seg, cache=cache, cache_index=idx)

  cache = model.init_cache(len(PROMPTS), width + 4)
  c = model.config
  assert cache.k.shape == (2, 4, width + 4, c.n_kv_heads, 8) and cache.segment_ids.shape == (4, width + 4)
  logits, cache = call(gd, st, left, pos, seg, cache, 0)
  for b in range(len(PROMPTS)):
    np.testing.assert_allclose(logits[b, start[b]:], full[b, :lens[b]], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.segment_ids[:, :width]), seg)
  ones = lambda n: np.ones((len(PROMPTS), n), np.int32)
  logits, cache = call(gd, st, cont[:, :2], lens[:, None] + np.arange(2), ones(2), cache, width)
  for b in range(len(PROMPTS)):
    np.testing.assert_allclose(logits[b], full[b, lens[b]:lens[b] + 2], rtol=1e-5, atol=1e-5)
  for i in (2, 3):
    logits, cache = call(gd, st, cont[:, i:i + 1], lens[:, None] + i, ones(1), cache, width + i)
    for b in range(len(PROMPTS)):
      np.testing.assert_allclose(logits[b, 0], full[b, lens[b] + i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_greedy_equals_argmax_of_repeated_full_forwards(name):
  model = _model(name)
  out = _greedy(name)
  assert out.tokens.shape == (4, N) and out.tokens.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(out.lengths), [N] * 4)
  assert not np.asarray(out.stopped).any()
  rows = [list(p) for p in PROMPTS]
  want_lp = np.zeros((4, N))
  for i in range(N):
    logits = _full_logits(model, rows)
    for b, r in enumerate(rows):
      lg = logits[b, len(r) - 1]
      want_lp[b, i] = lg[np.argmax(lg)] - np.log(np.exp(lg - lg.max()).sum()) - lg.max()
      r.append(int(np.argmax(lg)))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.array([r[-N:] for r in rows]))
  np.testing.assert_allclose(np.asarray(out.logprobs), want_lp, rtol=1e-5, atol=1e-5)
  # The same prompts as a right-padded array + lengths give the same result.
  arr = np.full((4, 7), 63, np.int32)
  for b, p in enumerate(PROMPTS):
    arr[b, :len(p)] = p
  again = generate(model, arr, N, prompt_lengths=[len(p) for p in PROMPTS])
  np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))


def test_top_k_one_and_tiny_top_p_equal_greedy_and_sampling_respects_top_k():
  model = _model("llama")
  greedy = np.asarray(_greedy("llama").tokens)
  k = jax.random.key(3)
  np.testing.assert_array_equal(np.asarray(generate(model, PROMPTS, N, temperature=1.0, top_k=1, key=k).tokens), greedy)
  np.testing.assert_array_equal(
      np.asarray(generate(model, PROMPTS, N, temperature=1.0, top_p=1e-6, key=k).tokens), greedy)
  a = generate(model, PROMPTS, N, temperature=1.5, top_k=3, key=k)
  b = generate(model, PROMPTS, N, temperature=1.5, top_k=3, key=k)
  c = generate(model, PROMPTS, N, temperature=1.5, top_k=3, key=jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
  assert (np.asarray(a.tokens) != greedy).any()
  rows = [list(p) + list(np.asarray(a.tokens[i])) for i, p in enumerate(PROMPTS)]
  logits = _full_logits(model, rows)
  for bi, p in enumerate(PROMPTS):
    for i in range(N):
      lg = logits[bi, len(p) - 1 + i]
      assert rows[bi][len(p) + i] in np.argsort(-lg)[:3]
      lp = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
      np.testing.assert_allclose(float(a.logprobs[bi, i]), lp[rows[bi][len(p) + i]], rtol=1e-5, atol=1e-5)


def test_filter_logits_matches_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 20)).astype(np.float32)
  for top_k, top_p in ((5, None), (0, 0.5), (4, 0.9), (0, 1e-9)):
    got = np.asarray(filter_logits(jnp.asarray(x), top_k=top_k, top_p=top_p))
    for b in range(3):
      keep = np.ones(20, bool)
      if top_k:
        keep &= x[b] >= np.sort(x[b])[-top_k]
      if top_p is not None:
        z = np.where(keep, x[b], -np.inf)
        order = np.argsort(-z)
        p = np.exp(z[order] - z[order][0])
        p /= p.sum()
        n = max(1, int(np.searchsorted(np.cumsum(p), top_p) + 1))   # smallest prefix reaching top_p
        kept = np.zeros(20, bool)
        kept[order[:n]] = True
        keep &= kept
      np.testing.assert_array_equal(np.isfinite(got[b]), keep, err_msg=f"top_k={top_k} top_p={top_p}")
      np.testing.assert_array_equal(got[b][keep], x[b][keep])


def test_stop_tokens_lengths_and_padding():
  greedy = np.asarray(_greedy("llama").tokens)
  stop = (int(greedy[0, 2]), int(greedy[2, 0]))
  out = generate(_model("llama"), PROMPTS, N, stop_tokens=stop, pad_id=-1)
  for b in range(4):
    hits = [j for j in range(N) if greedy[b, j] in stop]
    n = hits[0] + 1 if hits else N
    assert int(out.lengths[b]) == n and bool(out.stopped[b]) == bool(hits)
    np.testing.assert_array_equal(np.asarray(out.tokens[b, :n]), greedy[b, :n])
    assert (np.asarray(out.tokens[b, n:]) == -1).all() and (np.asarray(out.logprobs[b, n:]) == 0).all()
  assert int(out.lengths[2]) == 1 and int(out.lengths[0]) <= 3


def test_bad_inputs_are_clear_errors():
  model = _model("llama")
  with pytest.raises(ValueError, match=r"\(7 tokens\) \+ max_new_tokens \(6\) = 13 exceeds the KV cache "
                     r"\(max_len=10\)"):
    generate(model, PROMPTS, N, max_len=10)
  with pytest.raises(ValueError, match="= 27 exceeds the model's max_position=24"):
    generate(model, PROMPTS, 20)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    generate(model, [[1], []], 2)
  with pytest.raises(ValueError, match="needs key="):
    generate(model, PROMPTS, 2, temperature=0.7)


def test_sharded_generate_equals_single_device():
  """Mesh in context: batch over "data" (4), parameters by the default rules (heads / mlp / vocab over
  "model" (2)); a batch that does not divide is padded (greedy and sampled rows unchanged)."""
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  model = _model("llama")
  sample = dict(temperature=0.9, top_k=8, key=jax.random.key(4))
  single = generate(model, PROMPTS[:3], N, **sample)
  with mesh_lib.use(mesh, mesh_lib.RULES["tensor_parallel"]):
    out = generate(model, PROMPTS, N)
    odd = generate(model, PROMPTS[:3], N, **sample)
  assert out.tokens.sharding.spec[0] == "data"
  ref = _greedy("llama")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), rtol=1e-5, atol=1e-5)
  assert odd.tokens.shape == (3, N) and odd.lengths.shape == (3,)
  np.testing.assert_array_equal(np.asarray(odd.tokens), np.asarray(single.tokens))
  np.testing.assert_allclose(np.asarray(odd.logprobs), np.asarray(single.logprobs), rtol=1e-5, atol=1e-5)
