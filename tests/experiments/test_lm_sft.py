"""LM SFT experiment: end to end (short), resume, sharded == single device, JSONL input, LoRA, errors."""

import json

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import registry
from jaxlab.errors import ConfigError

SHORT = {"train.num_steps": 20, "train.log_every": 5, "train.eval_every": 10, "train.checkpoint_every": 10,
         "data.n_train": 512, "data.n_eval": 32, "generate.examples": 16, "generate.batch": 16, "model.hidden": 32,
         "model.mlp_hidden": 64, "train.optimizer.warmup_steps": 2}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("lm_sft", tmp_path, SHORT)
  assert 0.0 <= s["eval/gen_exact_match"] <= 1.0 and s["eval/gen_examples"] == 16
  assert s["train/loss"] < 5.6  # below log(vocab) = log(264): it is learning


def test_resume(tmp_path):
  check_resume("lm_sft", tmp_path, SHORT)


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("lm_sft", tmp_path, {**SHORT, "train.num_steps": 10})


def test_jsonl_input_and_lora(tmp_path):
  path = tmp_path / "data.jsonl"
  with open(path, "w") as f:
    for i in range(200):
      f.write(json.dumps({"prompt": f"echo {i}:", "completion": f" {i}"}) + "\n")
  s = check_end_to_end("lm_sft", tmp_path / "run", {**SHORT, "data.source": "jsonl", "data.path": str(path),
                                                    "data.packed": True, "model.lora_rank": 4})
  assert s["num_train_rows"] < 190  # packed: several examples per row


def test_missing_inputs_are_clear_errors_before_anything_is_written(tmp_path):
  exp = registry.load("lm_sft")
  c = exp.get_config("tiny", {"data.source": "jsonl"})        # builds: the file is checked when the run starts
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  exp.get_config("full")                                       # builds without model.hf_path / data.path
  with pytest.raises(ConfigError, match="reads tokenizer.json from config.model.hf_path"):
    exp.train_module.train_and_evaluate(exp.get_config("full", {"data.path": "x.jsonl"}), str(tmp_path / "full"))


def test_all_empty_completions_are_refused_before_anything_is_written(tmp_path, caplog):
  """An empty target is matched by any generation that stops at once: all-empty completions would train on
  nothing and score exact match 1.0."""
  from jaxlab.errors import DataError
  from jaxlab.lm import sft_data
  exp = registry.load("lm_sft")
  path = str(tmp_path / "empty.jsonl")
  sft_data.write_jsonl(path, [{"prompt": f"{i}+{i}=", "completion": ""} for i in range(6)])
  c = exp.get_config("tiny", {"data.source": "jsonl", "data.path": path})
  with pytest.raises(DataError, match=r"every one of the 6 completions is empty"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  sft_data.write_jsonl(path, [{"prompt": f"{i}+{i}=", "completion": "" if i < 2 else str(2 * i)} for i in range(6)])
  with caplog.at_level("WARNING", logger="jaxlab"):
    train, evals = exp.train_module.examples(c)
  assert len(train) + len(evals) == 6 and "2 of 6 completions are empty" in caplog.text


def test_a_tokenizer_larger_than_the_checkpoint_embedding_is_refused_before_training(tmp_path):
  import json
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "config.json").write_text(json.dumps({
      "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64}))
  exp = registry.load("lm_sft")
  c = exp.get_config("tiny", {"model.hf_path": str(ckpt), "data.tokenizer": "byte"})
  with pytest.raises(ConfigError, match=r"has \d+ ids but the checkpoint .* embeds only 64"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,msg", [
    ({"data.source": "csv"}, "data.source"),
    ({"model.arch": "gpt2"}, "model.arch"),
    ({"model.hf_path": "/some/dir", "model.lora_rank": 4}, "LoRA on a pretrained checkpoint"),
    ({"num_steps": 5}, "did you mean 'train.num_steps'"),
])
def test_bad_config_values_are_clear_errors(overrides, msg):
  with pytest.raises(ConfigError, match=msg):
    registry.load("lm_sft").get_config("tiny", overrides)


def test_full_variant_uses_the_fsdp_rules_preset():
  from jaxlab import mesh
  assert tuple(map(tuple, registry.load("lm_sft").get_config("full").sharding_rules)) == mesh.RULES["fsdp"]
