"""Memory, the reason ZO exists: compiled peak memory of ZO, forward-only and backprop steps of a ~106M LM.

Compiles only (abstract arguments, `memory_analysis`); nothing runs. Peak = arguments + outputs - donated
aliases + temporaries. Slow (~30-60 s of CPU compilation): `pytest -m slow tests/zo/test_zo_memory.py -s`
prints the numbers quoted in experiments/curvzo/README.md.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxlab import zo
from jaxlab.lm import sft
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.state import ModelDef

# Llama-style, ~106M parameters: vocab 32000, hidden 1536, 2 layers, MLP 4096, tied embeddings; batch 4 x 256.
CONFIG = TransformerConfig(vocab_size=32000, hidden=1536, n_layers=2, n_heads=12, mlp_hidden=4096,
                           tie_embeddings=True, max_position=512)
BATCH, LENGTH = 4, 256


def _peak(compiled) -> int:
  m = compiled.memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


@pytest.mark.slow
def test_zo_step_needs_a_forward_pass_memory_and_backprop_much_more():
  md = ModelDef(lambda rngs: Transformer(CONFIG, rngs=rngs))
  params, rest = md.abstract()
  n_params = sum(x.size for x in jax.tree.leaves(params))
  assert 95e6 < n_params < 115e6
  S = jax.ShapeDtypeStruct
  batch = {"inputs": S((BATCH, LENGTH), jnp.int32), "targets": S((BATCH, LENGTH), jnp.int32),
           "loss_mask": S((BATCH, LENGTH), jnp.float32)}

  def loss_fn(p, b):
    return sft.sft_loss(md.merge(p, rest)(b["inputs"]), b["targets"], b["loss_mask"])[0]

  fwd = _peak(jax.jit(loss_fn).lower(params, batch).compile())
  out = {"forward": fwd}
  for name, opt in (("mezo", zo.mezo(params, lr=1e-6, impl="xla")),
                    ("curvzo", zo.curvzo(params, lr=1e-6, block_size="row", exact_stats=False, impl="xla"))):
    st = jax.eval_shape(lambda opt=opt: opt.init(0))
    ctx = jax.eval_shape(opt.prepare, st)
    prog = zo.make_step(opt, loss_fn, fused=False).programs
    scalar = S((), jnp.float32)
    out[f"{name}_split"] = max(_peak(prog["plus"].lower(params, ctx).compile()),
                               _peak(prog["minus"].lower(params, ctx).compile()),
                               _peak(prog["loss"].lower(params, batch).compile()),
                               _peak(prog["finish"].lower(params, st, ctx, scalar, scalar).compile()))
    if name == "mezo":
      out["mezo_fused"] = _peak(zo.make_step(opt, loss_fn).lower(params, st, batch).compile())
  tx = optax.adam(1e-4)

  def backprop(p, o, b):
    g = jax.grad(loss_fn)(p, b)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o
  out["backprop_adam"] = _peak(jax.jit(backprop, donate_argnums=(0, 1)).lower(
      params, jax.eval_shape(tx.init, params), batch).compile())
  print({k: f"{v / 2**20:.0f} MiB ({v / fwd:.3f}x)" for k, v in out.items()}, f"params {n_params / 1e6:.1f}M")
  assert out["mezo_split"] <= 1.1 * fwd and out["curvzo_split"] <= 1.1 * fwd
  assert out["backprop_adam"] >= 2.5 * fwd
  assert out["mezo_fused"] <= 1.3 * fwd     # one program: XLA keeps perturbed copies of some weights (README)
