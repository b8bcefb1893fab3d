"""Full-scale configs proven before launch: ahead-of-time compile for a TPU slice, memory and FLOPs per chip.

    python -m jaxlab.compile_check --config experiments/<paper>/config.py:full --topology v5p-64 \
        [--config.key=value ...] [--margin 0.1] [--json OUT]
    python -m jaxlab.compile_check --all [--topology T]        # every experiment that declares its targets

Nothing is allocated and no accelerator is needed. The config's mesh is built over the devices of the
topology (`jax.experimental.topologies`, libtpu's compile-only client: `pip install -e ".[tpu-aot]"`); the
experiment's `compile_targets(config)` (in its aot.py, beside `TOPOLOGY`, the slice `--all` uses, and optionally
`KNOWN_ISSUE`, a reason `--all` skips it and reports it as not green; claims never
import aot.py, so it is not among a ledger's sources) returns its accelerator steps: the REAL jitted train
step (`train_target`: `fit`'s optimizer, state shardings and `make_train_step`) and, where it has one, an eval
or sampling step, each with abstract arguments carrying their shardings. Each is lowered and compiled by XLA
for that TPU, and the report gives per chip:

* parameter and optimizer-state bytes (from the state's shardings), the compiled program's argument, output
  and temporary (activation) bytes (`compiled.memory_analysis()`), the total against the chip's HBM with a
  margin (fits or not; when not, one line naming the largest buffers and a remedy);
* FLOPs and bytes accessed per step (`compiled.cost_analysis()`, per device), the step time at peak
  (max(FLOPs / peak FLOP/s, bytes / HBM bandwidth): a lower bound) and the model FLOPs utilisation that bound
  implies (the target's analytic model FLOPs, e.g. 6 N tokens, over chips x peak x time);
* the collectives in the optimized HLO by kind: count and bytes (an op inside a loop body, e.g. scanned
  layers, is counted once).

GPU targets (`--topology h100:8`, `h200:16`, `a100:8`: GPUs in all) are reported by lowering the step for the
CUDA platform on host devices standing in for the GPUs (no compile) and an analytic memory estimate from the
abstract shapes: parameters, gradients and optimizer state per GPU; activations are not estimated.

HBM and peaks of the TPU generations: Google Cloud's TPU system-architecture pages (v4: 32 GiB, 275 TFLOP/s
bf16, 1228 GB/s; v5e: 16 GiB, 197, 819; v5p: 95 GiB, 459, 2765; v6e: 32 GiB, 918, 1640), the numbers
`jaxlab.bench` uses.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

from jaxlab import cli
from jaxlab.errors import ConfigError

# generation: (HBM GiB per chip, dense bf16 TFLOP/s per chip, HBM GB/s per chip, 3-D torus?)
TPU_CHIPS = {"v4": (32.0, 275.0, 1228.0, True), "v5e": (16.0, 197.0, 819.0, False),
             "v5p": (95.0, 459.0, 2765.0, True), "v6e": (32.0, 918.0, 1640.0, False)}
# GPU: (HBM GiB, dense bf16 TFLOP/s, HBM GB/s): NVIDIA's H100 SXM / H200 / A100-80GB data sheets.
GPUS = {"h100": (80.0, 989.0, 3350.0), "h200": (141.0, 989.0, 4800.0), "a100": (80.0, 312.0, 2039.0)}
# Accelerator-type names count TensorCores on v4 / v5p (2 per chip) and chips on v5e / v6e.
CORES_PER_NAME = {"v4": 2, "v5p": 2, "v5e": 1, "v5litepod": 1, "v6e": 1}
_GRID_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_GRID_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
            512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
GiB = 1024 ** 3


@dataclasses.dataclass
class Topology:
  """A compile target: TPU slice (compiled) or GPU host set (lowered only)."""
  name: str            # as given, e.g. "v5p-64" or "v5e:2x2"
  platform: str        # "tpu" | "cuda"
  generation: str      # "v5p", "h100", ...
  devices: list        # topology devices (TPU) or host stand-ins (GPU)
  chips: int
  hbm_bytes: float     # per device
  peak_flops: float    # per device, FLOP/s
  hbm_bw: float        # per device, bytes/s

  @property
  def num_devices(self) -> int:
    return len(self.devices)


@dataclasses.dataclass
class Target:
  """One accelerator step of an experiment, ready to lower.

  Attributes:
    name: e.g. "train_step", "sample".
    fn: the jitted function (with its in/out shardings), as the run calls it.
    args: abstract arguments (`jax.ShapeDtypeStruct`s carrying shardings) of one call.
    state: the abstract TrainState (or parameter tree) whose per-chip bytes are reported as parameters and
      optimizer state (optional).
    model_flops: analytic model FLOPs of one call over all chips (e.g. 6 N tokens + attention), for MFU.
  """
  name: str
  fn: Callable
  args: tuple
  state: Any = None
  model_flops: float | None = None


def train_target(config, model_fn, loss_fn, batch: Mapping[str, Any], *, wrap_optimizer=None,
                 model_flops: float | None = None, name: str = "train_step") -> Target:
  """The target of `fit`'s train step for `config` (in the mesh and rules in context).

  Args:
    config: the experiment's config (its `train` section builds the optimizer, as in `fit`).
    model_fn: `rngs -> nnx.Module`, as given to `fit`.
    loss_fn: as given to `fit`.
    batch: the GLOBAL batch as `{name: jax.ShapeDtypeStruct}` (sharded over 'batch' here).
    wrap_optimizer: as given to `fit`.
    model_flops: analytic model FLOPs of one step (all chips), for the MFU column.
    name: the target's name.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.train import optim, step as step_lib  # pylint: disable=g-import-not-at-top
  # as `fit` builds them: the model description, the optimizer, the state's shardings and the jitted step
  tx, schedule = optim.make_optimizer(config.train.optimizer, config.train.num_steps)
  if wrap_optimizer is not None:
    tx = wrap_optimizer(tx)
  modeldef, state, shardings = abstract_state(model_fn, tx, config.seed)
  bsh = mesh_lib.batch_sharding()
  step = step_lib.make_train_step(modeldef, loss_fn, tx, schedule, shardings, bsh)
  abstract_batch = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=bsh), dict(batch))
  return Target(name, step, (state, abstract_batch), state=state, model_flops=model_flops)


