"""Families of synthetic control tasks in pure JAX (they run inside `jit` / `vmap` / `scan`).

A family f is a dynamical system x' = A_f x + s_f B_f a + c s_f tanh(W_f x / s_f) (state x in R^n, action a in
[-1, 1]^m, state scale s_f: x_0 ~ N(0, s_f^2 I)); its tasks share the dynamics and differ in the reward
r_k(x, a) = -||x - g_k||^2 / n - rho ||a||^2 / m (goal g_k, scaled by s_f).
Tasks of one family are therefore a family in the sense that matters for world-model sharing: one model of
the dynamics serves all of them, while tasks of different families need different dynamics.

A_f = s_f * Q_f R(theta_f) Q_f^T: a rotation by per-pair angles theta_f (2x2 blocks) in a random basis Q_f,
scaled by s_f < 1 (stable, oscillating); B_f and W_f are Gaussian. Observations are the state plus Gaussian
noise (sigma_obs); episodes start at x_0 ~ N(0, I) and last `horizon` steps.

    fam = make_families(jax.random.key(0), num_families=3, state_dim=6, act_dim=2)
    tasks = make_tasks(jax.random.key(1), fam, tasks_per_family=2)
    data = rollouts(jax.random.key(2), fam, tasks, episodes=4, horizon=50)   # random-policy trajectories
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Families:
  """Dynamics of F families: a (F, n, n), b (F, n, m), w (F, n, n), scale (F,), nonlin (scalar c)."""
  a: jax.Array
  b: jax.Array
  w: jax.Array
  scale: jax.Array
  nonlin: float = flax.struct.field(pytree_node=False, default=0.1)

  @property
  def num_families(self) -> int:
    return self.a.shape[0]

  @property
  def state_dim(self) -> int:
    return self.a.shape[1]

  @property
  def act_dim(self) -> int:
    return self.b.shape[2]


@flax.struct.dataclass
class Tasks:
  """T tasks: family (T,) int32, goal (T, n), action_cost rho."""
  family: jax.Array
  goal: jax.Array
  action_cost: float = flax.struct.field(pytree_node=False, default=0.1)

  @property
  def num_tasks(self) -> int:
    return self.family.shape[0]


def make_families(key: jax.Array, num_families: int, state_dim: int, act_dim: int, *, scale: tuple = (0.85, 0.97),
                  nonlin: float = 0.1, input_gain: float = 0.5, state_scales=None) -> Families:
  """F random stable oscillating systems (module docstring); state_dim must be even; `state_scales` (F,) sets
  each family's s_f (default all 1)."""
  if state_dim % 2:
    raise ValueError(f"state_dim must be even (2x2 rotation blocks), got {state_dim}")
  ka, kb, kw, ks, kt = jax.random.split(key, 5)
  q = jnp.linalg.qr(jax.random.normal(ka, (num_families, state_dim, state_dim)))[0]
  theta = jax.random.uniform(kt, (num_families, state_dim // 2), minval=0.1, maxval=0.8)
  c, s = jnp.cos(theta), jnp.sin(theta)
  rot = jnp.zeros((num_families, state_dim, state_dim))
  idx = jnp.arange(state_dim // 2) * 2
  rot = rot.at[:, idx, idx].set(c).at[:, idx + 1, idx + 1].set(c).at[:, idx, idx + 1].set(-s).at[:, idx + 1, idx].set(s)
  radius = jax.random.uniform(ks, (num_families, 1, 1), minval=scale[0], maxval=scale[1])
  a = radius * jnp.einsum("fij,fjk,flk->fil", q, rot, q)
  b = input_gain * jax.random.normal(kb, (num_families, state_dim, act_dim)) / jnp.sqrt(act_dim)
  w = jax.random.normal(kw, (num_families, state_dim, state_dim)) / jnp.sqrt(state_dim)
  s = jnp.ones((num_families,)) if state_scales is None else jnp.asarray(state_scales, jnp.float32)
  if s.shape != (num_families,):
    raise ValueError(f"state_scales needs {num_families} entries, got {tuple(s.shape)}")
  return Families(a=a, b=b, w=w, scale=s, nonlin=nonlin)


def make_tasks(key: jax.Array, families: Families, tasks_per_family: int, *, goal_scale: float = 1.0,
               action_cost: float = 0.1) -> Tasks:
  """`tasks_per_family` tasks per family, each with its own goal (task t belongs to family t // tasks_per_family)."""
  n_tasks = families.num_families * tasks_per_family
  family = jnp.repeat(jnp.arange(families.num_families, dtype=jnp.int32), tasks_per_family)
  goal = goal_scale * families.scale[family][:, None] * jax.random.normal(key, (n_tasks, families.state_dim))
  return Tasks(family=family, goal=goal, action_cost=action_cost)


def step(families: Families, tasks: Tasks, task_id: jax.Array, x: jax.Array, a: jax.Array):
  """(next state, reward) of task `task_id` (scalar or batched with x (..., n), a (..., m))."""
  f = tasks.family[task_id]
  a = jnp.clip(a, -1.0, 1.0)
  af, bf, wf, sf = families.a[f], families.b[f], families.w[f], families.scale[f][..., None]
  nxt = (jnp.einsum("...ij,...j->...i", af, x) + sf * jnp.einsum("...ij,...j->...i", bf, a)
         + families.nonlin * sf * jnp.tanh(jnp.einsum("...ij,...j->...i", wf, x / sf)))
  g = tasks.goal[task_id]
  reward = -jnp.mean((x - g) ** 2, axis=-1) - tasks.action_cost * jnp.mean(a ** 2, axis=-1)
  return nxt, reward


def rollouts(key: jax.Array, families: Families, tasks: Tasks, episodes: int, horizon: int, *,
             obs_noise: float = 0.01, policy: str = "random") -> dict[str, jax.Array]:
  """Trajectories of every task: obs (T, E, H + 1, n), action (T, E, H, m), reward (T, E, H).

  `policy` "random" draws a ~ U[-1, 1]^m each step; "smooth" draws an AR(1) sequence (more informative for
  multi-step prediction).
  """
  n_t, n, m = tasks.num_tasks, families.state_dim, families.act_dim
  k0, ka, kn = jax.random.split(key, 3)
  x0 = families.scale[tasks.family][:, None, None] * jax.random.normal(k0, (n_t, episodes, n))
  u = jax.random.uniform(ka, (horizon, n_t, episodes, m), minval=-1.0, maxval=1.0)
  if policy == "smooth":
    def ar(prev, e):
      nxt = 0.8 * prev + 0.6 * e
      return nxt, nxt
    _, u = jax.lax.scan(ar, jnp.zeros_like(u[0]), u)
  elif policy != "random":
    raise ValueError(f"policy must be 'random' or 'smooth', got {policy!r}")
  task_ids = jnp.broadcast_to(jnp.arange(n_t)[:, None], (n_t, episodes))

  def one(x, a):
    nxt, r = step(families, tasks, task_ids, x, a)
    return nxt, (x, r)
  last, (xs, rs) = jax.lax.scan(one, x0, jnp.clip(u, -1.0, 1.0))
  states = jnp.concatenate([xs, last[None]], axis=0)                 # (H + 1, T, E, n)
  obs = states + obs_noise * jax.random.normal(kn, states.shape)
  return {"obs": jnp.moveaxis(obs, 0, 2), "action": jnp.moveaxis(jnp.clip(u, -1, 1), 0, 2),
          "reward": jnp.moveaxis(rs, 0, 2)}
