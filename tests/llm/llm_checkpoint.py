"""Builds a tiny Hugging Face checkpoint folder (random Llama weights, a BPE tokenizer, a ChatML template) shared by
the LLM backend tests."""

import json
import os

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

TEXTS = ["the sum of two and three is five", "user: what is 2+3? assistant: 5", "hello world, how are you today?",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>"] * 20


def make_checkpoint(path: str, *, template: str | None = CHATML, seed: int = 0) -> str:
  """Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with `template`) to `path`."""
  from flax import nnx
  from jaxlab.lm import Transformer, TransformerConfig, save_pretrained, train_bpe
  tok = train_bpe(TEXTS, 300, path, specials=("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"))
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=64,
                          max_position=96, init_std=0.5)
  save_pretrained(Transformer(cfg, rngs=nnx.Rngs(seed)), path)
  file = os.path.join(path, "tokenizer_config.json")
  with open(file) as f:
    tc = json.load(f)
  if template is not None:
    tc["chat_template"] = template
  with open(file, "w") as f:
    json.dump(tc, f)
  return path