def abstract_state(model_fn, tx, seed: int):
  """(ModelDef, abstract TrainState carrying its shardings, the shardings) as `create_train_state` makes them on
  the mesh and rules in context, traced under `jax.eval_shape`: nothing is allocated, and no eager op runs on
  the compile-only devices."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.state import ModelDef, abstract_with_shardings, create_train_state  # pylint: disable=g-import-not-at-top
  modeldef, found = ModelDef(model_fn), []

  def init():
    state, shardings = create_train_state(modeldef, tx, mesh_lib.current_mesh(), mesh_lib.current_rules(), seed)
    found.append(shardings)
    return state

  shapes = jax.eval_shape(init)
  return modeldef, abstract_with_shardings(found[0], shapes), found[0]


def grpo_target(config, gcfg, model_fn, rows: int, width: int, temperature: float,
                extra: Mapping[str, tuple] | None = None, row_bucket: int = 1) -> Target:
  """The GRPO policy update `jaxlab.posttrain.trainers.grpo` jits (`trainers.grpo_update_step`: the loss
  accumulated over grpo.micro_batches, the optimizer over train.num_steps x num_iterations updates) on
  one step's rollout batch (`grpo_logps_target` gives the log-prob pass on that batch).

  Args:
    config: the experiment's config (train.optimizer, train.num_steps, seed).
    gcfg: its `GRPOConfig` (beta > 0 adds reference log-probs, num_iterations > 1 old-policy log-probs).
    model_fn: `rngs -> nnx.Module`, the policy.
    rows: completion rows of one step (prompts x generations), padded as `trainers.grpo` pads them: to a multiple
      of lcm(row_bucket, data split x grpo.micro_batches).
    width: tokens per row.
    temperature: the sampling temperature the loss rescales logits by.
    extra: further per-row inputs `{name: (shape after the row axis, dtype)}` (e.g. a VLM's frames).
    row_bucket: the rollout's `RolloutSpec.row_bucket`.
  """
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-import
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.posttrain import trainers  # pylint: disable=g-import-not-at-top
  from jaxlab.train import optim  # pylint: disable=g-import-not-at-top
  tx, schedule = optim.make_optimizer(config.train.optimizer, config.train.num_steps * gcfg.num_iterations)
  modeldef, state, shardings = abstract_state(model_fn, tx, config.seed)
  bsh = mesh_lib.batch_sharding()
  micro = gcfg.micro_batches
  update = trainers.grpo_update_step(modeldef, gcfg, temperature, tx, schedule, shardings, bsh, micro)
  rows = rows + (-rows % math.lcm(row_bucket, mesh_lib.data_split() * micro))   # `trainers.grpo`'s rows_multiple
  i32, f32 = (jax.ShapeDtypeStruct((rows, width), t, sharding=bsh) for t in (jnp.int32, jnp.float32))
  batch = {"tokens": i32, "positions": i32, "segment_ids": i32, "loss_mask": f32,
           "advantages": jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=bsh)}
  if gcfg.beta > 0:
    batch["ref_logps"] = f32
  if gcfg.num_iterations > 1:
    batch["old_logps"] = f32
  for k, (shape, dtype) in (extra or {}).items():
    batch[k] = jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=bsh)
  return Target("grpo_update", update, (state, batch), state=state)


def grpo_logps_target(gcfg, update: Target, model_fn, temperature: float) -> Target:
  """The reference / old-policy log-prob pass `trainers.grpo` runs on the update's batch before the update
  (`grpo.make_logps_fn`, micro-batched as the update is), on the update's sharded parameters."""
  from jaxlab.posttrain.grpo import make_logps_fn  # pylint: disable=g-import-not-at-top
  from jaxlab.state import ModelDef  # pylint: disable=g-import-not-at-top
  fn = make_logps_fn(ModelDef(model_fn), temperature, gcfg.micro_batches).jitted
  state = update.args[0]
  inputs = {k: v for k, v in update.args[1].items() if k not in ("ref_logps", "old_logps")}
  return Target("grpo_logps", fn, (state.params, state.model_state, inputs), state=state.params)


def lm_sample_target(train: Target, model_fn, batch: int, prompt_len: int, max_new_tokens: int,
                     temperature: float, bucket: int = 16) -> Target:
  """The KV-cache sampler's program (`jaxlab.lm.sampler`: prefill + decode loop, as a rollout calls it) for
  `batch` contexts of `prompt_len` tokens on the train target's sharded parameters; the cache holds prompt_len
  rounded up to `bucket` + max_new_tokens slots. Its bytes accessed count the decode loop's body once."""
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-import
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.lm import sampler  # pylint: disable=g-import-not-at-top
  mesh = mesh_lib.current_mesh()
  multi = mesh_lib.multi_device(mesh)
  batch = batch + (-batch % mesh_lib.data_split())
  max_len = -(-prompt_len // bucket) * bucket + max_new_tokens

  def fn(model, left, lengths):
    graphdef, state = nnx.split(model)
    return sampler._generate_impl(  # pylint: disable=protected-access
        graphdef, state, left, lengths, jnp.asarray([0], jnp.int32), jnp.float32(temperature), jnp.float32(1.0),
        jax.random.key(0), max_new_tokens=max_new_tokens, max_len=max_len, greedy=False, top_k=0,
        use_top_p=False, pad_id=0, mesh=mesh if multi else None,
        batch_spec=mesh_lib.batch_spec(mesh=mesh) if multi else None)

  args = (jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32))
  return forward_target("rollout_sample", train, model_fn, fn, args)


def grpo_lm_targets(config, gcfg) -> list[Target]:
  """A decoder-only GRPO config's targets: the update on one step's train.batch_size x grpo.num_generations rows
  of data.seq_len tokens (a prompt of up to seq_len - grpo.max_new_tokens tokens + its completion) and the
  sampler that draws those completions, plus the log-prob pass when the loss needs reference or old log-probs;
  the model from `lm_model_config`."""
  from jaxlab.lm.model import Transformer  # pylint: disable=g-import-not-at-top
  mcfg = lm_model_config(config)
  g = config.grpo
  model_fn = lambda rngs: Transformer(mcfg, rngs=rngs)  # noqa: E731
  rows, width = int(config.train.batch_size) * int(g.num_generations), int(config.data.seq_len)
  new = int(g.max_new_tokens)
  train = grpo_target(config, gcfg, model_fn, rows, width, float(g.temperature))
  n = num_params(train)
  # 6 N per token + attention (forward + backward) over every row token, padding included (the step sees it)
  train.model_flops = transformer_flops(n, math.prod(train.args[1]["tokens"].shape), mcfg.n_layers, width, mcfg.hidden)
  sample = lm_sample_target(train, model_fn, rows, width - new, new, float(g.temperature))
  sample.model_flops = lm_sample_flops(mcfg, n, sample.args[1].shape[0], width - new, new)
  targets = [train, sample]
  if gcfg.beta > 0 or gcfg.num_iterations > 1:
    logps = grpo_logps_target(gcfg, train, model_fn, float(g.temperature))
    logps.model_flops = train.model_flops / 3
    targets.append(logps)
  return targets


def lm_sample_flops(mcfg, n: int, batch: int, prompt_len: int, new: int, bucket: int = 16) -> float:
  """Forward FLOPs of one rollout: 2 x the matmul parameters per prompt and generated token (the token table is
  a lookup; the head runs only where a token is drawn: the last prompt position and each decoding step), plus
  attention scores over the cache's slots (4 L S d per token, S = the cache length)."""
  table = mcfg.vocab_size * mcfg.hidden
  body = n - table * (1 if mcfg.tie_embeddings else 2)
  cache = -(-prompt_len // bucket) * bucket + new
  tokens = batch * (prompt_len + new)
  return 2.0 * body * tokens + 2.0 * table * batch * (new + 1) + 4.0 * mcfg.n_layers * cache * mcfg.hidden * tokens


def forward_target(name: str, train: Target, model_fn, fn, args: Sequence[Any], *,
                   model_flops: float | None = None) -> Target:
  """An inference step (sampling, evaluation) on the parameters of a train target, as the run shards them.

  Args:
    name: e.g. "sample_step".
    train: the experiment's `train_target` (its abstract state gives the parameters and their shardings).
    model_fn: `rngs -> nnx.Module`, the same as the train target's.
    fn: `(model, *args) -> outputs`, traced under `jax.jit`.
    args: GLOBAL abstract arguments (`jax.ShapeDtypeStruct` or dicts of them); arrays are sharded over 'batch'
      along their first axis, scalars replicated.
    model_flops: analytic FLOPs of one call (all chips), for the MFU column.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.state import ModelDef  # pylint: disable=g-import-not-at-top
  md = ModelDef(model_fn)
  bsh, rep = mesh_lib.batch_sharding(), mesh_lib.replicated()
  params = {"params": train.state.params, "model_state": train.state.model_state}
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=bsh if s.shape else rep),
                          tuple(args))
  step = jax.jit(lambda p, *a: fn(md.merge(p["params"], p["model_state"]), *a))
  return Target(name, step, (params, *abstract), state=train.state.params, model_flops=model_flops)


def transformer_flops(num_params: int, tokens: int, layers: int, seq_len: int, width: int,
                      backward: bool = True) -> float:
  """Model FLOPs of a transformer step: 2 N per token forward plus attention scores 4 L S d per token
  (Kaplan et al. 2020, Table 1; PaLM's MFU, Chowdhery et al. 2022, App. B), x3 with the backward pass."""
  fwd = 2.0 * num_params * tokens + 4.0 * layers * seq_len * width * tokens
  return 3 * fwd if backward else fwd


def num_params(target: Target) -> int:
  """Parameters of a target's abstract state (for analytic FLOPs)."""
  params = getattr(target.state, "params", target.state)
  return int(sum(math.prod(x.shape) for x in _leaves(params)))


# The shape of a public checkpoint the LM experiments' full variants fine-tune when no --config.model.hf_path
# is given to compile_check (meta-llama/Llama-3.2-1B, its config.json on the Hugging Face Hub: 1.24 B parameters).
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def lm_model_config(config):
  """The `TransformerConfig` a full LM config trains: config.json of `config.model.hf_path` when set (read
  only: no weights), else `LLAMA_3_2_1B`, with the config's dtype and remat."""
  from jaxlab.lm import hf  # pylint: disable=g-import-not-at-top
  m = config.model
  return hf.config_from_hf(m.hf_path or LLAMA_3_2_1B, dtype=m.dtype, remat=bool(m.get("remat", False)))


def lm_batch(batch_size: int, seq_len: int) -> dict[str, Any]:
  """The abstract global batch of the LM trainers (`jaxlab.lm.sft_data`: packed rows)."""
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-import
  i32 = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
  return {"inputs": i32, "targets": i32, "positions": i32, "segment_ids": i32,
          "loss_mask": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.float32)}


# ------------------------------------------------------------------------------------------- topologies


def parse_topology(name: str) -> tuple[str, str, str]:
  """`"v5p-64"` / `"v5e:2x2"` / `"h100:8"` -> (platform, generation, jax topology name or GPU count).

  Raises:
    ConfigError: on an unknown generation or a size with no standard slice shape.
  """
  text = name.strip().lower()
  m = re.fullmatch(r"(h100|h200|a100)[:x-](\d+)", text)
  if m:
    return "cuda", m.group(1), m.group(2)
  m = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)[:](\d+(?:x\d+){1,2})", text)
  if m:
    gen = "v5e" if m.group(1) == "v5litepod" else m.group(1)
    return "tpu", gen, f"{gen}:{m.group(2)}"
  m = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)-(\d+)", text)
  if m:
    gen = "v5e" if m.group(1) == "v5litepod" else m.group(1)
    count = int(m.group(2))
    per = CORES_PER_NAME[m.group(1)]
    chips, rem = divmod(count, per)
    grid = (_GRID_3D if TPU_CHIPS[gen][3] else _GRID_2D).get(chips)
    if rem or grid is None:
      sizes = sorted(k * per for k in (_GRID_3D if TPU_CHIPS[gen][3] else _GRID_2D))
      raise ConfigError(f"--topology {name}: no standard {gen} slice of that size; use one of "
                        f"{', '.join(f'{gen}-{s}' for s in sizes[:10])}, or a shape such as {gen}:2x2")
    return "tpu", gen, f"{gen}:{grid}"
  raise ConfigError(f"--topology {name!r}: use a TPU slice (v4-8, v5e-16, v5p-64, v6e-256, or a shape such as "
                    "v5e:2x2 / v5p:2x4x4) or GPUs (h100:8, h200:16, a100:8)")


