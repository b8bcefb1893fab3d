"""SAR experiment: end to end (short) + resume, the checks stage's claims 3-4 on a trained model, the losses,
config errors and variants; behind the slow marker: sharded == single device, SIGTERM resume, the latents
(full-scale) path on a small .npz decoded by a tiny random KL-VAE checkpoint."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiment_checks import (_run, _strip, canary_covered, check_end_to_end, check_sharded_equals_single,
                               check_sigterm_resume)
from jaxlab import configs, registry
from jaxlab.errors import ConfigError, DataError

NAME = "sar"
ONE_DEVICE = {"mesh": (("data", 1), ("model", 1))}


def short(tmp_path, **extra):
  """A small version of the tiny variant: trunk 2 x 32, head 2 x 32, 16 steps, 4 head steps, 40 samples."""
  return {"model.hidden": 32, "model.depth": 2, "model.heads": 2, "model.head_width": 32, "model.head_depth": 2,
          "train.num_steps": 16, "train.optimizer.warmup_steps": 4, "train.checkpoint_every": 8,
          "train.log_every": 8, "train.batch_size": 32, "sample.head_steps": 4, "sample.num": 40,
          "sample.batch_size": 20, "sample.speed_batch": 4, "sample.speed_repeats": 1, "judge.steps": 100,
          "judge.cache_dir": str(tmp_path / "cache"), **extra}


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(tmp_path, **ONE_DEVICE))
  assert s["stages"] == ["judge", "train_sar", "train_regression", "checks", "sample_sar", "sample_regression"]
  for k in ("fd/sar_k1", "fd/sar_k4", "fd/regression", "entropy/sar_k4", "speed/sar_k1",
            "speedup/k4", "fd_floor", "fd_floor_draws/mean", "train/sar/loss_jepa", "train/regression/loss_mse"):
    assert np.isfinite(s[k]) and s[k] >= 0, k
  assert s["steps/sar_k1"] == 64 and s["steps/sar_k4"] == 16           # 32 x 32 MNIST in 4 x 4 patches
  assert s["judge/held_acc"] > 0.5
  assert s["exact/max_abs"] < 1e-5                                   # claim 3 holds for any weights
  assert s["leak/sar"] == 0.0 and min(s["leak/causal"], s["leak/full"], s["leak/mar"]) > 0   # claim 4
  assert s["distinct/regression"] <= 10                              # greedy regression: one image per class
  ckpt = wd / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  assert _strip(_run(NAME, wd, short(tmp_path, **ONE_DEVICE))) == _strip(s)   # the last stage redone, identical


def test_losses(tmp_path):
  from flax import nnx
  exp = registry.load(NAME)
  m = exp.train_module.method
  c = exp.get_config("tiny", short(tmp_path))
  x = jax.random.normal(jax.random.key(0), (8, 16, 4))
  y = jnp.arange(8)

  def loss_of(config, arm, model):       # one compiled program per loss (eager, every op compiles on its own)
    graph, state = nnx.split(model)
    fn = m.make_loss_fn(config, arm)
    return jax.jit(lambda st: fn(nnx.merge(graph, st), {"tokens": x, "label": y}, jax.random.key(1)))(state)

  loss, mets = loss_of(c, "sar", m.make_model_fn(c, "sar", 4, (4, 4))(nnx.Rngs(0)))
  assert float(loss) == pytest.approx(float(mets["loss_flow"]) + c.method.jepa_weight * float(mets["loss_jepa"]),
                                      rel=1e-5)
  loss, mets = loss_of(c, "regression", m.make_model_fn(c, "regression", 4, (4, 4))(nnx.Rngs(0)))
  assert float(loss) == float(mets["loss_mse"]) > 0
  no_jepa = exp.get_config("tiny", short(tmp_path, **{"method.jepa_weight": 0.0}))
  sar0 = m.make_model_fn(no_jepa, "sar", 4, (4, 4))(nnx.Rngs(0))
  assert sar0.net.teacher is None
  assert set(loss_of(no_jepa, "sar", sar0)[1]) == {"loss_flow"}


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"method.arms": ("sar", "mar")}, "name each of"),
                      ({"data.name": "digits", "tokens.patch": 3}, "must divide the digits' 8 pixels"),
                      ({"tokens.patch": 3}, "must divide the padded MNIST side"),
                      ({"data.pad_to": 30, "tokens.patch": 4}, "must divide the padded MNIST side"),
                      ({"data.pad_to": 27}, "use 28 or a larger even side"),
                      ({"sample.tokens_per_step": (0, 4)}, "must be positive"),
                      ({"sample.cfg": 2.0, "method.label_drop": 0.0}, "needs an unconditional branch"),
                      ({"method.teacher_decay": 1.0}, "must be in \\[0, 1\\)"),
                      ({"model.attention": "splash"}, "needs xla or chunked"),
                      ({"data.name": "imagenet"}, "use one of")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)


def test_variants_build():
  exp = registry.load(NAME)
  for v, data in (("tiny", "mnist"), ("tiny_v1", "digits"), ("small", "mnist"), ("full", "latents")):
    assert exp.get_config(v).data.name == data, v
  full = exp.get_config("full")
  with pytest.raises(ConfigError, match="config.data.path"):
    exp.config_module.require_data(full)


def test_v2_claims_are_paired_intervals_and_the_speed_claim_needs_an_accelerator():
  import math
  cfg = registry.load(NAME).config_module
  claims = {c.name: c for c in cfg.CLAIMS}
  runs = [{"fd/sar_k4": a, "fd/sar_k1": b, "fd/regression": r, "speedup/k4": 2.4}
          for a, b, r in ((11.0, 10.0, 50.0), (10.5, 10.0, 40.0), (12.0, 10.5, 60.0))]
  ratios = [1.1, 1.05, 12.0 / 10.5]
  m, sd = np.mean(ratios), np.std(ratios, ddof=1)
  from scipy import stats
  assert claims["any_k"].check(runs)["measured"] == pytest.approx(m + stats.t.ppf(0.95, 2) * sd / math.sqrt(3))
  assert claims["vs_regression"].check(runs)["passed"]
  worse = [dict(r, **{"fd/regression": r["fd/sar_k4"] * f}) for r, f in zip(runs, (0.9, 1.5, 1.2))]
  assert not claims["vs_regression"].check(worse)["passed"]       # SAR better on 2 of 3 seeds is not enough
  assert claims["speed"].check(runs, "cpu")["passed"] is None and claims["speed"].check(runs, "gpu")["passed"] is False
  assert len(set(cfg.SEEDS) & (set(cfg.SEEDS_V1) | set(range(100, 106)))) == 0    # v2 seeds never run before


def _latents_npz(path, n=64):
  rng = np.random.default_rng(0)
  np.savez(path, latent=rng.normal(size=(n, 2, 2, 3)).astype(np.float32), label=rng.integers(0, 4, n))


@pytest.mark.slow   # the full-scale path on a tiny .npz and a tiny random VAE (tens of seconds)
def test_latents_path_trains_and_writes_samples_and_decoded_images(tmp_path):
  from flax import nnx
  from safetensors.numpy import save_file
  from jaxlab.ar import kl_vae
  _latents_npz(tmp_path / "lat.npz")
  vae = kl_vae.KLDecoder(kl_vae.KLConfig(ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=3, embed_dim=3,
                                         resolution=4, norm_groups=4), rngs=nnx.Rngs(0))
  save_file(kl_vae.params_to_state_dict(vae), str(tmp_path / "vae.safetensors"))
  over = {**short(tmp_path, **ONE_DEVICE), "data.name": "latents", "data.path": str(tmp_path / "lat.npz"),
          "data.num_classes": 4, "tokens.scale": 0.5, "sample.cfg": 2.0, "sample.tokens_per_step": (1, 2),
          "sample.cosine_steps": 2, "sample.num": 8, "sample.batch_size": 8, "vae.path": str(tmp_path / "vae.safetensors"),
          "vae.ch": 8, "vae.ch_mult": (1, 2), "vae.num_res_blocks": 1, "vae.norm_groups": 4, "vae.batch_size": 4}
  s = _run(NAME, tmp_path / "run", over)
  assert s["stages"] == ["train_sar", "sample_sar"]
  with np.load(s["samples_path/sar_k2"]) as z:
    assert z["latent"].shape == (8, 2, 2, 3) and z["label"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    lat = z["latent"]
  with np.load(s["images_path/sar_k2"]) as z:
    assert z["arr_0"].shape == (8, 4, 4, 3) and z["arr_0"].dtype == np.uint8
    ref = np.clip(np.round((np.asarray(vae(jnp.asarray(lat))) + 1) * 127.5), 0, 255).astype(np.uint8)
    assert np.abs(z["arr_0"].astype(int) - ref.astype(int)).max() <= 1
  with pytest.raises(DataError, match="does not exist"):
    _run(NAME, tmp_path / "run2", {**over, "data.path": str(tmp_path / "nope.npz")})


@pytest.mark.slow
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single(NAME, tmp_path, short(tmp_path, **{"method.arms": ("sar",)}))


@pytest.mark.slow
def test_sigterm_resume(tmp_path):
  check_sigterm_resume(NAME, tmp_path, short(tmp_path, **ONE_DEVICE))
