"""polyphonia experiment: end to end (short) + resume, the task grid against the synthesiser's ground truth,
the negative controls' priors, config errors and variants; behind the slow marker: the multitrack (full-scale)
path on a tiny fake MUSDB18-HQ folder with oracle priors, SIGTERM resume."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from scipy.io import wavfile

from experiment_checks import _run, _strip, canary_covered, check_end_to_end, check_sigterm_resume
from jaxlab import registry
from jaxlab.audio import synth
from jaxlab.errors import ConfigError

NAME = "polyphonia"
ONE_DEVICE = {"mesh": (("data", 1), ("model", 1))}


def short(**extra):
  """A small version of the tiny variant: width 32, 2 blocks, 16 training steps, 4 clips (12 tasks), 10 steps."""
  return {"model.hidden": 32, "model.depth": 2, "model.heads": 2, "model.bottleneck": 16, "model.freq_dim": 32,
          "data.num_train": 300, "data.num_held": 100, "train.num_steps": 16, "train.optimizer.warmup_steps": 4,
          "train.checkpoint_every": 8, "train.log_every": 8, "train.batch_size": 16, "tasks.num_clips": 4,
          "edit.steps": 10, "edit.start": 6, "edit.batch_size": 8, "edit.wavs": 1, **extra}


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(**ONE_DEVICE))
  assert s["stages"] == ["classifier", "train", "tasks", "edit"]
  assert s["tasks/num"] == 12 and s["acc/held_real"] >= 0.9 and s["acc/truth"] >= 0.75
  exp = registry.load(NAME)
  method = exp.train_module.method
  assert all(f"acc/{a}" not in s for a in method.NEGATIVES)       # v1's controls: not under the official layout
  for a in method.MAIN_ARMS + method.ABLATIONS:
    for m in ("lsd_nontarget", "lsd_nontarget_truth", "acc", "lsd_truth"):
      assert np.isfinite(s[f"{m}/{a}"]) and s[f"{m}/{a}"] >= 0, (m, a)
  for c in exp.config_module.CLAIMS:       # every claim's statistic is computable from the summaries
    r = c.check([s, s])
    assert r["measured"] is not None and np.isfinite(r["measured"]), (c.name, r.get("error"))
  lines = (wd / "stages" / "tasks" / "tasks.jsonl").read_text().splitlines()
  assert len(lines) == 12 and json.loads(lines[0])["target_prompt"][1] == "drums"
  assert len(os.listdir(wd / "stages" / "edit" / "wav")) == 2 + len(exp.train_module.method.MAIN_ARMS)
  ckpt = wd / "stages" / "train" / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  assert _strip(_run(NAME, wd, short(**ONE_DEVICE))) == _strip(s)


def test_task_grid_has_the_ground_truth_edit():
  exp = registry.load(NAME)
  method = exp.train_module.method
  c = exp.get_config("tiny", {"tasks.num_clips": 3})
  tasks = method.make_tasks(c, 0)
  assert len(tasks) == 9
  for i in range(3):          # every clip edited to the three other pitched instruments
    sel = tasks.clip == i
    assert sorted(tasks.tgt_label[sel].tolist() + [tasks.src_label[sel][0]]) == [0, 1, 2, 3]
  f = method.logmel(c)
  stems = synth.sample_clip(int(tasks.seeds[0]), num_pitched=1, drums_prob=1.0, sr=f.sr, duration=f.clip_seconds,
                            max_notes=int(c.data.max_notes))
  truth, _ = synth.render_mixture(synth.edit_clip(stems, 0, method.PITCHED[tasks.tgt_label[0]]), sr=f.sr,
                                  duration=f.clip_seconds)
  np.testing.assert_allclose(tasks.truth[0], np.asarray(f(truth)), atol=1e-5)
  assert np.all((tasks.irm >= 0) & (tasks.irm <= 1)) and np.mean(tasks.irm > 0.5) > 0.05
  assert np.array_equal(tasks.src_tokens[:, 1], np.full(9, method.DRUMS))
  assert np.array_equal(tasks.tgt_tokens[:, 0], tasks.tgt_label)


def test_negative_control_priors():
  exp = registry.load(NAME)
  method = exp.train_module.method
  cfg = method.sd.spec_config(exp.get_config("tiny"))
  m = np.random.default_rng(0).uniform(size=(2, cfg.freq, cfg.frames)).astype(np.float32)
  right = method.token_prior(m, cfg, "polyphonia")
  np.testing.assert_allclose(method.token_prior(m, cfg, "neg_one_minus"), 1.0 - right, atol=1e-6)
  gh, gw = cfg.grid
  swapped = method.token_prior(m, cfg, "neg_transposed")
  np.testing.assert_allclose(swapped.reshape(2, gw, gh), right.reshape(2, gh, gw).transpose(0, 2, 1))
  assert not np.allclose(swapped, right)


def test_official_layout_priors_and_blocks():
  """Every stem phrase gets its own prior on the token grid (position 0 the edited stem's, 1 the drums'); the
  self-attention prior is the edited stem's; the calibrated blocks are the first half (the down blocks)."""
  exp = registry.load(NAME)
  method = exp.train_module.method
  c = exp.get_config("tiny")
  cfg = method.sd.spec_config(c)
  rng = np.random.default_rng(1)
  raw = rng.uniform(size=(3, cfg.freq, cfg.frames)).astype(np.float32)
  prior = {"imperfect": raw ** 0.5, "imperfect_drums": (1 - raw) ** 0.5}
  self_prior, per = method.stem_token_priors(prior, "imperfect", cfg, raw.shape)
  assert per.shape == (3, cfg.max_tokens, cfg.grid[0] * cfg.grid[1])
  np.testing.assert_allclose(per[:, 0], method.token_prior(prior["imperfect"], cfg, "polyphonia"), atol=1e-6)
  np.testing.assert_allclose(per[:, 1], method.token_prior(prior["imperfect_drums"], cfg, "polyphonia"), atol=1e-6)
  np.testing.assert_array_equal(self_prior, per[:, 0])
  ones = method.stem_token_priors(prior, "ones", cfg, raw.shape)[1]
  assert np.all(ones == 1.0)
  assert method.down_blocks(c) == (0, 1)
  assert method.down_blocks(exp.get_config("tiny", {"calibration.blocks": "all"})) is None
  assert method.down_blocks(exp.get_config("tiny", {"calibration.layers": (3,)})) == (3,)
  cross, self_c, which = method._controller(c, "gamma0", cfg.max_tokens)
  assert cross is None and self_c is not None and which == "imperfect"
  t = method.make_tasks(exp.get_config("tiny", {"tasks.num_clips": 2}), 0)
  p = method.priors(c, t, jax.random.key(0))
  np.testing.assert_allclose(p["oracle"] ** 2 + p["oracle_drums"] ** 2, 1.0, atol=1e-5)   # the two stems' shares


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"model.pooled": True}, "pooled=False"),
                      ({"model.scan_layers": True}, "unrolled"),
                      ({"edit.start": 60}, "must be in \\[1, steps"),
                      ({"edit.inversion": "edit_friendly", "edit.eta": 0.0}, "needs eta > 0"),
                      ({"edit.inversion": "ddpm"}, "use one of ddim_null, edit_friendly"),
                      ({"diffusion.prompt_drop": 0.0, "edit.inversion": "ddim_null", "edit.cfg_tar": 1.0},
                       "empty prompt"),
                      ({"edit.sdedit_frac": 0.0}, "sdedit_frac"),
                      ({"calibration.layout": "paper"}, "layout='paper'"),
                      ({"calibration.blocks": "up"}, "down \\| all"),
                      ({"calibration.layers": (7,)}, "not in \\[0, model.depth"),
                      ({"calibration.eps": 0.0}, "eps > 0"),
                      ({"calibration.modulation": "exp"}, "modulation linear \\| log"),
                      ({"injection.tokens": "stem"}, "must be all \\| others"),
                      ({"separator.exponent": 0.0}, "square root"),
                      ({"data.num_pitched": 2}, "num_pitched=1"),
                      ({"diffusion.prompt_drop": 0.0, "edit.cfg_tar": 1.5, "edit.inversion": "edit_friendly"},
                       "unconditional branch"),
                      ({"data.name": "musdb"}, "use one of")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)


