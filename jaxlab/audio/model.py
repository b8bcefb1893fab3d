"""A text-to-spectrogram diffusion model: the DiT core over a (freq, time) spectrogram with cross-attention to
instrument tokens, and a hook for attention controllers.

The spectrogram (B, F, T) is one DiT stream of one channel (H = frequency, W = time), cut into patch x patch
tokens on a (F / patch, T / patch) grid in row-major order (token r * (T / patch) + c covers frequency bins
r p .. r p + p - 1 and frames c p .. c p + p - 1; `token_map` pools a (F, T) map to that order). The prompt is a
short sequence of instrument tokens (ids into `vocab`; -1 pads) embedded by a table with one extra row, the null
token (`null_id`), whose one-token prompt is the unconditional branch of classifier-free guidance. Each block
cross-attends to the prompt (`jaxlab.nn.dit.Block`: zero-initialised output, pre-softmax logits through a hook).

The network is a discrete-time denoiser (`jaxlab.diffusion.ddpm`): the DiT's timestep embedder sees t / T.
`controller` (`jaxlab.diffusion.controllers`) is called per block with the block index, the timesteps and a
context dict; without one the DiT gets no hook (outputs identical to an uncontrolled call). Controllers need the
blocks unrolled (`scan_layers=False`, the default here).

Text-to-audio models of this kind (AudioLDM 2, Liu et al. 2024) run a latent-diffusion UNet over mel-VAE latents
with cross-attention to text embeddings; at our scale the instrument tokens stand in for the text and the
spectrogram is modelled directly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.diffusion import controllers as ctl
from jaxlab.diffusion import ddpm
from jaxlab.errors import ConfigError, DataError
from jaxlab.nn import dit, layers


@dataclasses.dataclass(frozen=True)
class SpecConfig:
  """Architecture of a `TextToSpec` (frozen, hashable).

  Attributes:
    freq, frames: spectrogram size (F, T); both multiples of `patch`.
    patch: token patch size.
    vocab: instrument token ids 0 .. vocab-1 (the null token is id `vocab`).
    max_tokens: prompt length (shorter prompts are padded with -1).
    hidden, depth, heads, mlp_ratio, bottleneck, freq_dim: the DiT trunk (`jaxlab.nn.dit.DiTConfig`).
    num_train_steps: T of the noise schedule (the timestep embedder sees t / T).
    pooled: also add the prompt's pooled embedding (mean of its token embeddings, then a linear map) to the
      adaLN conditioning beside the timestep, as SDXL / Stable Audio add pooled text embeddings; the cross-
      attention still carries the per-token (and per-region) conditioning the controllers act on.
    dtype, attention, scan_layers, remat: as in `DiTConfig` (controllers need scan_layers=False).
  """
  freq: int = 32
  frames: int = 32
  patch: int = 4
  vocab: int = 5
  max_tokens: int = 3
  hidden: int = 64
  depth: int = 4
  heads: int = 4
  mlp_ratio: float = 4.0
  bottleneck: int = 32
  freq_dim: int = 64
  num_train_steps: int = 1000
  pooled: bool = True
  dtype: str = "float32"
  attention: str = "xla"
  scan_layers: bool = False
  remat: bool = False

  def __post_init__(self):
    if self.freq % self.patch or self.frames % self.patch:
      raise ConfigError(f"SpecConfig: freq={self.freq} and frames={self.frames} must be multiples of "
                        f"patch={self.patch}")
    if self.vocab < 1 or self.max_tokens < 1:
      raise ConfigError(f"SpecConfig: vocab={self.vocab} and max_tokens={self.max_tokens} must be >= 1")

  @property
  def grid(self) -> tuple[int, int]:
    return (self.freq // self.patch, self.frames // self.patch)

  @property
  def null_id(self) -> int:
    return self.vocab

  def dit(self) -> dit.DiTConfig:
    return dit.DiTConfig(streams={"spec": (1, self.patch)}, grid=self.grid, hidden=self.hidden, depth=self.depth,
                         heads=self.heads, mlp_ratio=self.mlp_ratio, bottleneck=self.bottleneck, num_classes=0,
                         class_tokens=0, in_context_start=0, context_dim=self.hidden, freq_dim=self.freq_dim,
                         dtype=self.dtype, attention=self.attention, scan_layers=self.scan_layers,
                         remat=self.remat)


class _PromptDiT(dit.DiT):
  """The DiT core with the label embedding replaced by a given (B, hidden) conditioning vector: `y` is that
  vector (the pooled prompt) instead of class ids (the model has no class tokens, so `y` is used only here)."""

  def condition(self, t, y):
    cond = jnp.asarray(y, jnp.float32)
    for n, _, _ in self.config.streams:
      cond = cond + self.t_embed[n](jnp.asarray(t[n])).astype(jnp.float32)
    return cond


class TextToSpec(nnx.Module):
  """Denoiser `(x (B, F, T), t (B,) int, tokens (B, S) int) -> (B, F, T)` (see the module docstring)."""

  def __init__(self, config: SpecConfig, *, rngs: nnx.Rngs):
    self.config = config
    with nnx.use_eager_sharding(False):
      self.net = _PromptDiT(config.dit(), rngs=rngs)
      self.tokens = layers.embed(config.vocab + 1, config.hidden, names=(None, "embed"),
                                 init=layers.normal(0.02), rngs=rngs)
      self.pool = (layers.dense(config.hidden, config.hidden, names=("embed", None), kernel_init=layers.normal(0.02),
                                rngs=rngs) if config.pooled else None)

  def __call__(self, x: jax.Array, t: jax.Array, tokens: jax.Array, *, controller: ctl.Controller | None = None,
               ctx: dict | None = None, self_controller: ctl.Controller | None = None) -> jax.Array:
    """`controller` / `self_controller`: attention controllers (`jaxlab.diffusion.controllers`) of every block's
    cross- / self-attention logits, both seeing `ctx` and the block index; with neither, no hook is passed."""
    c = self.config
    if x.ndim != 3 or tuple(x.shape[1:]) != (c.freq, c.frames):
      raise DataError(f"TextToSpec: x must be (batch, {c.freq}, {c.frames}) spectrograms, got {tuple(x.shape)}")
    if tokens.ndim != 2 or tokens.shape[0] != x.shape[0]:
      raise DataError(f"TextToSpec: tokens must be (batch={x.shape[0]}, length) ids, got {tuple(tokens.shape)}")
    if (controller is not None or self_controller is not None) and c.scan_layers:
      raise ConfigError("TextToSpec: attention controllers need SpecConfig(scan_layers=False) (blocks unrolled)")
    tokens = jnp.asarray(tokens, jnp.int32)
    context = self.tokens(jnp.maximum(tokens, 0))
    hook = None if controller is None else ctl.LayerHook(controller, t, ctx)
    self_hook = None if self_controller is None else ctl.LayerHook(self_controller, t, ctx)
    t = jnp.asarray(t)
    mask = tokens >= 0
    if self.pool is not None:
      w = mask.astype(jnp.float32)[..., None]
      pooled = self.pool(jnp.sum(context.astype(jnp.float32) * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0))
    else:
      pooled = jnp.zeros((x.shape[0], c.hidden), jnp.float32)
    out = self.net({"spec": x[..., None]}, {"spec": t.astype(jnp.float32) / c.num_train_steps}, pooled,
                   context=context, context_mask=mask, logit_hook=hook,
                   **({} if self_hook is None else {"self_logit_hook": self_hook}))
    return out["spec"][..., 0]


def encode_prompts(prompts: Sequence[Sequence[int]], config: SpecConfig) -> np.ndarray:
  """(B, max_tokens) int32 prompt ids padded with -1; an empty prompt is the null prompt."""
  out = np.full((len(prompts), config.max_tokens), -1, np.int32)
  for i, p in enumerate(prompts):
    p = [int(j) for j in p] or [config.null_id]
    if len(p) > config.max_tokens or min(p) < 0 or max(p) > config.null_id:
      raise DataError(f"prompt {i} = {p}: at most {config.max_tokens} ids in [0, {config.null_id}] "
                      f"({config.null_id} = null)")
    out[i, :len(p)] = p
  return out


def null_prompts(n: int, config: SpecConfig) -> np.ndarray:
  """(n, max_tokens) null prompts (the unconditional branch)."""
  return encode_prompts([[]] * n, config)


def drop_prompts(key: jax.Array, tokens: jax.Array, rate: float, config: SpecConfig) -> jax.Array:
  """Prompts replaced by the null prompt with probability `rate` each (classifier-free training)."""
  drop = jax.random.uniform(key, (tokens.shape[0],)) < rate
  null = jnp.full(tokens.shape, -1, jnp.int32).at[:, 0].set(config.null_id)
  return jnp.where(drop[:, None], null, tokens)


def token_map(m: jax.Array, config: SpecConfig) -> jax.Array:
  """A (B, F, T) map averaged over each token's patch: (B, L) in the model's token order."""
  b = m.shape[0]
  gh, gw = config.grid
  p = config.patch
  return m.reshape(b, gh, p, gw, p).mean(axis=(2, 4)).reshape(b, gh * gw)


def denoiser(model: TextToSpec, tokens: jax.Array, *, controller: ctl.Controller | None = None,
             ctx: dict | None = None, self_controller: ctl.Controller | None = None):
  """`fn(x, t)` of the model at fixed prompts (for `jaxlab.diffusion.ddpm`)."""
  return lambda x, t: model(x, t, tokens, controller=controller, ctx=ctx, self_controller=self_controller)


def guided_denoiser(model: TextToSpec, tokens: jax.Array, scale, *, controller: ctl.Controller | None = None,
                    ctx: dict | None = None):
  """Classifier-free guidance with the null prompt (`jaxlab.diffusion.ddpm.cfg`); both branches in one batch,
  the controller seeing [cond; uncond]. `scale` a float or (B,)."""
  c = model.config
  if isinstance(scale, (int, float)) and float(scale) == 1.0:
    return denoiser(model, tokens, controller=controller, ctx=ctx)
  null = jnp.full(tokens.shape, -1, jnp.int32).at[:, 0].set(c.null_id)

  def fn(x, t):
    out = model(jnp.concatenate([x, x]), jnp.concatenate([t, t]), jnp.concatenate([tokens, null]),
                controller=controller, ctx=ctx)
    cond, uncond = jnp.split(out, 2)
    return ddpm.cfg(lambda *_: cond, lambda *_: uncond, scale)(x, t)
  return fn


def paired_guided_denoiser(model: TextToSpec, tokens: jax.Array, scale, *, controller: ctl.Controller | None = None,
                           ctx: dict | None = None, self_controller: ctl.Controller | None = None):
  """Classifier-free guidance on a [source; target] batch of 2P edit pairs, with the model's batch laid out as
  [source cond; source uncond; target cond; target uncond] so that a pair controller (`controllers.calibrate`,
  `controllers.inject_source`), which splits the batch into halves, sees the source branches in its first half
  and the matching target branches in its second. `scale` a float or (2P,) ([source scales; target scales]);
  `ctx` entries with a leading axis of P (per pair) are repeated for the two guidance branches.

  (`guided_denoiser` lays the batch out as [cond; uncond], which is what single-prompt controllers expect.)
  `self_controller` sees the self-attention logits in the same layout."""
  c = model.config

  def fn(x, t):
    b = x.shape[0]
    if b % 2:
      raise ConfigError(f"paired_guided_denoiser: the batch {b} must be [source; target] halves")
    p = b // 2
    null = jnp.full((p,) + tokens.shape[1:], -1, jnp.int32).at[:, 0].set(c.null_id)
    quarter = lambda a, n: jnp.concatenate([a[:p], n[:p], a[p:], n[p:]])
    pair_ctx = None if ctx is None else {
        k: (jnp.concatenate([v, v]) if hasattr(v, "shape") and v.ndim and v.shape[0] == p else v)
        for k, v in ctx.items()}
    out = model(quarter(x, x), quarter(t, t), jnp.concatenate([tokens[:p], null, tokens[p:], null]),
                controller=controller, ctx=pair_ctx, self_controller=self_controller)
    sc, su, tc, tu = jnp.split(out, 4)
    cond, uncond = jnp.concatenate([sc, tc]), jnp.concatenate([su, tu])
    return ddpm.cfg(lambda *_: cond, lambda *_: uncond, scale)(x, t)
  return fn
