"""VR-Thinker (staged: anchors, check, cold starts, eval_cold, rft, rft_grpo, grpo, notool_grpo): end to end with
resume, sharded = single device, the claims' paired bootstrap against a brute-force loop, clear config errors."""

import json

import numpy as np
import pytest

from experiment_checks import canary_covered, check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import metrics, registry
from jaxlab.errors import ConfigError

# The experiment's canary (its config.py's CANARY), on a 4x2 mesh of the 8 test devices.
SHORT = {**registry.load("vr_thinker").config_module.CANARY, "mesh": (("data", 4), ("model", 2))}
STAGES = ["anchors", "check", "cold_tool", "cold_notool", "eval_cold", "rft", "rft_grpo", "grpo", "notool_grpo"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  wd = tmp_path_factory.mktemp("vr") / "reference"
  check_resume("vr_thinker", wd, SHORT)
  return wd, check_end_to_end("vr_thinker", wd, SHORT)


@canary_covered
def test_end_to_end_every_arm_and_resume(reference):
  wd, s = reference
  assert s["stages"] == STAGES and s["resumes"] == 1
  assert s["anchor/bayes_no_tool"] == 0.625 and s["anchor/oracle"] == 1.0
  assert s["anchor/oracle_simulated"] == 1.0                    # the scripted oracle through the real env
  assert s["anchor/oracle_max_visual"] == s["anchor/window_bound"] == 32
  assert s["check/obs_grad_max"] == 0.0 < s["check/target_grad_max"]
  for arm in ("cold_tool", "cold_notool", "rft", "rft_grpo", "grpo", "notool_grpo"):
    bits = s[f"eval/correct_{arm}"]
    assert len(bits) == 24 and set(bits) <= {"0", "1"}
    assert s[f"eval/acc_{arm}"] == pytest.approx(bits.count("1") / 24)
    assert 0.0 <= s[f"eval/greedy_acc_{arm}"] <= 1.0
  for arm in ("cold_tool", "rft", "rft_grpo", "grpo"):
    assert s[f"eval/window_excess_{arm}"] <= 0
  assert "eval/window_excess_notool_grpo" not in s
  for arm in ("rft_grpo", "grpo", "notool_grpo"):
    rows = metrics.read_metrics(str(wd / "stages" / arm))
    assert [r["step"] for r in rows] == [1, 2] and np.isfinite(rows[-1]["rollout/reward"])
    assert "rollout/acc_VQ" in rows[-1] and "rollout/format" in rows[-1]
  assert "rollout/turns" in metrics.read_metrics(str(wd / "stages" / "grpo"))[-1]
  assert "rollout/turns" not in metrics.read_metrics(str(wd / "stages" / "notool_grpo"))[-1]
  assert (wd / "stages" / "rft" / "rft_stats.json").exists()


@pytest.mark.slow       # ~1.5 min; the default tests already run every stage on the 4 x 2 mesh (SHORT)
def test_sharded_equals_single_device(tmp_path):
  short = {**SHORT, "method.arms": ("grpo",)}
  check_sharded_equals_single("vr_thinker", tmp_path, short)


def test_paired_bootstrap_matches_a_brute_force_loop():
  cfg = registry.load("vr_thinker").config_module
  rng = np.random.default_rng(3)
  runs = [{f"eval/correct_{a}": "".join(str(b) for b in (rng.random(400) < p).astype(int))
           for a, p in (("rft_grpo", 0.8), ("cold_tool", 0.7))} for _ in range(3)]
  point, low, high = cfg.paired(runs, "rft_grpo", "cold_tool", reps=2000)
  diffs = [np.mean([int(x) - int(y) for x, y in zip(r["eval/correct_rft_grpo"], r["eval/correct_cold_tool"])])
           for r in runs]
  assert point == pytest.approx(np.mean(diffs), abs=1e-12)
  se = np.sqrt(sum(np.var([int(x) - int(y) for x, y in zip(r["eval/correct_rft_grpo"], r["eval/correct_cold_tool"])])
                   / 400 for r in runs)) / 3
  assert low == pytest.approx(point - 1.96 * se, abs=0.3 * se) and high == pytest.approx(point + 1.96 * se,
                                                                                        abs=0.3 * se)
  assert cfg.paired(runs, "rft_grpo")[0] == pytest.approx(np.mean([r["eval/correct_rft_grpo"].count("1") / 400
                                                                   for r in runs]))


def test_config_errors():
  exp = registry.load("vr_thinker")
  with pytest.raises(ConfigError, match="rft_grpo starts from rft"):
    exp.get_config("tiny", {"method.arms": ("rft_grpo",)})
  with pytest.raises(ConfigError, match="initial < frames"):
    exp.get_config("tiny", {"data.initial": 8})
  with pytest.raises(ConfigError, match="noisy_share"):
    exp.get_config("tiny", {"data.noisy_share": 1.5})
  full = exp.get_config("full")
  with pytest.raises(ConfigError, match="data.path"):
    exp.config_module.check_inputs(full)


def test_full_scale_path_on_tiny_local_checkpoints(tmp_path):
  """`data.source=json` with a composed VLM from local checkpoints (decoder + tower + a tokenizer.json holding the
  format's words), no scripted cold start: RFT and GRPO run on preference records with text prompts."""
  from flax import nnx
  from PIL import Image
  from jaxlab.encoders.vision_tower import VisionTower, VisionTowerConfig, save_hf
  from jaxlab.lm import hf
  from jaxlab.lm.model import Transformer, TransformerConfig
  from jaxlab.lm.tokenizer import HFTokenizer, train_bpe
  from jaxlab.posttrain import frame_select as fs
  exp = registry.load("vr_thinker")
  texts = ["a cat runs on the grass", "a red car turns left", "waves on a beach at sunset"] * 20
  train_bpe(texts, 300, str(tmp_path / "bpe"))
  task = exp.config_module.task(exp.get_config("tiny", {"data.frames": 4, "data.initial": 1}))
  n = fs.add_format_tokens(task, str(tmp_path / "bpe"), str(tmp_path / "tok" / "tokenizer.json"))
  tok = HFTokenizer.from_file(str(tmp_path / "tok"))
  assert not fs.missing_format_tokens(task, tok) and tok.vocab_size == n
  dec = Transformer(TransformerConfig(vocab_size=-(-n // 8) * 8, hidden=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                      mlp_hidden=64, max_position=256, tie_embeddings=True), rngs=nnx.Rngs(0))
  hf.save_pretrained(dec, str(tmp_path / "dec"))
  vis = VisionTowerConfig(arch="vit", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, patch_size=8, image_size=16, num_channels=3)
  save_hf(str(tmp_path / "vis"), vis, VisionTower(vis, rngs=nnx.Rngs(1)).hf_params())
  rng = np.random.default_rng(0)
  recs = []
  for i in range(12):
    for side in "AB":
      folder = tmp_path / "videos" / f"{i}{side}"
      folder.mkdir(parents=True)
      for t in range(6):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(folder / f"{t:03d}.png")
    recs.append({"prompt": texts[i], "path_A": f"videos/{i}A", "path_B": f"videos/{i}B",
                 "VQ": "A" if i % 2 else "B"})
  (tmp_path / "prefs.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
  over = {**SHORT, "data.source": "json", "data.path": str(tmp_path / "prefs.jsonl"), "data.frames": 4,
          "data.initial": 1, "data.n_test": 4, "data.seq_len": 160, "cold.num_steps": 0,
          "model.hf_path": str(tmp_path / "dec"), "model.vision_path": str(tmp_path / "vis"),
          "model.tokenizer": str(tmp_path / "tok"), "method.arms": ("rft", "rft_grpo")}
  c = exp.get_config("tiny", over)
  s = exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert s["stages"] == ["eval_cold", "rft", "rft_grpo"] and s["num_test"] == 4 and s["num_train"] == 8
  assert len(s["eval/correct_rft_grpo"]) == 4 and s["eval/window_excess_rft_grpo"] <= 0
  with pytest.raises(ConfigError, match="scripted cold-start"):
    exp.get_config("tiny", {**over, "cold.num_steps": 4})
  with pytest.raises(ConfigError, match="special tokens"):
    exp.train_module.train_and_evaluate(exp.get_config("tiny", {**over, "model.tokenizer": str(tmp_path / "bpe")}),
                                        str(tmp_path / "run2"))