def topology(name: str) -> Topology:
  """The devices and per-device limits of a topology (TPU through libtpu's compile-only client).

  Raises:
    ConfigError: unknown names; libtpu missing (says how to install it).
  """
  platform, gen, spec = parse_topology(name)
  if platform == "cuda":
    import jax  # pylint: disable=g-import-not-at-top
    hbm, tflops, gbps = GPUS[gen]
    n = int(spec)
    host = jax.devices("cpu")
    if len(host) < n:
      raise ConfigError(f"--topology {name}: lowering for {n} GPUs needs {n} host devices standing in for them "
                        f"({len(host)} here); run with XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return Topology(name, "cuda", gen, host[:n], n, hbm * GiB, tflops * 1e12, gbps * 1e9)
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec("libtpu") is None:
    raise ConfigError("TPU ahead-of-time compiles need libtpu's compile-only client: pip install -e \".[tpu-aot]\" "
                      "(installs jax[tpu]; no TPU is needed)")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  # Compile-only use: no TPU is opened, so skip libtpu's metadata-server query (it warns off GCE) and its
  # one-process lockfile (two checks at once, or a test beside a check, would otherwise fail with ABORTED).
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    devices = list(topologies.get_topology_desc(spec, platform="tpu").devices)
  except Exception as e:  # pylint: disable=broad-except  (libtpu's errors are RuntimeErrors / XlaRuntimeErrors)
    raise ConfigError(f"--topology {name}: libtpu could not describe {spec}: {str(e).splitlines()[0]}") from None
  hbm, tflops, gbps, three_d = TPU_CHIPS[gen]
  chips = math.prod(int(x) for x in spec.split(":")[1].split("x"))
  per_chip = len(devices) / chips   # v4's description has one device per TensorCore
  return Topology(name, "tpu", gen, devices, chips, hbm * GiB / per_chip, tflops * 1e12 / per_chip,
                  gbps * 1e9 / per_chip)


# ------------------------------------------------------------------------------------------- analysis


def shard_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of abstract arrays carrying shardings (unsharded leaves: whole)."""
  import jax  # pylint: disable=g-import-not-at-top
  total = 0
  for x in jax.tree.leaves(tree):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      continue
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    total += math.prod(shape) * x.dtype.itemsize
  return int(total)


def largest_leaves(tree: Any, k: int = 3) -> list[tuple[str, int]]:
  """The k largest per-device leaves of an abstract tree: [(path, bytes)]."""
  import jax  # pylint: disable=g-import-not-at-top
  out = []
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
      out.append((jax.tree_util.keystr(path, simple=True, separator="/"), math.prod(shape) * x.dtype.itemsize))
  return sorted(out, key=lambda kv: -kv[1])[:k]


_SHAPE = re.compile(r"\b(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|f8e4m3fn|f8e5m2|c64|c128)"
                    r"\[([0-9,]*)\]")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64,
         "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "f8e4m3fn": 8, "f8e5m2": 8, "c64": 64, "c128": 128}


def _shape_bytes(text: str) -> list[int]:
  return [math.prod(int(d) for d in dims.split(",") if d) * _BITS[t] // 8 for t, dims in _SHAPE.findall(text)]


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\((.*)\)\s+->\s+.*\{\s*$")
_PARAM = re.compile(r"([\w.\-]+):\s+(\w+)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s+=\s+(.*?)\s([a-z][a-z0-9\-_]*)\(([^)]*)\)(.*)$")
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]")


def _dims(text: str) -> list[int]:
  return [int(d) for d in text.split(",") if d]


def hlo_totals(hlo_text: str) -> dict[str, Any]:
  """Matrix-multiply FLOPs and collectives of an optimized HLO module, loop bodies weighted by trip count.

  XLA's `cost_analysis()` counts a while loop's body once (scanned layers: once for all of them); here the
  call graph is walked from the entry computation and a body with a known trip count (XLA's
  `known_trip_count` backend config) is counted that many times, and a conditional as its costliest branch
  (chunked attention skips masked blocks with `lax.cond`: counted as computed, as model FLOPs count them).
  Counted: `dot` and `convolution` (TPU rewrites dots as convolutions), 2 x output elements x contracted size;
  elementwise work is left out.

  Returns:
    {"matmul_flops": per-device FLOPs, "collectives": {kind: {"count", "bytes"}}, "loops": [trip counts]}.
  """
  comps: dict[str, list] = {}
  consts: dict[str, list[int]] = {}
  entry, current, shapes = None, None, {}
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      current = m.group(1)
      comps[current] = []
      shapes = {n: (t, _dims(d)) for n, t, d in _PARAM.findall(m.group(2))}
      if line.startswith("ENTRY"):
        entry = current
      continue
    m = _INSTR.match(line) if current else None
    if not m:
      continue
    name, shape, op, args, attrs = m.groups()
    arr = _ARRAY.match(shape)
    if arr:
      shapes[name] = (arr.group(1), _dims(arr.group(2)))
    operands = [shapes.get(a) for a in re.findall(r"%([\w.\-]+)", args)]
    flops = 0.0
    if op in ("dot", "convolution") and arr and len(operands) >= 2 and operands[0] and operands[1]:
      out = math.prod(_dims(arr.group(2)))
      if op == "dot":
        cd = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
        k = math.prod(operands[0][1][i] for i in _dims(cd.group(1))) if cd else 1
      else:
        # input features x the window taps that meet real input: TPU writes batched matmuls as convolutions
        # whose batch dims are windows over an input dilated by the window size (one tap each)
        # (and heads as windows over a padded size-1 input): a window dim counts the taps on real input
        labels = re.search(r"dim_labels=(\w+)_(\w+)->", attrs)
        kernel = operands[1][1]
        k = math.prod(d for d, c in zip(kernel, labels.group(2)) if c == "i") if labels else 1
        size = re.search(r"size=([\dx]+)", attrs)
        dilate = re.search(r"lhs_dilate=([\dx]+)", attrs)
        sizes = [int(v) for v in size.group(1).split("x")] if size else []
        dil = [int(v) for v in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
        for i, (w, d) in enumerate(zip(sizes, dil)):
          pos = labels.group(1).find(str(i)) if labels else -1
          extent = (operands[0][1][pos] - 1) * d + 1 if 0 <= pos < len(operands[0][1]) else w
          k *= -(-min(w, extent) // d)
      flops = 2.0 * out * k
    coll = None
    if op in COLLECTIVES or (op.endswith("-start") and op[:-6] in COLLECTIVES):
      sizes = _shape_bytes(shape)
      if op.endswith("-start") and len(sizes) > 1 and len(sizes) % 2 == 0:
        sizes = sizes[len(sizes) // 2:]
      coll = (op.removesuffix("-start"), int(sum(sizes)))
    calls = re.findall(r"calls=%([\w.\-]+)", attrs)
    trip = 1
    if op == "while":
      calls = re.findall(r"body=%([\w.\-]+)", attrs)
      t = re.search(r'known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', attrs)
      cond = re.search(r"condition=%([\w.\-]+)", attrs)
      trip = int(t.group(1)) if t else (cond.group(1) if cond else 1)   # else: the bound in its condition
    if op == "conditional":   # one branch runs: counted as the costliest (e.g. a causal block skipped by lax.cond)
      listed = re.search(r"branch_computations=\{([^}]*)\}", attrs)
      calls = (re.findall(r"%([\w.\-]+)", listed.group(1)) if listed
               else re.findall(r"(?:true|false)_computation=%([\w.\-]+)", attrs))
      trip = "branches"
    if op == "constant" and re.fullmatch(r"-?\d+", args.strip()) and shape.startswith(("s32[]", "s64[]")):
      consts.setdefault(current, []).append(int(args))
    comps[current].append((flops, coll, calls, trip))

  memo: dict[str, tuple] = {}

  def total(comp: str, depth: int = 0):
    if comp in memo:
      return memo[comp]
    flops, colls, loops = 0.0, {}, []
    for f, coll, calls, trip in comps.get(comp, ()) if depth < 64 else ():
      if trip == "branches":
        calls, trip = ([max(calls, key=lambda c: total(c, depth + 1)[0])] if calls else []), 1
      if isinstance(trip, str):   # a scan's counter runs from 0 below the constant its condition compares with
        trip = max(consts.get(trip, [1]) + [1])
      flops += f
      if coll:
        e = colls.setdefault(coll[0], {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += coll[1]
      if trip > 1:
        loops.append(trip)
      for callee in calls:
        cf, cc, cl = total(callee, depth + 1)
        flops += trip * cf
        loops += cl
        for kind, e in cc.items():
          mine = colls.setdefault(kind, {"count": 0, "bytes": 0})
          mine["count"] += trip * e["count"]
          mine["bytes"] += trip * e["bytes"]
    memo[comp] = (flops, colls, loops)
    return memo[comp]

  flops, colls, loops = total(entry) if entry else (0.0, {}, [])
  return {"matmul_flops": flops, "collectives": colls, "loops": loops}


def _cost(compiled) -> dict[str, float]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = cost or {}
  return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


def check_target(target: Target, topo: Topology, margin: float = 0.1) -> dict[str, Any]:
  """Lowers (and on TPU compiles) one target; returns its per-device report."""
  row: dict[str, Any] = {"target": target.name, "topology": topo.name, "devices": topo.num_devices,
                         "chips": topo.chips, "hbm_bytes": topo.hbm_bytes}
  if target.state is not None:
    params = getattr(target.state, "params", target.state)
    opt = getattr(target.state, "opt_state", None)
    row["num_params"] = int(sum(math.prod(x.shape) for x in _leaves(params)))
    row["param_bytes"] = shard_bytes(params)
    row["opt_bytes"] = shard_bytes(opt) if opt is not None else 0
  if topo.platform == "cuda":
    lowered = target.fn.trace(*target.args).lower(lowering_platforms=("cuda",))
    row["lowered"] = bool(lowered.as_text())
    grads = row.get("param_bytes", 0)
    row["total_bytes"] = row.get("param_bytes", 0) + row.get("opt_bytes", 0) + grads
    row["estimate"] = "parameters + gradients + optimizer state; activations not estimated"
    row["fits"] = row["total_bytes"] <= topo.hbm_bytes * (1 - margin)
    return row
  lowered = target.fn.lower(*target.args)
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    # XLA refuses a program whose temporaries exceed the HBM: report it as not fitting, with its numbers.
    m = re.search(r"temporaries \(([\d.]+)([KMGT]?)\)", str(e))
    if "RESOURCE_EXHAUSTED" not in str(e) or m is None:
      raise
    temp = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")
    compiled = None
    row.update(argument_bytes=shard_bytes(target.args), output_bytes=0, alias_bytes=0, temp_bytes=int(temp),
               code_bytes=0, compile_error=str(e).strip().splitlines()[0])
  else:
    mem = compiled.memory_analysis()
    row.update(argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
               alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
               code_bytes=int(mem.generated_code_size_in_bytes))
  row["total_bytes"] = (row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
                        + row["code_bytes"])
  row["fits"] = compiled is not None and row["total_bytes"] <= topo.hbm_bytes * (1 - margin)
  if not row["fits"]:
    row["advice"] = advice(row, target, topo, margin)
  if compiled is None:
    return row
  cost = _cost(compiled)
  text = compiled.as_text()
  totals = hlo_totals(text)
  # Pallas / Mosaic kernels in the program (splash attention, the selective scan, ...): a custom call each
  row["kernels"] = len(re.findall(r'custom_call_target="tpu_custom_call"', text))
  row["xla_flops"], row["bytes_accessed"] = cost["flops"], cost["bytes"]
  row["matmul_flops"], row["loops"] = totals["matmul_flops"], totals["loops"]
  row["flops"] = max(cost["flops"], totals["matmul_flops"])   # XLA's count has each loop body once
  if row["kernels"] and target.model_flops:
    # a Pallas kernel is one opaque custom call to XLA's count (splash attention's FLOPs are not in it): the
    # bound takes at least the analytic model FLOPs, so MFU at the bound cannot pass 100%
    row["flops"] = max(row["flops"], float(target.model_flops) / topo.num_devices)
  t_flops, t_bytes = row["flops"] / topo.peak_flops, cost["bytes"] / topo.hbm_bw
  row["step_s_lower_bound"] = max(t_flops, t_bytes)
  row["bound"] = "compute" if t_flops >= t_bytes else "memory"
  if target.model_flops and row["step_s_lower_bound"] > 0:
    row["model_flops"] = float(target.model_flops)
    row["mfu_at_bound"] = target.model_flops / (topo.num_devices * topo.peak_flops * row["step_s_lower_bound"])
  row["collectives"] = totals["collectives"]
  return row


def _leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return [x for x in jax.tree.leaves(tree) if hasattr(x, "shape")]


def advice(row: Mapping[str, Any], target: Target, topo: Topology, margin: float) -> str:
  """One line for a target that does not fit: the largest buffers and a remedy."""
  limit = topo.hbm_bytes * (1 - margin)
  parts = [f"{target.name} needs {row['total_bytes'] / GiB:.1f} GiB per device of {limit / GiB:.1f} GiB "
           f"({topo.name}, {margin:.0%} margin)"]
  state_b = row.get("param_bytes", 0) + row.get("opt_bytes", 0)
  temp = row.get("temp_bytes", 0)
  big = largest_leaves(target.state) if target.state is not None else []
  if big:
    parts.append("largest state buffers " + ", ".join(f"{p} {b / GiB:.2f} GiB" for p, b in big))
  parts.append(f"activations (temporaries) {temp / GiB:.2f} GiB")
  fixes = []
  if state_b >= temp or state_b > limit / 2:
    fixes.append("shard parameters and optimizer state over the data axis (--config.sharding_rules=fsdp) or use "
                 "a larger slice")
  if temp > state_b or temp > limit / 2:
    fixes.append("rematerialise activations (the model's remat option) or lower the per-chip batch "
                 "(--config.train.batch_size)")
  parts.append("remedy: " + "; and ".join(fixes))
  return "; ".join(parts)


@contextlib.contextmanager
def target_backend(platform: str):
  """While tracing for a target platform, `jax.default_backend()` answers that platform ("tpu"; "gpu" for
  "cuda"), so every choice the library makes by backend is the target's, not this host's: attention's "auto"
  takes the splash / cuDNN / Triton kernels, Pallas kernels lower compiled (not in interpret mode) and the
  selective scan takes its accelerator path. JAX itself reads its backends directly, so only those choices move."""
  import jax  # pylint: disable=g-import-not-at-top
  name = {"cuda": "gpu"}.get(platform, platform)
  saved = jax.default_backend
  jax.default_backend = lambda: name
  try:
    yield
  finally:
    jax.default_backend = saved


def check(config, topo: Topology, targets_fn: Callable[[Any], Sequence[Target]], margin: float = 0.1) -> list[dict]:
  """Builds the config's mesh over the topology's devices and checks every target `targets_fn(config)` gives,
  traced as on the target platform (`target_backend`)."""
  from jaxlab import configs, mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  configs.check_devices(config, topo.num_devices)
  with mesh_lib.use_config(config, topo.devices) as mesh, target_backend(topo.platform):
    rows = []
    for target in targets_fn(config):
      row = check_target(target, topo, margin)
      row["mesh"] = dict(mesh.shape)
      rows.append(row)
  return rows


def format_row(exp: str, row: Mapping[str, Any]) -> str:
  """A human-readable block for one target."""
  g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
  lines = [f"{exp} {row['target']} on {row['topology']} ({row['devices']} devices, mesh {row.get('mesh')}): "
           f"{'FITS' if row['fits'] else 'DOES NOT FIT'}"]
  if "num_params" in row:
    lines.append(f"  parameters {row['num_params'] / 1e6:.1f} M; per device: params {g(row['param_bytes'])}, "
                 f"optimizer {g(row['opt_bytes'])}")
  if "temp_bytes" in row:
    lines.append(f"  compiled per device: arguments {g(row['argument_bytes'])}, outputs {g(row['output_bytes'])} "
                 f"(aliased {g(row['alias_bytes'])}), activations/temporaries {g(row['temp_bytes'])}; total "
                 f"{g(row['total_bytes'])} of {g(row['hbm_bytes'])} HBM")
    if row.get("compile_error"):
      lines.append(f"  XLA refused it: {row['compile_error']}")
    else:
      loops = f" (loops x{'/'.join(map(str, sorted(set(row['loops']))))} counted)" if row.get("loops") else ""
      lines.append(f"  per device per step: {row['flops'] / 1e12:.3f} TFLOP{loops}, "
                   f"{row['bytes_accessed'] / 1e9:.2f} GB accessed; "
                   f"step >= {row['step_s_lower_bound'] * 1e3:.2f} ms ({row['bound']}-bound)"
                   + (f"; MFU at that bound {row['mfu_at_bound']:.0%}" if "mfu_at_bound" in row else ""))
      if row.get("kernels"):
        lines.append(f"  Pallas (Mosaic) kernels in the program: {row['kernels']}")
      coll = row.get("collectives") or {}
      lines.append("  collectives: " + (", ".join(f"{k} x{v['count']} ({v['bytes'] / 2**20:.1f} MiB)"
                                                  for k, v in sorted(coll.items())) or "none"))
  else:
    lines.append(f"  lowered for CUDA: {row.get('lowered')}; estimate per GPU {g(row['total_bytes'])} of "
                 f"{g(row['hbm_bytes'])} ({row.get('estimate')})")
  if "advice" in row:
    lines.append("  " + row["advice"])
  return "\n".join(lines)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """The README's table of full configs, one row per target (`--markdown`)."""
  g = lambda b: f"{b / GiB:.2f}"  # noqa: E731
  out = ["| config | target | topology | parameters | per-chip memory, GiB (params + optimizer / total of HBM) | fits "
         "| step-time lower bound | MFU at the bound |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "skipped" in r:
      out.append(f"| `{r['experiment']}:full` | skipped | {r['topology']} | | | **no** | {r['skipped']} | |")
      continue
    mem = (f"{g(r.get('param_bytes', 0))} + {g(r.get('opt_bytes', 0))} / {g(r['total_bytes'])} "
           f"of {r['hbm_bytes'] / GiB:.0f}")
    bound = (f"{r['step_s_lower_bound'] * 1e3:.3g} ms ({r['bound']})" if "step_s_lower_bound" in r
             else "n/a (not compiled)")
    mfu = f"{r['mfu_at_bound']:.0%}" if "mfu_at_bound" in r else "n/a"
    params = f"{r['num_params'] / 1e6:,.1f} M" if "num_params" in r else ""
    out.append(f"| `{r.get('experiment', '')}:full` | {r['target']} | {r['topology']} | {params} | {mem} | "
               f"{'yes' if r['fits'] else '**no**'} | {bound} | {mfu} |")
  return "\n".join(out)


def aot_module(exp):
  """An experiment's aot.py (`compile_targets(config)`, `TOPOLOGY`), or None when it has none.

  A separate file because claims never import it: `jaxlab.ledger` leaves it out of a claim's sources, so
  wiring or changing a compile target does not make the experiment's claims stale.
  """
  import importlib, importlib.util  # pylint: disable=g-import-not-at-top,multiple-import
  name = f"{exp.package}.aot"
  return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


def run(config_spec: str | None, topology_name: str | None, overrides=(), margin: float = 0.1,
        all_experiments: bool = False) -> list[dict]:
  """Checks one config (or every experiment with an aot.py); returns the rows (one per target)."""
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  if all_experiments:
    specs = [f"{name}:full" for name in registry.names() if aot_module(registry.load(name)) is not None]
  else:
    if not config_spec:
      raise ConfigError("give --config experiments/<paper>/config.py:full (or --all)")
    specs = [config_spec]
  rows = []
  for spec in specs:
    exp, config = registry.load_config(spec, overrides if not all_experiments else ())
    aot = aot_module(exp)
    if aot is None or not hasattr(aot, "compile_targets"):
      raise ConfigError(f"{exp.name} declares no compile targets: add experiments/{exp.name}/aot.py with "
                        "compile_targets(config) and TOPOLOGY (see experiments/quickstart/aot.py)")
    if all_experiments and getattr(aot, "KNOWN_ISSUE", None):   # e.g. a program libtpu does not finish compiling
      row = {"experiment": exp.name, "target": "(skipped)", "topology": getattr(aot, "TOPOLOGY", ""), "fits": False,
             "skipped": aot.KNOWN_ISSUE}
      print(f"{exp.name}: skipped by --all: {aot.KNOWN_ISSUE}", flush=True)
      rows.append(row)
      continue
    name = topology_name or getattr(aot, "TOPOLOGY", None)
    if not name:
      raise ConfigError(f"{exp.name}: give --topology (its aot.py names no TOPOLOGY)")
    for row in check(config, topology(name), aot.compile_targets, margin):
      row["experiment"] = exp.name
      print(format_row(exp.name, row), flush=True)
      rows.append(row)
  return rows


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(prog="python -m jaxlab.compile_check", description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", help="experiments/<paper>/config.py:full (or <paper>:full)")
  parser.add_argument("--topology", help="v5p-64, v5e-16, v4-32, v6e-256, v5e:2x2, or h100:8 (default: the "
                      "experiment's aot.TOPOLOGY)")
  parser.add_argument("--all", action="store_true", help="every experiment with an aot.py")
  parser.add_argument("--margin", type=float, default=0.1, help="HBM fraction kept free (default 0.1)")
  parser.add_argument("--json", help="also write the rows as JSON here")
  parser.add_argument("--markdown", action="store_true", help="also print the rows as the README's table")
  args = parser.parse_args(argv)
  if not 0 <= args.margin < 1:
    raise ConfigError(f"--margin {args.margin}: give a fraction in [0, 1), e.g. 0.1")
  rows = run(args.config, args.topology, overrides, args.margin, args.all)
  if args.json:
    with open(args.json + ".tmp", "w") as f:
      json.dump(rows, f, indent=1, default=str)
    os.replace(args.json + ".tmp", args.json)
  if args.markdown:
    print(markdown(rows))
  return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
  # Compile-only: the local backend is never used (TPU programs come from libtpu's compile-only client, GPU
  # lowerings run on host devices), so a machine with libtpu installed does not try to open a TPU first.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  cli.main_wrapper(main)
