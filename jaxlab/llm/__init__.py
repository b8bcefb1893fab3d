"""LLM backends: one interface (`Backend.complete` / `complete_batch`) for a served model, a local jaxlab model,
recorded outputs and scripts.

* `OpenAICompatBackend`: any OpenAI-compatible server (vLLM on GPU, vllm-tpu, llama.cpp, `jaxlab.llm.serve`).
* `LocalBackend`: a jaxlab run directory or a Hugging Face checkpoint through `jaxlab.lm.generate`, with the
  checkpoint's chat template (`jaxlab.llm.chat`).
* `ReplayBackend` (recorded outputs), `ScriptedBackend` (rules, for tests and simulators), `CachingBackend`
  (any backend with an on-disk cache, so accelerator runs are reproducible offline).
* `python -m jaxlab.llm.serve --model DIR`: an OpenAI-compatible server answering from `LocalBackend`.

Only `LocalBackend` imports JAX (on first use).
"""

from jaxlab.llm.base import (Backend, BackendError, Completion, ContextTooLongError, ModelNotServedError,
                             ReplayMissError, Sampling, ServerUnavailableError, check_prompt, prompt_key, prompt_text)
from jaxlab.llm.chat import PLAIN_TEMPLATE, ChatTemplate, TemplateError
from jaxlab.llm.offline import CachingBackend, ReplayBackend, ScriptedBackend, write_replay
from jaxlab.llm.openai_compat import OpenAICompatBackend


def __getattr__(name):
  if name == "LocalBackend":
    from jaxlab.llm.local import LocalBackend  # pylint: disable=g-import-not-at-top
    return LocalBackend
  raise AttributeError(f"module 'jaxlab.llm' has no attribute {name!r}")