def test_variants_build():
  exp = registry.load(NAME)
  for v in ("tiny", "tiny_v1", "small", "full"):
    c = exp.get_config(v)
    assert c.data.name == ("multitrack" if v == "full" else "synth")
    want = {"tiny_v1": ("v1", "edit_friendly"), "full": ("official", "ddim_null")}.get(v, ("official",
                                                                                          "edit_friendly"))
    assert (c.calibration.layout, c.edit.inversion) == want
  assert exp.train_module.method.arms_of(exp.get_config("tiny_v1")) == exp.train_module.method.ARMS
  with pytest.raises(ConfigError, match="config.data.path"):
    exp.config_module.require_data(exp.get_config("full"))
  with pytest.raises(ConfigError, match="prior="):
    exp.get_config("full", {"data.prior": "open-unmix"})


def _fake_musdb(root, songs=3, seconds=2.5, sr=8000):
  rng = np.random.default_rng(0)
  t = np.arange(int(seconds * sr)) / sr
  for split in ("train", "test"):
    for i in range(songs):
      d = root / split / f"song{i}"
      d.mkdir(parents=True)
      for j, stem in enumerate(("vocals", "drums", "bass", "other")):
        if split == "test" and stem == "other":
          continue                      # a stem to re-prompt the vocals as
        x = 0.2 * np.sin(2 * np.pi * (110 * (j + 1) + 20 * i) * t) if j != 1 else 0.05 * rng.normal(size=t.size)
        wavfile.write(d / f"{stem}.wav", sr, (x * 32767).astype(np.int16))


