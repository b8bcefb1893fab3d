"""Imagination actor-critic (DreamerV3, arXiv 2301.04104, section "Actor-critic learning"): per-task actor and
critic heads over the world model's task-conditioned features, trained on trajectories imagined by the prior.

    traj = imagine(wm_params, wm_cfg, actor_params, start_states, e, horizon, key)
    ret  = lambda_returns(reward, gamma * continue, slow critic value, lam)
    actor loss  = - E[w_t ret_t / S] - eta E[w_t H_t]              (dynamics backpropagation), or
                  - E[w_t log pi(a_t) sg((ret_t - v_t) / S)] - eta E[w_t H_t]    (REINFORCE)
    critic loss = E[w_t CE(critic(s_t), twohot(symlog ret_t))]
                  + slowreg E[w_t CE(critic(s_t), twohot(symlog mean slow(s_t)))]

The returns bootstrap from a slow EMA copy of the critic (`slowtar`, DreamerV2's target network) or from the
critic itself with the slow copy as a regulariser (`slowtar=False`, `slowreg=1`: DreamerV3's defaults,
danijar/dreamerv3 `configs.yaml` `imag_loss.slowtar: False`, `slowreg: 1.0`).

S = max(1, EMA of the 95th - 5th percentile range of the returns) (DreamerV3's return normalisation); w_t is
the cumulative product of the predicted discounts (stop-gradient). The actor is a Gaussian with a tanh mean
and a std in [min_std, max_std] (continuous actions in [-1, 1]).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab.rl.dreamer import dist, nets
from jaxlab.rl.dreamer import rssm


@dataclasses.dataclass(frozen=True)
class BehaviorConfig:
  act_dim: int
  hidden: int = 256
  layers: int = 2
  horizon: int = 15
  gamma: float = 0.997
  lam: float = 0.95
  entropy: float = 3e-4
  min_std: float = 0.1
  max_std: float = 1.0
  actor_grad: str = "dynamics"       # "dynamics" | "reinforce"
  slow_rate: float = 0.02
  num_bins: int = 255
  slowtar: bool = True               # bootstrap the returns with the slow critic (False: the critic, DreamerV3)
  slowreg: float = 0.0               # weight of the critic's cross-entropy to the slow critic's mean (DreamerV3 1)


def init(key, c: BehaviorConfig, feat_dim: int) -> dict:
  """{"actor", "critic", "slow"} for one task (stack them on a task axis for several)."""
  h = [c.hidden] * c.layers
  k1, k2 = jax.random.split(key)
  critic = nets.mlp_init(k2, [feat_dim, *h, c.num_bins], out_scale=0.0)
  return {"actor": nets.mlp_init(k1, [feat_dim, *h, 2 * c.act_dim]), "critic": critic,
          "slow": jax.tree.map(jnp.array, critic)}


def policy(actor: list, c: BehaviorConfig, f):
  """(mean, std) of the Gaussian policy at features f."""
  out = nets.mlp(actor, f)
  mean, raw = jnp.split(out, 2, -1)
  std = (c.max_std - c.min_std) * jax.nn.sigmoid(raw + 2.0) + c.min_std
  return jnp.tanh(mean), std


def log_prob(mean, std, a):
  return jnp.sum(-0.5 * ((a - mean) / std) ** 2 - jnp.log(std) - 0.5 * jnp.log(2 * jnp.pi), -1)


def entropy(std):
  return jnp.sum(jnp.log(std) + 0.5 * jnp.log(2 * jnp.pi * jnp.e), -1)


def act(actor: list, c: BehaviorConfig, f, key, mode: bool = False):
  """An action in [-1, 1] (the policy's mean when `mode`)."""
  mean, std = policy(actor, c, f)
  a = mean if mode else mean + std * jax.random.normal(key, mean.shape)
  return jnp.clip(a, -1.0, 1.0)


def value(critic: list, c: BehaviorConfig, f):
  return dist.twohot_mean(nets.mlp(critic, f), dist.bins(c.num_bins))


def imagine(wm_params: dict, wm_cfg: rssm.WorldModelConfig, actor: list, c: BehaviorConfig, start: dict, e, key):
  """Rolls the prior forward `horizon` steps from `start` (leaves (N, ...)) with the actor's samples.
  Returns feats (H + 1, N, F) and actions (H, N, A); the sample is reparameterised (gradients reach the
  actor through the world model)."""
  def step(state, k):
    ka, ks = jax.random.split(k)
    f = rssm.feat(state, e)
    mean, std = policy(actor, c, jax.lax.stop_gradient(f) if c.actor_grad == "reinforce" else f)
    a = mean + std * jax.random.normal(ka, mean.shape)
    if c.actor_grad == "reinforce":
      a = jax.lax.stop_gradient(a)
    nxt, _ = rssm.img_step(wm_params, wm_cfg, state, jnp.clip(a, -1.0, 1.0), e, ks)
    return nxt, (f, a)
  last, (feats, actions) = jax.lax.scan(step, start, jax.random.split(key, c.horizon))
  feats = jnp.concatenate([feats, rssm.feat(last, e)[None]], 0)
  return feats, actions


def losses(ac: dict, c: BehaviorConfig, wm_params: dict, wm_cfg: rssm.WorldModelConfig, start: dict, e,
           scale, key):
  """Actor and critic losses of one task's start states (leaves (N, ...)).

  Returns (actor loss + critic loss, (metrics, the imagined returns (H, N))); `scale` is the divisor S.
  """
  sg = jax.lax.stop_gradient
  feats, actions = imagine(wm_params, wm_cfg, ac["actor"], c, start, e, key)
  out = rssm.heads(wm_params, wm_cfg, feats)
  reward = dist.twohot_mean(out["reward"], dist.bins(wm_cfg.num_bins))
  cont = jax.nn.sigmoid(out["cont"]).at[0].set(1.0)
  disc = c.gamma * cont
  v_slow = value(sg(ac["slow"]), c, feats)
  v_boot = v_slow if c.slowtar else sg(value(ac["critic"], c, feats))
  ret = dist.lambda_returns(reward, disc, v_boot, c.lam)                      # (H, N)
  weight = sg(jnp.cumprod(jnp.concatenate([jnp.ones_like(disc[:1]), disc[1:-1]], 0), 0))
  mean, std = policy(ac["actor"], c, sg(feats[:-1]))
  ent = entropy(std)
  if c.actor_grad == "dynamics":
    actor_obj = ret / scale
  else:
    adv = sg((ret - value(ac["critic"], c, feats[:-1])) / scale)
    actor_obj = log_prob(mean, std, sg(actions)) * adv
  actor_loss = -jnp.mean(weight * (actor_obj + c.entropy * ent))
  logits = nets.mlp(ac["critic"], sg(feats[:-1]))
  critic_ce = dist.twohot_loss(logits, sg(ret), dist.bins(c.num_bins))
  if c.slowreg:
    critic_ce = critic_ce + c.slowreg * dist.twohot_loss(logits, v_slow[:-1], dist.bins(c.num_bins))
  critic_loss = jnp.mean(weight * critic_ce)
  metrics = {"actor_loss": actor_loss, "critic_loss": critic_loss, "ret": ret.mean(), "entropy": ent.mean(),
             "imag_reward": reward[1:].mean()}
  return actor_loss + critic_loss, (metrics, sg(ret))


def update_slow(ac: dict, rate: float) -> dict:
  """The slow critic moves towards the critic by `rate` (an exponential moving average)."""
  return {**ac, "slow": jax.tree.map(lambda s, f: (1 - rate) * s + rate * f, ac["slow"], ac["critic"])}
