"""SLOT-Align experiment: end to end (short), resume, sharded == single device, SIGTERM, transport, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError, DataError

# A small, fast version of the tiny variant: fewer samples and local steps, two taus (2 x 2 = 4 stages).
SHORT = {"data.train_per_class": 40, "data.test_per_class": 20, "method.taus": (0.0, 1.0), "head.steps": 40}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("slot_align", tmp_path, SHORT)
  for key in ("acc/a0.1/t0", "acc/a0.1/t1", "acc/a0/t0", "acc/a0/t1"):
    assert 0.0 <= s[key] <= 1.0
  assert s["map/max_rel_err"] < 1e-6
  assert s["comm/floats_per_client"] == 1 + 16 + 16 * 16
  assert s["gain/a0/t1"] == pytest.approx(s["acc/a0/t1"] - s["acc/a0/t0"])
  assert s["stages"] == ["a0.1/t0", "a0.1/t1", "a0/t0", "a0/t1"]   # alpha-major
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["stage"] for r in rows] == s["stages"] and rows[3]["eval/macro_acc"] == s["acc/a0/t1"]


def test_resume(tmp_path):
  check_resume("slot_align", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # Clients are stacked on a leading axis sharded over "data" (4 clients on 4 devices vs 1 device).
  check_sharded_equals_single("slot_align", tmp_path, {**SHORT, "method.alphas": (0.1,)})


def test_sigterm_inside_and_between_stages_resumes(tmp_path):
  # SIGTERM inside stage 1 (a0.1/t1), then between stages 2 and 3; the resumed runs recompute alpha 0's maps
  check_sigterm_resume("slot_align", tmp_path, SHORT, inside=1)


def test_experiment_clients_send_only_statistics():
  exp = registry.load("slot_align")
  from jaxlab.experiments.slot_align import method
  c = exp.get_config("tiny", {"data.train_per_class": 20, "data.test_per_class": 5})
  data = method.load_domains(c)
  mask = method.client_masks(c, data, 0)
  channel, _, _ = method.communicate(c, data["train_x"], mask)
  d = data["train_x"].shape[-1]
  assert [k for k, _ in channel.log] == [0, 1, 2, 3]
  assert channel.floats_sent == 4 * (1 + d + d * d)
  assert all(m["n"] == mask[k].sum() for k, m in channel.log)


def test_pca_option_sends_reduced_statistics():
  exp = registry.load("slot_align")
  from jaxlab.experiments.slot_align import method
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"data.train_per_class": 20, "data.test_per_class": 5, "method.pca": True,
                              "method.pca_var": 0.8})
  data = method.load_domains(c)
  mask = method.client_masks(c, data, 0)
  channel, center, basis = method.communicate(c, data["train_x"], mask)
  r = basis.shape[1]
  assert 1 <= r < 16 and center.shape == (16,)
  np.testing.assert_allclose(basis.T @ basis, np.eye(r), atol=1e-10)
  assert channel.floats_sent == 4 * (1 + r + r * r)
  _, em, ec = method.align(c, channel)
  assert max(em, ec) < 1e-8


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("slot_align")
  cases = [({"method.taus": (0.0, 1.5)}, "must be in \\[0, 1\\]"),
           ({"method.alphas": (-0.1,)}, ">= 0"),
           ({"method.taus": (0.0, 0.5, 0.5)}, "method.taus=.* repeats a value"),
           ({"head.epochs": 3}, "exactly one of"),
           ({"num_steps": 4}, "unknown config key 'num_steps'")]
  for over, msg in cases:
    with pytest.raises(ConfigError, match=msg):
      exp.get_config("tiny", over)
  with pytest.raises(ConfigError, match="exactly one of"):   # a finalized config is validated again when changed
    configs.apply_overrides(exp.get_config("tiny"), {"head.epochs": 3})
  # the full variant builds without its feature file (a valid config); the run asks for it before any work
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(exp.get_config("full"), str(tmp_path / "nopath"))
  assert not (tmp_path / "nopath").exists()
  c = exp.get_config("full", {"data.path": str(tmp_path / "nope.npz")})
  with pytest.raises(DataError, match="not found"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "full"))


def test_variants_build_and_full_reads_feature_files(tmp_path):
  exp = registry.load("slot_align")
  for v in ("tiny", "small", "full"):
    c = exp.get_config(v)
    assert "train" not in c      # no gradient-training section: the heads are configured in config.head
  # the stages follow the grid: changing the taus alone is a valid config
  c = exp.get_config("tiny", {"method.taus": (0.0, 0.5, 1.0)})
  assert [exp.config_module.stage_name(a, t) for a in c.method.alphas for t in c.method.taus][1:3] == [
      "a0.1/t0.5", "a0.1/t1"]
  assert exp.get_config("full").data.dataset == "office_home"
  assert len(exp.config_module.sweep()) == 12
  # The full variant's loader on a fake 3-class feature file (4 Office-Home domain names).
  # Features are written by extract.py's frozen-encoder pass (here a fixed random projection of fake images).
  from jaxlab.experiments.slot_align import extract, method
  rng = np.random.default_rng(0)
  proj = rng.normal(size=(4 * 4 * 3, 6)).astype(np.float32)
  sources = {dom: (rng.integers(0, 255, size=(20, 4, 4, 3)).astype(np.uint8), rng.integers(0, 3, size=20))
             for dom in exp.config_module.DATASETS["office_home"][0]}
  arrays = extract.domain_features(sources, lambda im: im.reshape(im.shape[0], -1).astype(np.float32) @ proj, 8)
  ref = sources["Art"][0].reshape(20, -1).astype(np.float32) @ proj
  np.testing.assert_allclose(arrays["Art_x"], ref, rtol=1e-4, atol=1e-2)
  with pytest.raises(ConfigError, match="module:factory"):
    extract.load_encoder("no_colon", "")
  path = str(tmp_path / "oh.npz")
  np.savez(path, **arrays)
  c = exp.get_config("full", {"data.path": path})
  data = method.load_domains(c)
  assert data["train_x"].shape == (4, 14, 6) and data["test_x"].shape == (4, 6, 6)


def test_a_feature_file_of_other_domains_names_the_dataset_to_set(tmp_path):
  from jaxlab.experiments.slot_align import method
  exp = registry.load("slot_align")
  rng = np.random.default_rng(0)
  arrays = {}
  for dom in exp.config_module.DATASETS["digits"][0]:
    arrays[f"{dom}_x"], arrays[f"{dom}_y"] = rng.normal(size=(10, 4)).astype(np.float32), rng.integers(0, 10, 10)
  np.savez(tmp_path / "digits.npz", **arrays)
  with pytest.raises(DataError, match=r"no array 'Art_x'.*config.data.dataset='office_home' reads the domains "
                                      r".*the file holds the domains of --config.data.dataset=digits"):
    method.load_domains(exp.get_config("full", {"data.path": str(tmp_path / "digits.npz")}))
  np.savez(tmp_path / "mine.npz", a_x=arrays["mnist_x"], a_y=arrays["mnist_y"])
  with pytest.raises(DataError, match=r"name its arrays after one dataset's domains .* or add yours to DATASETS"):
    method.load_domains(exp.get_config("full", {"data.path": str(tmp_path / "mine.npz")}))
