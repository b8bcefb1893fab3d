"""CurvZO experiment: end to end (short), resume, SIGTERM, sharded == single device, the LM task path, errors."""

import json
import shutil

import numpy as np
import pytest

from experiment_checks import VOLATILE, check_end_to_end, check_sharded_equals_single, check_sigterm_resume
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError, DataError, JaxlabError

# A small, fast version of the tiny variant: every stage, small sizes, two optimizers.
SHORT = {"exact.d": 256, "exact.n_keys": 16, "unbiased.n_keys": 512, "variance.d": 256, "variance.blocks": 16,
         "variance.n_keys": 256, "variance.chunk": 64, "race.d": 200, "race.blocks": 10, "race.relevant": 2,
         "race.steps": 40, "race.log_every": 20, "race.lrs": (1e-3, 4e-3), "method.methods": ("mezo", "curvzo")}
STAGES = ["exact", "unbiased", "variance", "race/mezo", "race/curvzo"]


def test_tiny_end_to_end_and_resume(tmp_path):
  s = check_end_to_end("curvzo", tmp_path, SHORT)
  assert s["exact/max_rel_err_f64"] < 1e-6 and s["exact/round_trip_err_interpret"] < 1e-6
  assert 0 < s["ht/rel_err"] < 1 and s["var/sqrt_vs_uniform"] > 0
  assert 0 < s["race/curvzo/final"] < 1 and 0 < s["race/mezo/final"] < 1
  assert s["stages"] == STAGES
  assert [r["stage"] for r in metrics.read_metrics(str(tmp_path))] == STAGES
  curves = registry.load("curvzo").train_module.race_curves(str(tmp_path), s["stages"])
  assert sorted(curves) == ["race/curvzo", "race/mezo"]
  assert list(curves["race/mezo"]["forward_passes"]) == [40, 80] and np.all(curves["race/mezo"]["loss_ratio"] > 0)
  # resume: drop the last stage's checkpoint and the summary; the rerun redoes that stage only, same result
  ckpts = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  shutil.rmtree(tmp_path / "checkpoints" / str(ckpts[-1]))
  (tmp_path / "summary.json").unlink()
  again = check_end_to_end("curvzo", tmp_path, SHORT)
  drop = lambda d: {k: v for k, v in d.items() if k not in VOLATILE}  # noqa: E731
  assert drop(again) == drop(s)


def test_sigterm_inside_and_between_stages_resumes_identically(tmp_path):
  # 4 stages: SIGTERM inside "variance" (stage 1), then after "race/mezo" (stage 2) in the resumed run.
  check_sigterm_resume("curvzo", tmp_path, {**SHORT, "exact.enabled": False}, inside=1)


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  # keys, lr-grid runs and repeats are spread over the "data" axis; per-key / per-run arithmetic is unchanged.
  check_sharded_equals_single("curvzo", tmp_path, {**SHORT, "exact.enabled": False, "variance.enabled": False},
                              rtol=1e-4)


def test_stages_follow_the_method_keys_and_carry_no_train_section():
  exp = registry.load("curvzo")
  for v in ("tiny", "small"):
    assert "train" not in exp.get_config(v)
  c = exp.get_config("tiny", {"method.methods": ("mezo", "sparse", "curvzo"), "variance.enabled": False})
  assert exp.config_module.stages(c) == ["exact", "unbiased", "race/mezo", "race/sparse", "race/curvzo"]
  assert exp.config_module.stages(exp.get_config("small"))[-1] == "digits/curvzo_ht"
  full = exp.get_config("full")
  assert full.train.batch_size == 16 and full.train.num_steps == 20000 and "optimizer" not in full.train
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  assert tuple(map(tuple, full.sharding_rules)) == mesh_lib.RULES["fsdp"]


def _write_sst2(folder):
  folder.mkdir()
  for split, n in (("train", 40), ("validation", 12)):
    with open(folder / f"{split}.jsonl", "w") as f:
      for i in range(n):
        f.write(json.dumps({"sentence": ["a dull mess", "a lovely film"][i % 2], "label": i % 2}) + "\n")


