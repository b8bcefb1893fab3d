"""The judge (`jaxlab.evals.judge`), its cache (`jaxlab.cache`), the in-process classifier trainer and chunked
generation (`jaxlab.diffusion.generate`): entropy against scipy, the cache keyed and checked, chunks sharded over
8 devices equal to one device."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from jaxlab import cache, mesh as mesh_lib
from jaxlab.data import synthetic
from jaxlab.diffusion import generate
from jaxlab.errors import DataError
from jaxlab.evals import frechet, judge


def test_entropy_matches_scipy_and_its_bounds():
  rng = np.random.default_rng(0)
  pred = rng.integers(0, 10, 500)
  want = scipy.stats.entropy(np.bincount(pred, minlength=10))
  assert judge.entropy(pred, 10) == pytest.approx(want, rel=1e-12)
  assert judge.entropy(np.arange(1000) % 10, 10) == pytest.approx(np.log(10))
  assert judge.entropy(np.full(7, 3), 10) == 0.0


def test_judge_trains_caches_and_scores(tmp_path):
  tr = synthetic.digits("train", value_range=(-1, 1))
  te = synthetic.digits("test", value_range=(-1, 1))
  c = judge.JudgeConfig(in_features=64, num_classes=10, steps=400)
  spec = {"name": "digits", "split": 0}
  a, cached_a, file = judge.load_or_train(c, tr["image"], tr["label"], name="j", data_spec=spec,
                                          cache_dir=str(tmp_path))
  b, cached_b, _ = judge.load_or_train(c, tr["image"], tr["label"], name="j", data_spec=spec,
                                       cache_dir=str(tmp_path))
  assert (cached_a, cached_b) == (False, True) and os.path.dirname(file) == str(tmp_path / "judges")
  assert [f for f in os.listdir(tmp_path / "judges")] == [os.path.basename(file)]     # no temporary file left
  x = te["image"][:64]
  np.testing.assert_array_equal(np.asarray(judge.features(a, x)), np.asarray(judge.features(b, x)))
  s = judge.score(a, te["image"], tr["image"], batch=100)                             # chunked == one pass
  f_gen, f_ref = np.asarray(judge.features(a, te["image"])), np.asarray(judge.features(a, tr["image"]))
  assert s["fd"] == pytest.approx(frechet.frechet_from_features(f_gen, f_ref), rel=1e-9)
  assert np.mean(s["pred"] == te["label"]) > 0.85 and s["entropy"] > 0.95 * np.log(10) and 0 < s["confidence"] <= 1
  other = judge.JudgeConfig(in_features=64, num_classes=10, steps=401)                 # keyed by the settings
  assert judge.load_or_train(other, tr["image"][:50], tr["label"][:50], name="j", data_spec=spec,
                             cache_dir=str(tmp_path))[1] is False
  np.savez(file, junk=np.zeros(2))
  with pytest.raises(DataError, match="does not match the current settings"):
    judge.load_or_train(c, tr["image"], tr["label"], name="j", data_spec=spec, cache_dir=str(tmp_path))


def test_cache_root_and_digest(monkeypatch, tmp_path):
  monkeypatch.setenv("JAXLAB_CACHE_DIR", str(tmp_path))
  assert cache.path("judges", "x.npz") == os.path.join(str(tmp_path), "judges", "x.npz")
  assert cache.path("judges", "x.npz", "/elsewhere") == "/elsewhere/judges/x.npz"
  assert cache.digest({"a": 1, "b": [1, 2]}) == cache.digest({"b": [1, 2], "a": 1}) != cache.digest({"a": 2})


def test_chunks_sharded_equal_one_device_and_drop_the_padding():
  labels = np.arange(37) % 10

  def sampler(noise, y):
    return noise["x"] * 2.0 + y[:, None].astype(jnp.float32)

  def noise_fn(k, n):
    return {"x": jax.random.normal(k, (n, 3))}
  key = jax.random.key(3)
  out = {}
  for name, shape in (("sharded", (("data", 8), ("model", 1))), ("single", (("data", 1), ("model", 1)))):
    mesh = mesh_lib.make_mesh(shape, devices=jax.devices()[:shape[0][1]])
    with mesh_lib.use(mesh, mesh_lib.RULES["data_parallel"]):
      fn = jax.jit(sampler)
      got = list(generate.chunks(fn, noise_fn, labels, key, mesh, batch_size=16))
    assert [s for s, _ in got] == [0, 16, 32] and sum(len(x) for _, x in got) == 37
    out[name] = np.concatenate([x for _, x in got])
  np.testing.assert_allclose(out["sharded"], out["single"], rtol=1e-6)
  assert generate.chunk_size(10, mesh_lib.make_mesh((("data", 8), ("model", 1)))) == 16
