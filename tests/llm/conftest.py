"""The tiny Hugging Face checkpoint the LLM backend tests share (built once per session)."""

import pytest

from llm_checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
  pytest.importorskip("safetensors")
  pytest.importorskip("tokenizers")
  pytest.importorskip("jinja2")
  return make_checkpoint(str(tmp_path_factory.mktemp("tiny_hf") / "tiny-chat"))
