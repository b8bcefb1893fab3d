"""A DreamerV3-style world model (Hafner et al., arXiv 2301.04104): a recurrent state-space model (RSSM) with a
GRU deterministic state h and a stochastic state z of `stoch` categoricals with `classes` classes each
(straight-through samples, 1% uniform mixing), an encoder and decoder for vectors (symlog) or 64x64 pixels,
a two-hot reward head, a continue head, and KL balancing with free bits.

    h_t = GRU(h_{t-1}, [z_{t-1}, a_{t-1}, e_k])             e_k: the task's embedding (a row of params["emb"])
    prior   p(z_t | h_t)          = img_out(h_t)
    posterior q(z_t | h_t, x_t)   = obs_out([h_t, enc(x_t)])
    heads on feat_t = [h_t, z_t, e_k]: decoder x_t, reward r_t (two-hot, symlog bins), continue c_t

Pure functions over a params pytree, so group models stack on a leading axis and train under one `vmap`;
paths are "gru/w", "enc/0/w", ... (`jaxlab.multitask.param_sharing`). `observe` runs the posterior over a
window with `lax.scan` and resets the state where `first` is set; `img_step` is one prior step (imagination).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxlab.rl.dreamer import dist, nets


@dataclasses.dataclass(frozen=True)
class WorldModelConfig:
  """Sizes of the world model.

  Attributes:
    obs_dim: vector observation size (zero-padded across tasks); ignored when `image_size` > 0.
    act_dim: action size (padded).
    num_tasks: rows of the task-embedding table.
    image_size: > 0 for pixel observations (image_size, image_size, 3) uint8 through the convolutional
      encoder and decoder.
    deter, stoch, classes: GRU width, number of categoricals and classes per categorical (DreamerV3: 32 x 32).
    hidden, layers: width and depth of the MLPs (encoder, heads).
    cnn_depth: channels of the first convolution (pixels only).
    emb: task-embedding size (0: no task conditioning).
    unimix, num_bins, free_nats, dyn_scale, rep_scale: DreamerV3's 0.01, 255, 1.0, 0.5, 0.1.
  """
  obs_dim: int
  act_dim: int
  num_tasks: int = 1
  image_size: int = 0
  deter: int = 512
  stoch: int = 32
  classes: int = 32
  hidden: int = 512
  layers: int = 2
  cnn_depth: int = 32
  emb: int = 8
  unimix: float = 0.01
  num_bins: int = 255
  free_nats: float = 1.0
  dyn_scale: float = 0.5
  rep_scale: float = 0.1

  @property
  def feat_dim(self) -> int:
    return self.deter + self.stoch * self.classes + self.emb


def init(key, c: WorldModelConfig) -> dict:
  """Fresh parameters: {"emb", "enc", "img_in", "gru", "img_out", "obs_out", "dec", "rew", "cont"}."""
  ks = iter(jax.random.split(key, 10))
  z = c.stoch * c.classes
  h = [c.hidden] * c.layers
  if c.image_size:
    enc = nets.conv_encoder_init(next(ks), c.cnn_depth)
    enc_out = nets.conv_encoder_out(c.cnn_depth, c.image_size)
    dec = nets.conv_decoder_init(next(ks), c.feat_dim, c.cnn_depth, image_size=c.image_size)
  else:
    enc = nets.mlp_init(next(ks), [c.obs_dim, *h])
    enc_out = c.hidden
    dec = nets.mlp_init(next(ks), [c.feat_dim, *h, c.obs_dim])
  return {
      "emb": 0.1 * jax.random.normal(next(ks), (c.num_tasks, max(c.emb, 1)))[:, :c.emb],
      "enc": enc,
      "img_in": nets.mlp_init(next(ks), [z + c.act_dim + c.emb, c.hidden]),
      "gru": nets.linear_init(next(ks), c.hidden + c.deter, 3 * c.deter),
      "img_out": nets.mlp_init(next(ks), [c.deter, c.hidden, z]),
      "obs_out": nets.mlp_init(next(ks), [c.deter + enc_out, c.hidden, z]),
      "dec": dec,
      "rew": nets.mlp_init(next(ks), [c.feat_dim, *h, c.num_bins], out_scale=0.0),
      "cont": nets.mlp_init(next(ks), [c.feat_dim, *h, 1]),
  }


def initial(c: WorldModelConfig, batch_shape=()) -> dict:
  """The state at the start of an episode: zeros."""
  return {"deter": jnp.zeros(tuple(batch_shape) + (c.deter,)),
          "stoch": jnp.zeros(tuple(batch_shape) + (c.stoch, c.classes))}


def feat(state: dict, e) -> jax.Array:
  """[h, z (flattened), e] for the heads, the actor and the critic."""
  z = state["stoch"].reshape(state["stoch"].shape[:-2] + (-1,))
  e = jnp.broadcast_to(e, z.shape[:-1] + e.shape[-1:])
  return jnp.concatenate([state["deter"], z, e], -1)


def encode(params: dict, c: WorldModelConfig, obs) -> jax.Array:
  """Embedding of observations (..., obs_dim) (symlog first) or (..., H, W, 3) uint8 images."""
  if c.image_size:
    return nets.conv_encoder(params["enc"], obs.astype(jnp.float32) / 255.0 - 0.5)
  return nets.mlp(params["enc"], dist.symlog(obs), act_last=True)


def _gru(params, x, deter):
  parts = nets.layer_norm(jnp.concatenate([x, deter], -1) @ params["w"] + params["b"])
  reset, cand, update = jnp.split(parts, 3, -1)
  cand = jnp.tanh(jax.nn.sigmoid(reset) * cand)
  update = jax.nn.sigmoid(update - 1.0)
  return update * cand + (1.0 - update) * deter


def _logits(c, x):
  return dist.unimix_logits(x.reshape(x.shape[:-1] + (c.stoch, c.classes)), c.unimix)


def img_step(params: dict, c: WorldModelConfig, state: dict, action, e, key):
  """One prior step: (next state with z sampled from the prior, prior logits)."""
  z = state["stoch"].reshape(state["stoch"].shape[:-2] + (-1,))
  e = jnp.broadcast_to(e, z.shape[:-1] + e.shape[-1:])
  x = nets.mlp(params["img_in"], jnp.concatenate([z, action, e], -1), act_last=True)
  deter = _gru(params["gru"], x, state["deter"])
  logits = _logits(c, nets.mlp(params["img_out"], deter))
  return {"deter": deter, "stoch": dist.straight_through_sample(key, logits)}, logits


def obs_step(params: dict, c: WorldModelConfig, state: dict, prev_action, embed, first, e, key):
  """One posterior step: the state is reset where `first`; returns (posterior state, post logits, prior
  logits)."""
  keep = 1.0 - first.astype(jnp.float32)[..., None]
  state = {"deter": state["deter"] * keep, "stoch": state["stoch"] * keep[..., None]}
  prev_action = prev_action * keep
  k1, k2 = jax.random.split(key)
  prior, prior_logits = img_step(params, c, state, prev_action, e, k1)
  post_logits = _logits(c, nets.mlp(params["obs_out"], jnp.concatenate([prior["deter"], embed], -1)))
  post = {"deter": prior["deter"], "stoch": dist.straight_through_sample(k2, post_logits)}
  return post, post_logits, prior_logits


def observe(params: dict, c: WorldModelConfig, embed, prev_action, first, e, key, state=None):
  """The posterior over windows: embed (B, L, E), prev_action (B, L, A) (the action before each step),
  first (B, L), e (B, emb). Returns (states with leaves (B, L, ...), post logits, prior logits)."""
  b = embed.shape[0]
  state = initial(c, (b,)) if state is None else state
  keys = jax.random.split(key, embed.shape[1])

  def step(s, inp):
    em, a, f, k = inp
    post, pl, ql = obs_step(params, c, s, a, em, f, e, k)
    return post, (post, pl, ql)
  sw = lambda x: jnp.swapaxes(x, 0, 1)   # noqa: E731
  _, (states, post_l, prior_l) = jax.lax.scan(step, state, (sw(embed), sw(prev_action), sw(first), keys))
  return jax.tree.map(sw, states), sw(post_l), sw(prior_l)


def heads(params: dict, c: WorldModelConfig, f) -> dict:
  """Reward (two-hot logits) and continue (logit) of features f."""
  return {"reward": nets.mlp(params["rew"], f), "cont": nets.mlp(params["cont"], f)[..., 0]}


def decode(params: dict, c: WorldModelConfig, f):
  """The decoded observation: symlog vector, or the image in [-0.5, 0.5] units."""
  if c.image_size:
    return nets.conv_decoder(params["dec"], f, c.image_size)
  return nets.mlp(params["dec"], f)


def shift_actions(action, before=None):
  """The action before each step: (B, L, A) -> [before, a_0, ..., a_{L-2}], `before` (B, A) the action taken
  before the window (0 when None; reset to 0 by `observe` at `first`)."""
  first = jnp.zeros_like(action[:, :1]) if before is None else before[:, None].astype(action.dtype)
  return jnp.concatenate([first, action[:, :-1]], 1)


def loss(params: dict, c: WorldModelConfig, batch: dict, key, obs_mask=None, context=None):
  """The world-model loss of a batch of windows (replay rows: obs, action (taken at the row's observation),
  reward, discount, first (B, L), task_id (B,)); `obs_mask` (T, obs_dim) zeroes padded entries.

  loss = symlog MSE of the observation (image MSE) + reward two-hot CE + continue BCE
         + dyn_scale max(free, KL[sg(q) || p]) + rep_scale max(free, KL[q || sg(p)]),   mean over (B, L).
  `context` (DreamerV3's `replay_context`): {"deter" (B, deter), "stoch" (B, stoch, classes), "action" (B, A)},
  the latent and action of the step before each window, from which the window's posterior continues (None:
  every window starts from the zero state).
  Returns (loss, (metrics, posterior states)).
  """
  e = params["emb"][batch["task_id"]]
  embed = encode(params, c, batch["obs"])
  start = None if context is None else {"deter": context["deter"], "stoch": context["stoch"]}
  prev = shift_actions(batch["action"], None if context is None else context["action"])
  states, post_l, prior_l = observe(params, c, embed, prev, batch["first"], e, key, state=start)
  f = feat(states, e[:, None])
  out = heads(params, c, f)
  rec = decode(params, c, f)
  if c.image_size:
    target = batch["obs"].astype(jnp.float32) / 255.0 - 0.5
    obs_l = jnp.sum((rec - target) ** 2, (-3, -2, -1))
  else:
    err = (rec - dist.symlog(batch["obs"])) ** 2
    if obs_mask is not None:
      err = err * obs_mask[batch["task_id"]][:, None]
    obs_l = err.sum(-1)
  centres = dist.bins(c.num_bins)
  rew_l = dist.twohot_loss(out["reward"], batch["reward"], centres)
  cont_l = optax.sigmoid_binary_cross_entropy(out["cont"], batch["discount"])
  kl_l, dyn_kl, rep_kl = dist.kl_balance(post_l, prior_l, c.free_nats, c.dyn_scale, c.rep_scale)
  total = jnp.mean(obs_l + rew_l + cont_l + kl_l)
  metrics = {"obs": obs_l.mean(), "reward": rew_l.mean(), "cont": cont_l.mean(), "dyn_kl": dyn_kl.mean(),
             "rep_kl": rep_kl.mean(), "loss": total}
  return total, (metrics, jax.lax.stop_gradient(states))