def test_lm_prompts_and_candidate_encoding():
  from jaxlab.experiments.curvzo import lm_task  # pylint: disable=g-import-not-at-top
  from jaxlab.lm.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
  rec = {"sentence": "A fine film.", "label": 1, "premise": "It rained.", "hypothesis": "It was wet.",
         "passage": "P", "question": "cause", "choice1": "The sun set.", "choice2": "I slept.", "word": "bank",
         "sentence1": "s1", "sentence2": "s2", "text": "T", "span1_text": "Anna", "span2_text": "She",
         "paragraph": "Par", "answer": "Ans"}
  for task in lm_task.TASKS:
    prompt, cands, label = lm_task.TASKS[task][2]({**rec, "label": 0})
    assert prompt and len(cands) >= 2 and label == 0, task
  assert lm_task.TASKS["copa"][2](rec)[0].endswith(" because")
  tok = ByteTokenizer()
  enc = lm_task.encode([rec, {**rec, "label": 0}], "sst2", tok, max_length=20)
  assert enc["inputs"].shape == (2, 2, 20) and list(enc["label"]) == [1, 0]
  for j, word in enumerate([" terrible", " great"]):     # the mask marks exactly the candidate's tokens
    m = enc["mask"][0, j] > 0
    assert bytes(enc["targets"][0, j][m].tolist()).decode() == word
  long = lm_task.encode([{**rec, "sentence": "x" * 100}], "sst2", tok, max_length=20)
  assert long["mask"][0, 1].sum() == len(" great")        # prompts are cut from the left, candidates kept


@pytest.mark.slow
def test_lm_task_runs_on_local_jsonl(tmp_path):
  exp = registry.load("curvzo")
  c = exp.get_config("full")
  _write_sst2(tmp_path / "sst2")
  configs.apply_overrides(c, {"task.source": "jsonl", "task.data_dir": str(tmp_path / "sst2"), "task.n_train": 24,
                              "task.n_dev": 8, "task.n_eval": 12, "task.max_length": 16, "model.dtype": "float32",
                              "model.hidden": 32, "model.mlp_hidden": 64, "model.n_layers": 1, "train.num_steps": 3,
                              "train.log_every": 1, "train.eval_every": 0, "train.checkpoint_every": 0,
                              "train.batch_size": 8, "method.warmup_steps": 1})
  s = exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert s["step"] == 3 and 0.0 <= s["eval/accuracy"] <= 1.0 and s["tfds"] == "glue/sst2"
  assert s["opt_state_floats"] < 0.1 * s["num_params"]       # O(#blocks), not O(#params)


def test_bad_inputs_are_clear_errors(tmp_path):
  exp = registry.load("curvzo")
  with pytest.raises(ConfigError, match="unknown config key 'num_steps'"):   # the staged run has no step count
    exp.get_config("tiny", {"num_steps": 3})
  with pytest.raises(ConfigError, match="pmin"):
    exp.get_config("tiny", {"method.pmin": 0.5})
  c = exp.get_config("tiny")
  with pytest.raises(ConfigError, match="pmin"):         # a finalized config is validated again
    configs.apply_overrides(c, {"method.pmin": 0.5})
  with pytest.raises(ConfigError, match="task.name"):
    exp.get_config("full", {"task.name": "mnli"})
  with pytest.raises(ConfigError, match="use variant=full"):
    exp.get_config("tiny", {"task.kind": "lm"})
  with pytest.raises(ConfigError, match="mezo"):
    exp.get_config("tiny", {"method.methods": ("sparse", "curvzo")})
  from jaxlab.experiments.curvzo import lm_task  # pylint: disable=g-import-not-at-top
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "train.jsonl").write_text('{"sentence": "ok", "label": 1}\n{"sentence": "broken"\n')
  with pytest.raises(DataError, match="train.jsonl:2"):
    lm_task.load_records("sst2", "train", "jsonl", str(bad))
  (bad / "train.jsonl").write_text('{"text": "no sentence"}\n')
  with pytest.raises(DataError, match="lacks field"):
    lm_task.load_records("sst2", "train", "jsonl", str(bad))
  with pytest.raises(JaxlabError):  # TFDS's GLUE builders need TensorFlow, or the data is not prepared
    lm_task.load_records("rte", "train", "tfds", str(tmp_path / "no_data"))