@pytest.mark.slow   # the full-scale path on a tiny folder (tens of seconds)
def test_multitrack_path_trains_and_edits(tmp_path):
  _fake_musdb(tmp_path / "musdb")
  over = {**short(**ONE_DEVICE), "data.name": "multitrack", "data.path": str(tmp_path / "musdb"),
          "data.hop_seconds": 0.5, "data.prior": "oracle", "tasks.num_clips": 4, "edit.batch_size": 4}
  s = _run(NAME, tmp_path / "run", over)
  assert s["stages"] == ["train", "edit"] and s["data/clips"] > 0 and s["tasks/num"] == 4
  with np.load(tmp_path / "run" / "stages" / "edit" / "edits.npz") as z:
    assert z["polyphonia"].shape == (4, 32, 16) and (z["tgt_tokens"][:, 0] == 3).all()
    assert (z["src_tokens"][:, 0] == 0).all()
  for a in ("prompt_swap", "injection", "sdedit", "polyphonia"):
    assert np.isfinite(s[f"lsd_nontarget/{a}"])


@pytest.mark.slow
def test_sigterm_resume(tmp_path):
  check_sigterm_resume(NAME, tmp_path, short(**ONE_DEVICE))


def test_calibration_picks_the_best_claim_one_bound_among_settings_that_keep_claims_two_and_three():
  from jaxlab.experiments.polyphonia import calibrate
  method = registry.load(NAME).train_module.method
  names = [calibrate.setting_name(s) for s in calibrate.settings()]
  gain = {n: 0.01 * i for i, n in enumerate(names)}             # the last setting has the largest gain ...
  nontarget = {n: 0.0 for n in names}
  nontarget[names[-1]] = 0.5                                     # ... but breaks claim 2 (0.5 / 1.0 > 10%)

  def run(seed_shift):
    r = {}
    for n in names:
      for key, mean in (("acc_gain_best", gain[n] + seed_shift), ("nontarget_vs_swap", nontarget[n]),
                        ("truth_vs_injection", 0.0), ("ones_vs_best", 0.0), ("oracle_vs_imperfect", 0.0)):
        r.update({f"{n}/paired/{key}/n": 216.0, f"{n}/paired/{key}/mean": mean, f"{n}/paired/{key}/m2": 216 * 0.01})
      r.update({f"{n}/lsd_nontarget_truth/prompt_swap": 1.0, f"{n}/lsd_truth/injection": 1.0,
                f"{n}/rel/acc_gain_best": 0.1, f"{n}/paired/best_baseline": 2.0})
      r.update({f"{n}/acc/{a}": 0.5 for a in method.MAIN_ARMS + method.ABLATIONS})
    return r
  text, stats = calibrate.table([run(0.0), run(0.001)])
  assert stats["chosen"] == names[-2] and not stats["settings"][names[-1]]["passes"]["nontarget_vs_swap"]
  assert stats["settings"][names[-2]]["best_baseline"] == ["sdedit", "sdedit"] and f"chosen: {names[-2]}" in text


def test_official_inversion_runs_every_arm():
  """edit.inversion=ddim_null (the full variant's default): DDIM under the empty prompt, then every arm of the
  official layout, on an untrained model (a smoke test of shapes and the source branch's prompt)."""
  from flax import nnx
  exp = registry.load(NAME)
  method = exp.train_module.method
  c = exp.get_config("tiny", short(**{"tasks.num_clips": 1, "edit.inversion": "ddim_null", "edit.cfg_tar": 2.0}))
  tasks = method.make_tasks(c, 0)
  model = method.model_lib.TextToSpec(method.sd.spec_config(c), rngs=nnx.Rngs(0))
  prior = method.priors(c, tasks, jax.random.key(0))
  mean, std = float(tasks.source.mean()), float(tasks.source.std())
  out = method.run_arms(c, model, tasks.source, tasks.src_tokens, tasks.tgt_tokens, prior, jax.random.key(1),
                        mean, std)
  assert set(out) == set(method.MAIN_ARMS + method.ABLATIONS)
  for a, y in out.items():
    assert y.shape == tasks.source.shape and np.all(np.isfinite(y)), a
