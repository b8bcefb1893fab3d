"""`python -m jaxlab.bench lm_train`: training-step tokens/s and MFU, and sampler decode tokens/s.

On a GPU/TPU the training case is the issue's peer configuration: a 0.95B Llama (hidden 2048, 16 layers,
16 heads, MLP 5632, vocab 32000), batch 8 x 2048 tokens, bf16 compute with float32 params, AdamW; MFU =
model FLOPs (6 N + attention, `flops_per_token`) per second / the device's dense bf16 peak. The peer numbers
on an H200 (from the issue): Hugging Face transformers + torch eager 64,100 tokens/s (42% MFU), torch.compile
78,500 tokens/s (52% MFU). Attention is "auto": TPU splash or GPU Pallas flash attention with the batch's
segment ids (`jaxlab.nn.attention`); the 16 blocks are scanned (`scan_layers`). On CPU a tiny
configuration runs and is reported only; when torch and transformers are installed, the same model as a
transformers `LlamaForCausalLM` (eager, torch AdamW, same batch) runs beside it as the baseline, so the
speed-up column is jaxlab's tokens/s over transformers' on this CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlab import mesh as mesh_lib
from jaxlab.lm import sft
from jaxlab.lm.model import Transformer, TransformerConfig, flops_per_token
from jaxlab.lm.sampler import generate
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train.step import make_train_step

RULES = mesh_lib.RULES["fsdp"]


def _accelerator() -> bool:
  return jax.default_backend() in ("gpu", "cuda", "tpu")


def _case():
  if _accelerator():
    cfg = TransformerConfig(vocab_size=32000, hidden=2048, n_layers=16, n_heads=16, mlp_hidden=5632,
                            max_position=4096, dtype="bfloat16", param_dtype="float32", attention="auto")
    return cfg, 8, 2048
  cfg = TransformerConfig(vocab_size=4096, hidden=256, n_layers=4, n_heads=4, mlp_hidden=1024, max_position=512)
  return cfg, 4, 256


def _train_setup():
  cfg, batch, seq = _case()
  mesh = mesh_lib.make_mesh((("data", -1), ("model", 1)))
  md = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
  tx = optax.adamw(1e-4, weight_decay=0.1)
  state, shardings = create_train_state(md, tx, mesh, RULES, seed=0)
  bsh = mesh_lib.batch_sharding(mesh, RULES)
  step = make_train_step(md, sft.make_loss_fn(), tx, lambda s: 1e-4, shardings, bsh, donate=False)
  toks = jax.random.randint(jax.random.key(0), (batch, seq + 1), 0, cfg.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
  data = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "loss_mask": jnp.ones((batch, seq)),
          "positions": pos, "segment_ids": jnp.ones((batch, seq), jnp.int32)}
  data = jax.device_put(data, bsh)
  out = {"jaxlab": (step, (state, data))}
  if not _accelerator():
    peer = _transformers_step(cfg, jax.device_get(toks))
    if peer is not None:
      out["transformers"] = peer
  return out


def _transformers_step(cfg: TransformerConfig, toks):
  """(fn, ()) of one transformers + torch training step of the same Llama on the same tokens, or None when
  torch / transformers are not installed."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  hf_cfg = transformers.LlamaConfig(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.mlp_hidden,
      num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
      max_position_embeddings=cfg.max_position, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
      tie_word_embeddings=cfg.tie_embeddings)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(hf_cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
  tokens = torch.as_tensor(np.array(toks), dtype=torch.long)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def step():
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())
  return step, ()


def _decode_setup():
  cfg, batch, _ = _case()
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  prompts = [[1 + (i * 7 + j) % (cfg.vocab_size - 1) for j in range(128)] for i in range(batch)]
  return {"jaxlab": (lambda: generate(model, prompts, 128).tokens, ())}  # (the sampler jits internally)


def _train_costs():
  cfg, batch, seq = _case()
  return dict(flops=flops_per_token(cfg, seq) * batch * seq, bytes=0.0, count=float(batch * seq), unit="tok",
              shape=f"{'0.95B llama' if _accelerator() else 'tiny llama'} b{batch} s{seq} {cfg.dtype}")


def _decode_costs():
  cfg, batch, _ = _case()
  return dict(flops=0.0, bytes=0.0, count=float(batch * 128), unit="tok", shape=f"b{batch} prompt 128 new 128")


BENCHMARKS = [dict(name="lm_train/step", setup=_train_setup, baseline="transformers", **_train_costs()),
              dict(name="lm_train/decode", setup=_decode_setup, **_decode_costs())]
