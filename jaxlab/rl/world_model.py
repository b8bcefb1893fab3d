"""A small latent world model for multi-task model-based RL (TD-MPC2-like latent dynamics, with a decoder).

Pure functions over a params pytree (so several models stack on a leading axis and train under one `vmap`):

    z_0 = enc([o_t, e_k])                      e_k: the task's embedding (a row of params["emb"])
    z_j = z_{j-1} + dyn([z_{j-1}, a_{t+j-1}, e_k])          open loop: actions only, no observations after o_t
    o_hat_j = dec([z_j, e_k]),  r_hat_j = rew([z_{j-1}, a_{t+j-1}, e_k])

`sequence_loss` is the multi-step open-loop prediction loss over a window of H steps: mean over j = 0..H of
||o_hat_j - o_{t+j}||^2 plus the reward error over j = 1..H (weight `reward_weight`). `open_loop_errors` gives
the held-out open-loop observation MSE at each horizon 1..H. Which inputs see the task embedding is a
setting (`embed`): "all" (encoder, dynamics, reward, decoder) or "none".

Parameter paths are "enc/0/w", "dyn/1/b", ... (`jaxlab.multitask.param_sharing` selects subsets by them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class WorldModelConfig:
  obs_dim: int
  act_dim: int
  num_tasks: int
  latent: int = 16
  hidden: int = 64
  layers: int = 2
  emb: int = 4
  embed: str = "all"            # "all" | "none"
  reward_weight: float = 0.5


def _mlp_init(key, sizes):
  out = []
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    k = jax.random.fold_in(key, i)
    out.append({"w": jax.random.normal(k, (a, b)) * jnp.sqrt(1.0 / a), "b": jnp.zeros((b,))})
  return out


def _mlp(params, x):
  for i, layer in enumerate(params):
    x = x @ layer["w"] + layer["b"]
    if i < len(params) - 1:
      x = jax.nn.elu(x)
  return x


def init(key: jax.Array, c: WorldModelConfig) -> dict:
  """Fresh parameters: {"emb", "enc", "dyn", "rew", "dec"} (lists of {"w", "b"} layers)."""
  e = c.emb if c.embed == "all" else 0
  h = [c.hidden] * c.layers
  ks = jax.random.split(key, 5)
  params = {
      "emb": 0.1 * jax.random.normal(ks[0], (c.num_tasks, c.emb)),
      "enc": _mlp_init(ks[1], [c.obs_dim + e, *h, c.latent]),
      "dyn": _mlp_init(ks[2], [c.latent + c.act_dim + e, *h, c.latent]),
      "rew": _mlp_init(ks[3], [c.latent + c.act_dim + e, *h, 1]),
      "dec": _mlp_init(ks[4], [c.latent + e, *h, c.obs_dim]),
  }
  params["dyn"][-1]["w"] = params["dyn"][-1]["w"] * 0.1     # start near the identity map z' = z
  return params


def _cat(c: WorldModelConfig, x, e):
  return jnp.concatenate([x, e], axis=-1) if c.embed == "all" else x


def predict(params: dict, c: WorldModelConfig, task_id, obs0, actions):
  """Open-loop predictions from obs0 (B, n) with actions (B, H, m): (obs (B, H + 1, n), reward (B, H))."""
  e = params["emb"][task_id]
  z = _mlp(params["enc"], _cat(c, obs0, e))

  def one(z, a):
    za = jnp.concatenate([z, a], axis=-1)
    r = _mlp(params["rew"], _cat(c, za, e))[..., 0]
    z = z + _mlp(params["dyn"], _cat(c, za, e))
    return z, (z, r)
  _, (zs, rs) = jax.lax.scan(one, z, jnp.moveaxis(actions, 1, 0))
  zs = jnp.concatenate([z[None], zs], axis=0)                        # (H + 1, B, d)
  obs = _mlp(params["dec"], _cat(c, zs, jnp.broadcast_to(e, zs.shape[:-1] + e.shape[-1:])))
  return jnp.moveaxis(obs, 0, 1), jnp.moveaxis(rs, 0, 1)


def sequence_loss(params: dict, c: WorldModelConfig, batch: dict) -> tuple[jax.Array, dict]:
  """Multi-step open-loop loss of a batch {"task_id" (B,), "obs" (B, H + 1, n), "action" (B, H, m),
  "reward" (B, H)}; returns (loss, {"obs_mse", "reward_mse"})."""
  obs, rew = predict(params, c, batch["task_id"], batch["obs"][:, 0], batch["action"])
  obs_mse = jnp.mean((obs - batch["obs"]) ** 2)
  rew_mse = jnp.mean((rew - batch["reward"]) ** 2)
  return obs_mse + c.reward_weight * rew_mse, {"obs_mse": obs_mse, "reward_mse": rew_mse}


def open_loop_errors(params: dict, c: WorldModelConfig, batch: dict) -> jax.Array:
  """(H,) held-out open-loop observation MSE at horizons 1..H (mean over the batch and dimensions)."""
  obs, _ = predict(params, c, batch["task_id"], batch["obs"][:, 0], batch["action"])
  return jnp.mean((obs[:, 1:] - batch["obs"][:, 1:]) ** 2, axis=(0, 2))
