"""The DreamerV3-style RSSM and the imagination actor-critic: the posterior scan against step-by-step calls, resets
at episode starts, the posterior collapsing onto the prior when observations carry no information, pixel shapes,
and the actor-critic losses against a direct computation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.rl.dreamer import behavior, dist, nets, rssm

SMALL = {"obs_dim": 3, "act_dim": 2, "num_tasks": 2, "deter": 16, "stoch": 4, "classes": 4, "hidden": 16,
         "layers": 1, "emb": 2, "num_bins": 21}

# The functions under test, jitted (the configs are static): one compile per shape instead of one per primitive
# (op by op, a world-model loss takes seconds to dispatch on CPU). The numbers are the same programs'.
_init = jax.jit(rssm.init, static_argnums=1)
_loss = jax.jit(rssm.loss, static_argnums=1)
_observe = jax.jit(rssm.observe, static_argnums=1)
_obs_step = jax.jit(rssm.obs_step, static_argnums=1)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _random(key, b, length, obs_dim, act_dim):
  k1, k2, k3 = jax.random.split(key, 3)
  return {"obs": jax.random.normal(k1, (b, length, obs_dim)), "action": jax.random.uniform(k2, (b, length, act_dim),
                                                                                             minval=-1, maxval=1),
          "reward": jax.random.normal(k3, (b, length)), "discount": jnp.ones((b, length)),
          "task_id": jnp.arange(b) % 2}


def _batch(key, b=3, length=6, obs_dim=3, act_dim=2, first_at=()):
  first = np.zeros((b, length), bool)
  first[:, 0] = True
  for t in first_at:
    first[:, t] = True
  return {**_random(key, b, length, obs_dim, act_dim), "first": jnp.asarray(first)}


def test_loss_context_continues_the_previous_window():
  """rssm.loss(context=...): a window started from the latent and action of the step before it equals the same
  steps observed as the continuation of that step (DreamerV3's replay_context)."""
  c = rssm.WorldModelConfig(**SMALL)
  p = _init(jax.random.key(0), c)
  batch = _batch(jax.random.key(1), length=6)
  e = p["emb"][batch["task_id"]]
  embed = rssm.encode(p, c, batch["obs"])
  prev = rssm.shift_actions(batch["action"])
  keys = jax.random.split(jax.random.key(2), 6)
  s = rssm.initial(c, (3,))
  for t in range(3):      # the first three steps, one by one: the latent at step 2 is the context of the rest
    s, _, _ = _obs_step(p, c, s, prev[:, t], embed[:, t], batch["first"][:, t], e, keys[t])
  rest = {k: (v[:, 3:] if k != "task_id" else v) for k, v in batch.items()}
  context = {"deter": s["deter"], "stoch": s["stoch"], "action": batch["action"][:, 2]}
  key = jax.random.key(3)
  _, (_, states) = _loss(p, c, rest, key, None, context)
  want, _, _ = _observe(p, c, embed[:, 3:], prev[:, 3:], batch["first"][:, 3:], e, key, state=s)
  np.testing.assert_allclose(states["deter"], want["deter"], atol=1e-5)
  # Without context the window starts from zeros: a different deterministic state.
  _, (_, zero_start) = _loss(p, c, rest, key)
  assert not np.allclose(zero_start["deter"][:, 0], want["deter"][:, 0], atol=1e-3)


def test_observe_equals_step_by_step_and_resets_at_first():
  c = rssm.WorldModelConfig(**SMALL)
  p = _init(jax.random.key(0), c)
  batch = _batch(jax.random.key(1), first_at=(3,))
  e = p["emb"][batch["task_id"]]
  embed = rssm.encode(p, c, batch["obs"])
  prev = rssm.shift_actions(batch["action"])
  key = jax.random.key(2)
  states, post_l, prior_l = _observe(p, c, embed, prev, batch["first"], e, key)
  keys = jax.random.split(key, 6)
  s = rssm.initial(c, (3,))
  for t in range(6):
    s, pl, ql = _obs_step(p, c, s, prev[:, t], embed[:, t], batch["first"][:, t], e, keys[t])
    np.testing.assert_allclose(states["deter"][:, t], s["deter"], atol=1e-5)
    np.testing.assert_allclose(post_l[:, t], pl, atol=1e-5)
    np.testing.assert_allclose(prior_l[:, t], ql, atol=1e-5)
  # At a `first` step the state restarts: the step from any earlier state equals the step from zeros.
  fresh, pl3, _ = _obs_step(p, c, rssm.initial(c, (3,)), jnp.zeros((3, 2)), embed[:, 3], batch["first"][:, 3], e,
                            keys[3])
  np.testing.assert_allclose(states["deter"][:, 3], fresh["deter"], atol=1e-6)
  np.testing.assert_allclose(post_l[:, 3], pl3, atol=1e-6)


def test_posterior_matches_prior_when_observations_are_uninformative():
  """With a constant observation the posterior can learn nothing the prior does not know: trained without free
  bits, KL(posterior || prior) falls to about 0 (it starts well above)."""
  c = rssm.WorldModelConfig(**{**SMALL, "free_nats": 0.0})
  p = _init(jax.random.key(0), c)
  batch = _batch(jax.random.key(1), b=8, length=8)
  batch = {**batch, "obs": jnp.ones_like(batch["obs"]), "reward": jnp.zeros_like(batch["reward"])}
  opt = optax.adam(3e-3)
  o = opt.init(p)

  @jax.jit
  def step(p, o, k):
    (_, (m, _)), g = jax.value_and_grad(rssm.loss, has_aux=True)(p, c, batch, k)
    u, o = opt.update(g, o, p)
    return optax.apply_updates(p, u), o, m
  p, o, m0 = step(p, o, jax.random.key(0))       # the metrics are the loss's at the parameters before the step
  for i in range(1, 150):                         # KL is below 0.003 after 100 steps (0.0016 after 150)
    p, o, m = step(p, o, jax.random.key(i))
  assert float(m0["rep_kl"]) > 0.1
  assert float(m["rep_kl"]) < 0.02 and float(m["dyn_kl"]) < 0.02


def test_loss_masks_padded_observation_entries():
  c = rssm.WorldModelConfig(**SMALL)
  p = _init(jax.random.key(0), c)
  batch = _batch(jax.random.key(1))
  mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
  _, (m1, _) = _loss(p, c, batch, jax.random.key(2), mask)
  changed = {**batch, "obs": batch["obs"].at[..., 2].set(100.0)}
  # The padded entry still feeds the encoder, so compare the reconstruction term of a model that ignores it.
  p0 = jax.tree.map(lambda x: x, p)
  p0["enc"][0]["w"] = p0["enc"][0]["w"].at[2].set(0.0)
  _, (a, _) = _loss(p0, c, batch, jax.random.key(2), mask)
  _, (b, _) = _loss(p0, c, changed, jax.random.key(2), mask)
  assert float(a["obs"]) == pytest.approx(float(b["obs"]), rel=1e-6)
  assert np.isfinite(float(m1["loss"]))


def test_pixel_world_model_shapes_and_loss():
  c = rssm.WorldModelConfig(**{**SMALL, "image_size": 64, "cnn_depth": 4})
  p = _init(jax.random.key(0), c)
  obs = jax.random.randint(jax.random.key(1), (2, 3, 64, 64, 3), 0, 256).astype(jnp.uint8)
  batch = {**_batch(jax.random.key(2), b=2, length=3), "obs": obs}
  loss, (_, states) = _loss(p, c, batch, jax.random.key(3))
  assert np.isfinite(float(loss)) and states["deter"].shape == (2, 3, 16)
  decode = jax.jit(lambda p, s, e: rssm.decode(p, c, rssm.feat(s, e)))
  assert decode(p, states, p["emb"][batch["task_id"]][:, None]).shape == (2, 3, 64, 64, 3)
  enc = jax.jit(nets.conv_encoder_init, static_argnums=1)(jax.random.key(4), 4)
  assert jax.jit(nets.conv_encoder)(enc, jnp.zeros((5, 64, 64, 3))).shape == (5, nets.conv_encoder_out(4))


def test_behavior_losses_match_direct_computation():
  c = rssm.WorldModelConfig(**SMALL)
  bc = behavior.BehaviorConfig(act_dim=2, hidden=8, layers=1, horizon=4, gamma=0.9, lam=0.8, entropy=0.01,
                               num_bins=21)
  p = _init(jax.random.key(0), c)
  ac = jax.jit(behavior.init, static_argnums=(1, 2))(jax.random.key(1), bc, c.feat_dim)
  ac["slow"] = jax.tree.map(lambda x: x + 0.05, ac["slow"])
  start = {"deter": jax.random.normal(jax.random.key(2), (5, 16)),
           "stoch": jax.nn.one_hot(jax.random.randint(jax.random.key(3), (5, 4), 0, 4), 4)}
  e = p["emb"][1]
  key = jax.random.key(4)
  # The losses and their gradient in one program (the gradient is checked at the end).
  (total, (met, ret)), g = jax.jit(jax.value_and_grad(
      lambda a: behavior.losses(a, bc, p, c, start, e, 2.0, key), has_aux=True))(ac)
  feats, actions = jax.jit(behavior.imagine, static_argnums=(1, 3))(p, c, ac["actor"], bc, start, e, key)
  assert feats.shape == (5, 5, c.feat_dim) and actions.shape == (4, 5, 2)
  out = rssm.heads(p, c, feats)
  r = np.asarray(dist.twohot_mean(out["reward"], dist.bins(21)))
  cont = np.array(jax.nn.sigmoid(out["cont"]))
  cont[0] = 1.0
  v = np.asarray(behavior.value(ac["slow"], bc, feats))
  d = 0.9 * cont
  want = np.zeros((4, 5))
  nxt = v[4]
  for t in range(3, -1, -1):
    nxt = r[t + 1] + d[t + 1] * (0.2 * v[t + 1] + 0.8 * nxt)
    want[t] = nxt
  np.testing.assert_allclose(ret, want, rtol=1e-4, atol=1e-4)
  w = np.cumprod(np.concatenate([np.ones((1, 5)), d[1:4]]), 0)
  _, std = behavior.policy(ac["actor"], bc, feats[:-1])
  ent = np.asarray(behavior.entropy(std))
  actor = -np.mean(w * (want / 2.0 + 0.01 * ent))
  logits = jax.vmap(lambda f: behavior.nets.mlp(ac["critic"], f))(feats[:-1])
  critic = np.mean(w * np.asarray(dist.twohot_loss(logits, jnp.asarray(want), dist.bins(21))))
  assert float(met["actor_loss"]) == pytest.approx(actor, rel=1e-4)
  assert float(total) == pytest.approx(actor + critic, rel=1e-4)
  # The actor's gradient reaches it through the world model (dynamics backpropagation); the slow critic gets none.
  assert float(optax.global_norm(g["actor"])) > 0 and float(optax.global_norm(g["slow"])) == 0.0
