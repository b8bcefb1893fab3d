"""`python -m jaxlab.tts.sample_pools` on a tiny randomly initialised lm_sft checkpoint: JSONL round trip."""

import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxlab import checkpoint, configs, metrics, registry
from jaxlab.errors import CheckpointError, ConfigError, DataError
from jaxlab.state import ModelDef, TrainState
from jaxlab.tts import pools, sample_pools

TINY_MODEL = {"model.hidden": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1,
              "model.mlp_hidden": 64, "model.max_position": 48}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
  """An lm_sft run directory holding a randomly initialised (untrained) model: config.json + checkpoints/0."""
  workdir = str(tmp_path_factory.mktemp("lm"))
  exp = registry.load("lm_sft")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {**TINY_MODEL, "mesh": (("data", 1), ("model", 1))})
  train = exp.train_module
  tok = train.tokenizer_for(c)
  md = ModelDef(train.build_model_fn(c, train.model_config(c, tok)))
  params, rest = md.init(jax.random.key(0))                      # random weights, no optimizer, no training
  state = TrainState(step=jnp.int32(0), params=params, model_state=rest, opt_state={},
                     rng=jax.random.key_data(jax.random.key(0)))
  ck = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  ck.save(0, state, {"config": c.to_dict()}, force=True)
  ck.close()
  metrics.write_json(os.path.join(workdir, "config.json"), c.to_dict())
  return workdir


def _prompts(tmp_path):
  path = tmp_path / "prompts.jsonl"
  path.write_text("".join(json.dumps(x) + "\n" for x in [
      {"id": "p1", "prompt": "1+2=", "answer": "3"}, {"id": "p2", "question": "7+5="}, {"prompt": "9+9="}]))
  return str(path)


def test_sample_pools_writes_readable_pets_jsonl(ckpt_dir, tmp_path):
  out = str(tmp_path / "pools.jsonl")
  argv = ["--workdir", ckpt_dir, "--prompts", _prompts(tmp_path), "--out", out, "--n", "5", "--max_new_tokens", "3",
          "--batch", "8", "--seed", "3"]
  assert sample_pools.main(argv) == 0
  lines = [json.loads(x) for x in open(out)]
  assert [x["id"] for x in lines] == ["p1", "p2", "line3"]
  assert [x["question"] for x in lines] == ["1+2=", "7+5=", "9+9="]
  assert lines[0]["answer"] == "3" and "answer" not in lines[1]
  for x in lines:
    assert len(x["answers"]) == 5 and len(x["trace_confidence"]) == 5
    assert x["final"] == pools.majority_answer(x["answers"], unique=True)     # null for a tied pool
    for tc in x["trace_confidence"]:
      assert 0 < tc["mean_confidence"] <= 1 and tc["mean_confidence"] == pytest.approx(np.exp(tc["mean_logprob"]))
  # The file reads back as free-form pools (answers of a random byte model are arbitrary strings).
  p = pools.read_pools(out, choices=None, max_options=8)
  assert p.ids == ["p1", "p2", "line3"] and p.has_confidence
  for i, x in enumerate(lines):
    kept = [a for a in x["answers"] if a]
    assert [p.options[i][j] for j in p.answers[i, :p.lengths[i]]] == kept[:p.lengths[i]]
  # Same seed, same pools.
  again = str(tmp_path / "again.jsonl")
  sample_pools.main(argv[:5] + [again] + argv[6:])
  assert open(again).read() == open(out).read()


def test_answer_regex():
  import re
  assert sample_pools.extract_answer("so the answer is (B).", re.compile(r"answer is \(?([A-D])")) == "B"
  assert sample_pools.extract_answer("no idea", re.compile(r"answer is ([A-D])")) == ""
  assert sample_pools.extract_answer("  42 \n", None) == "42"


def test_clear_errors(ckpt_dir, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "1+1="}\n{"prompt": 5}\n')
  with pytest.raises(DataError, match=r"bad.jsonl:2: needs a non-empty string 'prompt'"):
    sample_pools.read_prompts(str(bad))
  with pytest.raises(CheckpointError, match="no config.json"):
    sample_pools.main(["--model", str(tmp_path), "--prompts", _prompts(tmp_path), "--out", str(tmp_path / "o")])
  with pytest.raises(ConfigError, match="name exactly one model"):
    sample_pools.main(["--prompts", _prompts(tmp_path), "--out", str(tmp_path / "o")])
  out = tmp_path / "never.jsonl"
  with pytest.raises(DataError):
    sample_pools.main(["--workdir", ckpt_dir, "--prompts", str(bad), "--out", str(out)])
  assert not out.exists()
