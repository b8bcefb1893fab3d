"""The text-to-spectrogram model and attention controllers: shapes and errors, the no-op controller bit-identical,
per-layer / per-step hook calls, P2P injection against a hand-built expectation, edit-friendly inversion exact
with a random untrained model (output layers perturbed off their zero init), the log-mel features and the timbre
classifier on rendered clips."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.audio import features, model as model_lib, synth, timbre
from jaxlab.diffusion import controllers as ctl
from jaxlab.diffusion import ddpm
from jaxlab.errors import ConfigError, DataError

CFG = model_lib.SpecConfig(freq=16, frames=16, patch=4, vocab=5, max_tokens=2, hidden=32, depth=2, heads=2,
                           bottleneck=16, freq_dim=32, num_train_steps=100)


@functools.lru_cache(maxsize=None)
def _random_split(seed):
  model = model_lib.TextToSpec(CFG, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param)
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  leaves = [jnp.where(x == 0, 0.05 * jax.random.normal(k, x.shape), x) for x, k in zip(leaves, keys)]
  nnx.update(model, jax.tree.unflatten(tree, leaves))
  model.tokens.embedding.value = jax.random.normal(jax.random.key(seed + 2), model.tokens.embedding.value.shape)
  return nnx.split(model)


def random_model(seed=0):
  """An untrained model whose zero-initialised layers are filled with noise (so it is not the zero map).

  A fresh module each call over the same (immutable) arrays: the eager initialisation, about a hundred small
  compiled programs, runs once per process, not once per test."""
  return nnx.merge(*_random_split(seed))


def batch(n=4, seed=0):
  x = jax.random.normal(jax.random.key(seed), (n, CFG.freq, CFG.frames))
  tokens = jnp.asarray(model_lib.encode_prompts([[i % 4] + ([4] if i % 2 else []) for i in range(n)], CFG))
  return x, tokens


def test_shapes_prompts_and_errors():
  m = random_model()
  x, tokens = batch()
  assert m(x, jnp.zeros((4,), jnp.int32), tokens).shape == x.shape
  np.testing.assert_array_equal(model_lib.encode_prompts([[1], []], CFG), [[1, -1], [5, -1]])
  with pytest.raises(DataError, match="at most 2 ids"):
    model_lib.encode_prompts([[0, 1, 2]], CFG)
  with pytest.raises(DataError, match="spectrograms"):
    m(x[:, :8], jnp.zeros((4,), jnp.int32), tokens)
  with pytest.raises(ConfigError, match="multiples of patch"):
    model_lib.SpecConfig(freq=18)
  # Abstract parameters (no initialisation compiled): the controller check comes before any parameter is read.
  scanned = nnx.eval_shape(lambda: model_lib.TextToSpec(model_lib.SpecConfig(
      freq=16, frames=16, hidden=32, depth=2, heads=2, scan_layers=True), rngs=nnx.Rngs(0)))
  with pytest.raises(ConfigError, match="scan_layers=False"):
    scanned(x, jnp.zeros((4,), jnp.int32), tokens, controller=ctl.identity)
  dropped = model_lib.drop_prompts(jax.random.key(0), jnp.tile(tokens, (50, 1)), 0.5, CFG)
  null = np.all(np.asarray(dropped) == [5, -1], axis=1)
  assert 0.3 < null.mean() < 0.7


def test_no_op_controller_is_bit_identical_and_sees_every_layer():
  m = random_model()
  x, tokens = batch()
  t = jnp.asarray([3, 10, 50, 99])
  plain = jax.jit(lambda x: m(x, t, tokens))(x)
  assert np.array_equal(np.asarray(plain), np.asarray(jax.jit(lambda x: m(x, t, tokens, controller=ctl.identity))(x)))
  seen = []

  def spy(logits, layer, step, ctx):
    seen.append((layer, logits.shape, ctx["tag"]))
    np.testing.assert_array_equal(step, t)
    return logits
  m(x, t, tokens, controller=spy, ctx={"tag": "x"})
  assert seen == [(i, (4, CFG.heads, 16, 2), "x") for i in range(CFG.depth)]
  # A controller that changes the logits changes the output; a bad shape is refused.
  flat = m(x, t, tokens, controller=lambda lg, *_: lg.at[..., 0].add(10.0))
  assert float(jnp.max(jnp.abs(flat - plain))) > 1e-4
  with pytest.raises(ConfigError, match="must keep"):
    m(x, t, tokens, controller=lambda lg, *_: lg[..., :1])



def test_self_attention_controller_sees_every_block_and_the_identity_keeps_the_output():
  """`self_controller` gets each block's self-attention logits (B, heads, L, L) with the block index and ctx; the
  identity reproduces the fused attention (to float rounding: the logits are made explicit)."""
  m = random_model()
  x, tokens = batch()
  t = jnp.asarray([3, 10, 50, 99])
  plain = jax.jit(lambda x: m(x, t, tokens))(x)
  seen = []

  def spy(logits, layer, step, ctx):
    seen.append((layer, logits.shape, ctx["tag"]))
    return logits
  same = m(x, t, tokens, self_controller=spy, ctx={"tag": "s"})
  assert seen == [(i, (4, CFG.heads, 16, 16), "s") for i in range(CFG.depth)]
  np.testing.assert_allclose(np.asarray(same), np.asarray(plain), rtol=1e-5, atol=1e-5)
  own = m(x, t, tokens, self_controller=lambda lg, *_: lg + 1e9 * jnp.eye(lg.shape[-1]))
  assert float(jnp.max(jnp.abs(own - plain))) > 1e-4

def test_inject_source_copies_the_chosen_columns():
  logits = jax.random.normal(jax.random.key(0), (4, 2, 3, 3))
  step = jnp.asarray([10, 10, 10, 60])
  out = ctl.inject_source([1], layers=[0], t_range=(0, 50))(logits, 0, step, {})
  want = np.asarray(logits).copy()
  want[2, :, :, 1] = want[0, :, :, 1]          # target example 0 (step 10, in range): column 1 from the source
  np.testing.assert_array_equal(out, want)     # target example 1 (step 60): untouched; sources untouched
  assert ctl.inject_source([1], layers=[1])(logits, 0, step, {}) is logits
  every = ctl.inject_source([0, 1, 2])(logits, 0, step, {})
  np.testing.assert_array_equal(every[2:], logits[:2])
  with pytest.raises(ConfigError, match="source; target"):
    ctl.inject_source([0])(logits[:3], 0, step[:3], {})
  assert ctl.compose(ctl.identity, ctl.identity)(logits, 0, step, {}) is logits
  # In the model: with every column injected, the target half's logits (hence attention maps) equal the
  # source's in every layer, while the values still come from the target prompt (so the outputs differ).
  m = random_model()
  x, tokens = batch(2)
  xx = jnp.concatenate([x[:1], x[:1]])
  seen = []

  def spy(lg, layer, step, ctx):
    seen.append(np.asarray(lg))
    return lg
  prompts = jnp.concatenate([tokens[:1], tokens[1:]])
  out = m(xx, jnp.full((2,), 7), prompts, controller=ctl.compose(ctl.inject_source([0, 1]), spy))
  assert len(seen) == CFG.depth
  for lg in seen:
    np.testing.assert_array_equal(lg[1], lg[0])
  assert float(jnp.max(jnp.abs(out[1] - out[0]))) > 1e-4


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_edit_friendly_inversion_with_a_random_model(scale):
  m = random_model()
  x, tokens = batch()
  s = ddpm.Schedule(num_train_steps=100, prediction="v")
  fn = model_lib.guided_denoiser(m, tokens, scale)
  xs, zs = ddpm.edit_friendly_inversion(fn, s, x, jax.random.key(1), num_steps=20, start=12)
  np.testing.assert_allclose(ddpm.reverse(fn, s, xs, num_steps=20, start=12, zs=zs), x, atol=1e-5)
  # The target prompt with the same noise maps gives a different (edited) output.
  other = model_lib.guided_denoiser(m, jnp.roll(tokens, 1, axis=0), scale)
  assert float(jnp.max(jnp.abs(ddpm.reverse(other, s, xs, num_steps=20, start=12, zs=zs) - x))) > 1e-3


def test_token_map_order():
  m = jnp.zeros((1, CFG.freq, CFG.frames)).at[0, 4:8, 12:16].set(1.0)     # band row 1, frame column 3
  tm = np.asarray(model_lib.token_map(m, CFG))[0]
  assert tm[1 * 4 + 3] == 1.0 and tm.sum() == 1.0


def test_logmel_and_timbre_classifier():
  f = features.LogMel()
  mix, _, specs = synth.batch_render(0, 400, num_pitched=1, drums_prob=0.5)
  x = f.batched(mix)
  assert x.shape == (400, 32, 32) and np.isfinite(x).all()
  assert np.all(np.diff(f.centres_hz) > 0) and 60 < f.centres_hz[0] < f.centres_hz[-1] < 4000
  y = np.asarray([synth.PITCHED.index(s[0].instrument) for s in specs])
  clf = timbre.TimbreClassifier(synth.PITCHED, f.centres_hz).fit(x[:300], y[:300])
  assert clf.accuracy(x[300:], y[300:]) >= 0.95
  # A clarinet's even harmonics are weak, a violin's are not: the 2nd-harmonic feature tells them apart.
  feats = timbre.harmonic_features(x, f.centres_hz)
  h2 = feats[:, 0]
  assert np.median(h2[y == 1]) < np.median(h2[y == 2]) - 1.0
  with pytest.raises(DataError, match="len\\(centres_hz\\)"):
    timbre.harmonic_features(x, f.centres_hz[:-1])
  with pytest.raises(DataError, match="samples"):
    f(mix[:, :100])
  wave = f.to_audio(jnp.asarray(x[:2]), n_iter=8)
  assert wave.shape == (2, f.samples) and np.isfinite(np.asarray(wave)).all()
