"""`python -m jaxlab.bench dit_train`: DiT training-step images/s and MFU.

On a GPU/TPU the case is LF-DiT-L/16 of Latent Forcing (arXiv 2602.11401) at 256 x 256: the L zoo size (24
blocks, width 1024, 16 heads, bottleneck 128, 32 class tokens from block 8) with two streams on the 16 x 16
token grid, pixels (3 channels, patch 16) and a DINOv2-B latent (768 channels, patch 1), no decoder heads
(about 465M parameters in the paper), batch 32 per device, bf16 compute with float32 params, AdamW, both
streams' v-losses with logit-normal times. MFU = `jaxlab.nn.dit.flops_per_image` x images/s / the device's
dense bf16 peak. On CPU a small two-stream configuration runs and is reported only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxlab import mesh as mesh_lib
from jaxlab.diffusion import flow
from jaxlab.nn import dit
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train.step import make_train_step

RULES = mesh_lib.RULES["fsdp"]
STREAMS = {"pixel": (3, 16), "latent": (768, 1)}


def _accelerator() -> bool:
  return jax.default_backend() in ("gpu", "cuda", "tpu")


def _case() -> tuple[dit.DiTConfig, int]:
  if _accelerator():
    cfg = dit.zoo("L", STREAMS, grid=(16, 16), num_classes=1000, dtype="bfloat16", attention="auto")
    return cfg, 32 * jax.device_count()
  cfg = dit.DiTConfig(streams={"pixel": (3, 4), "latent": (16, 1)}, grid=(8, 8), hidden=128, depth=4, heads=4,
                      bottleneck=32, num_classes=10, class_tokens=4, in_context_start=2, attention="xla")
  return cfg, 8


def _loss_fn(model, batch, key):
  keys = dict(zip(STREAMS, jax.random.split(key, 2 * len(STREAMS)).reshape(len(STREAMS), 2)))
  t, z = {}, {}
  for s, (kt, ke) in keys.items():
    x = batch[s]
    t[s] = flow.logit_normal(kt, (x.shape[0],))
    z[s] = flow.interpolate(x, jax.random.normal(ke, x.shape, x.dtype), t[s])
  out = model(z, t, batch["label"])
  loss = sum(flow.v_loss(out[s], batch[s], z[s], t[s]) for s in STREAMS)
  return loss, {}


def _train_setup():
  cfg, batch = _case()
  mesh = mesh_lib.make_mesh((("data", -1), ("model", 1)))
  md = ModelDef(lambda rngs: dit.DiT(cfg, rngs=rngs))
  tx = optax.adamw(2e-4, b2=0.95, weight_decay=0.0)
  with mesh_lib.use(mesh, RULES):
    state, shardings = create_train_state(md, tx, mesh, RULES, seed=0)
    bsh = mesh_lib.batch_sharding(mesh, RULES)
    step = make_train_step(md, _loss_fn, tx, lambda s: 2e-4, shardings, bsh, donate=False)
  key = jax.random.key(0)
  data = {s: jax.random.normal(jax.random.fold_in(key, i), (batch, *cfg.stream_shape(s)))
          for i, s in enumerate(STREAMS)}
  data["label"] = jax.random.randint(key, (batch,), 0, cfg.num_classes)
  data = jax.device_put(data, bsh)

  def run(state, data):
    with mesh_lib.use(mesh, RULES):
      return step(state, data)
  return {"jaxlab": (run, (state, data))}


def _costs():
  cfg, batch = _case()
  name = "LF-DiT-L/16 256x256" if _accelerator() else "small 2-stream DiT"
  return dict(flops=dit.flops_per_image(cfg) * batch, bytes=0.0, count=float(batch), unit="img",
              shape=f"{name} b{batch} {cfg.dtype}")


BENCHMARKS = [dict(name="dit_train/step", setup=_train_setup, **_costs())]
