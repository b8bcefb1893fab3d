"""Synthetic dynamics families (against a numpy loop) and the latent world model (shapes, open loop, learning)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.rl import synthetic
from jaxlab.rl import world_model as wm

# The library's functions, jitted (sizes and options static): one compile each instead of one per primitive and
# shape when run op by op. Same programs, same numbers.
_families = jax.jit(synthetic.make_families, static_argnums=(1, 2, 3), static_argnames=("scale", "nonlin"))
_tasks = jax.jit(synthetic.make_tasks, static_argnums=2)
_rollouts = jax.jit(synthetic.rollouts, static_argnums=(3, 4), static_argnames=("obs_noise", "policy"))


def test_families_are_stable_and_rollouts_follow_the_equations():
  fam = _families(jax.random.key(0), 3, 4, 2, scale=(0.9, 0.95))
  radius = np.max(np.abs(np.linalg.eigvals(np.asarray(fam.a))), axis=-1)
  assert np.all(radius <= 0.95 + 1e-5) and np.all(radius >= 0.9 - 1e-5)
  tasks = _tasks(jax.random.key(1), fam, 2)
  assert list(np.asarray(tasks.family)) == [0, 0, 1, 1, 2, 2]
  data = _rollouts(jax.random.key(2), fam, tasks, 2, 6, obs_noise=0.0)
  assert data["obs"].shape == (6, 2, 7, 4) and data["action"].shape == (6, 2, 6, 2) and data["reward"].shape == (6, 2, 6)
  a, b, w = (np.asarray(x, np.float64) for x in (fam.a, fam.b, fam.w))
  data = {k: np.asarray(v) for k, v in data.items()}     # indexed in numpy (a jax index is a compile per position)
  family, goal = np.asarray(tasks.family), np.asarray(tasks.goal)
  for t in range(6):
    f = int(family[t])
    x = np.asarray(data["obs"][t, 1, 0], np.float64)
    for h in range(6):
      u = np.asarray(data["action"][t, 1, h], np.float64)
      r = -np.mean((x - goal[t]) ** 2) - 0.1 * np.mean(u ** 2)
      assert data["reward"][t, 1, h] == pytest.approx(r, rel=1e-4, abs=1e-5)
      x = a[f] @ x + b[f] @ u + 0.1 * np.tanh(w[f] @ x)
      np.testing.assert_allclose(data["obs"][t, 1, h + 1], x, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="state_dim must be even"):
    synthetic.make_families(jax.random.key(0), 2, 3, 1)


def test_world_model_learns_a_linear_system():
  fam = _families(jax.random.key(0), 1, 4, 2, nonlin=0.0)
  tasks = _tasks(jax.random.key(1), fam, 1)
  data = _rollouts(jax.random.key(2), fam, tasks, 8, 20, policy="smooth")
  c = wm.WorldModelConfig(obs_dim=4, act_dim=2, num_tasks=1, latent=8, hidden=32)
  params = jax.jit(wm.init, static_argnums=1)(jax.random.key(3), c)
  data = {k: np.asarray(v) for k, v in data.items()}     # windows cut in numpy (a jax slice is a compile per start)
  batch = {"task_id": jnp.zeros(8 * 16, jnp.int32),
           "obs": jnp.asarray(np.stack([data["obs"][0, e, s:s + 6] for e in range(8) for s in range(16)])),
           "action": jnp.asarray(np.stack([data["action"][0, e, s:s + 5] for e in range(8) for s in range(16)])),
           "reward": jnp.asarray(np.stack([data["reward"][0, e, s:s + 5] for e in range(8) for s in range(16)]))}
  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(p, s):
    (loss, _), g = jax.value_and_grad(wm.sequence_loss, has_aux=True)(p, c, batch)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s, loss
  open_loop_errors = jax.jit(wm.open_loop_errors, static_argnums=1)
  first = open_loop_errors(params, c, batch)
  for _ in range(120):
    params, state, _ = step(params, state)
  after = open_loop_errors(params, c, batch)
  assert first.shape == (5,) and float(after[-1]) < 0.1 * float(first[-1])        # measured: 0.013
  obs, rew = jax.jit(wm.predict, static_argnums=1)(params, c, batch["task_id"][:3], batch["obs"][:3, 0],
                                                   batch["action"][:3])
  assert obs.shape == (3, 6, 4) and rew.shape == (3, 5)
