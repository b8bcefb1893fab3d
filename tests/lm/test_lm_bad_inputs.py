"""Bad LM inputs are one clear line: incomplete HF configs, invalid JSON, a tokenizer too big for the model."""

import json

import pytest

from jaxlab.errors import CheckpointError, ConfigError, DataError
from jaxlab.lm import hf, tokenizer

LLAMA = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size"])
def test_a_missing_config_key_is_named(tmp_path, key):
  cfg = {k: v for k, v in LLAMA.items() if k != key}
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=rf"config.json has no '{key}', which a LlamaForCausalLM config needs"):
    hf.config_from_hf(str(tmp_path))


def test_a_wrongly_typed_config_value_is_one_line(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "hidden_size": "wide"}))
  with pytest.raises(CheckpointError, match=r"a value has the wrong type"):
    hf.config_from_hf(str(tmp_path))


def test_invalid_json_names_line_and_column(tmp_path):
  (tmp_path / "config.json").write_text('{\n  "vocab_size": 64,\n  "hidden_size": ,\n}')
  with pytest.raises(CheckpointError, match=r"config.json:3:18: not valid JSON \(Expecting value\)"):
    hf.config_from_hf(str(tmp_path))
  from jaxlab.data.jsonl import load_json
  (tmp_path / "x.json").write_text('[1, 2,\n 3 4]')
  with pytest.raises(DataError, match=r"x.json:2:4: not valid JSON \(Expecting ',' delimiter\)"):
    load_json(str(tmp_path / "x.json"))


def test_a_tokenizer_larger_than_the_embedding_is_refused():
  tok = tokenizer.ByteTokenizer(["<a>", "<b>"])
  tokenizer.check_fits(tok, tok.vocab_size)
  with pytest.raises(ConfigError, match=rf"has {tok.vocab_size} ids but the model embeds only 128"):
    tokenizer.check_fits(tok, 128)
