"""Online multi-task Dreamer with grouped world-model sharing (TaskLoom's two-stage paradigm, ICML 2026 poster
64665; the grouping and exchange are our reconstruction, see experiments/taskloom_agent/README.md).

    agent = Agent(wm_cfg, bh_cfg, AgentConfig(...), obs_mask=env.obs_mask, exchange=r"^gru/")
    out = online.run(agent, env, workdir, env_steps=20_000, key=key, grouping=GroupingConfig(...))

State. M world models stacked on a leading axis (one per task group, `assign[t]` = the group of task t) with
their Adam states, T per-task actor / critic / slow-critic heads stacked on a task axis, the per-task return
range S, and one replay ring per task (`jaxlab.rl.replay`).

One update (`Agent.update`, jitted): every group model draws its rows from its own tasks (the same number of
rows per update in total for any grouping), takes one world-model step (vmapped over the groups), then every
row's posterior states start imagined trajectories under the row's group model and its task's actor (one
actor-critic step for all tasks, Adam vmapped over the task axis).

Grouping (`GroupingConfig`): "single" = one model per task (independent Dreamers), "shared" = one model for
all tasks (a multi-task Dreamer with task embeddings), "grouped" = TaskLoom: one shared model until
`group_at` environment steps per task, then per-task world-model gradients (`jaxlab.multitask.grouping`; their
cosine matrix, optionally averaged over measurements every `measure_every` steps of the shared phase), a
clustering into groups each starting from the shared model (stage 1: full sharing within a group), a soft
average of the parameter subset `exchange` across the group models every `exchange_every` updates (stage 2),
and a regrouping every `regroup_every` environment steps.

The loop (`jaxlab.rl.dreamer.online.run`) is resumable: at the first episode boundary after every
`checkpoint_every` environment steps (and on SIGTERM / Ctrl-C) it saves the whole state (models, optimizers,
replay, groups, counters, the episode log, the environments' random streams) with `jaxlab.checkpoint`; a rerun
restores the newest checkpoint and continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.errors import ConfigError
from jaxlab.multitask import grouping as grouping_lib
from jaxlab.multitask import param_sharing
from jaxlab.rl import replay
from jaxlab.rl.dreamer import behavior, dist, rssm
from jaxlab.rl.dreamer import opt as opt_lib

MODES = ("single", "shared", "grouped")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Training settings (DreamerV3's defaults noted where ours differ for small budgets).

  Attributes:
    batch_size: replay windows per task per update (for any grouping the update holds T * batch_size rows).
    seq_len: window length (DreamerV3: 64).
    model_lr, actor_lr, critic_lr: learning rates of the three optimizers (DreamerV3: one LaProp at 4e-5).
    clip: global-norm gradient clip of each optimizer ("adam" only).
    optimizer: "adam" (Adam with a global-norm clip) or "laprop" (DreamerV3's: LaProp with per-tensor adaptive
      gradient clipping `agc` and a linear warm-up of `warmup` updates, `jaxlab.rl.dreamer.opt`).
    replay_context: store the posterior computed when acting with every replay step and start each training
      window from the stored latent of the step before it; the fresh posteriors are written back (DreamerV3's
      `replay_context: 1`). False: every window starts from the zero state.
    train_every: agent steps between updates (per vectorised environment step), a float (0.5: two updates).
    prefill: agent steps per environment of uniform random actions before the first update.
    action_repeat: environment steps per agent step (rewards summed).
    capacity: replay steps kept per task.
    imag_starts: imagination start states per task per update, drawn from the task's posterior states (0: all
      batch_size * seq_len of them, as DreamerV3).
    checkpoint_every: environment steps per task between checkpoints (0: none).
  """
  batch_size: int = 16
  seq_len: int = 64
  model_lr: float = 1e-4
  actor_lr: float = 3e-5
  critic_lr: float = 3e-5
  clip: float = 100.0
  train_every: float = 1.0
  prefill: int = 500
  action_repeat: int = 2
  capacity: int = 1_000_000
  imag_starts: int = 0
  checkpoint_every: int = 0
  optimizer: str = "adam"
  agc: float = 0.3
  warmup: int = 0
  replay_context: bool = False

  def __post_init__(self):
    if self.optimizer not in ("adam", "laprop"):
      raise ConfigError(f"agent.optimizer={self.optimizer!r}: use adam or laprop")


@dataclasses.dataclass(frozen=True)
class GroupingConfig:
  """How tasks share world models (see the module docstring)."""
  mode: str = "grouped"
  group_at: int = 0               # env steps per task before the first grouping (grouped)
  num_groups: int = 0             # 0: by `threshold` on the gradient cosine
  threshold: float = 0.5
  grad_batches: int = 8
  exclude: tuple = ("emb", "rew")
  exchange: str = r"^gru/"        # stage 2's parameter subset ("" : none)
  tau: float = 0.1
  exchange_every: int = 50        # updates
  regroup_every: int = 0          # env steps per task (0: never)
  loss: str = "obs"               # the gradient's loss: "obs" (the observation loss) or "full" (the world model's)
  measure_every: int = 0          # env steps per task between affinity measurements (from the prefill's end)
                                  # before the first grouping, which clusters their mean (inter-task affinity
                                  # averaged over training, as TAG: Fifty et al. 2021, arXiv 2109.04617); 0: one
                                  # measurement, at group_at
  before_updates: bool = False    # group on a step's data before that step's updates (with group_at <= the
                                  # prefill's env steps: the shared model at its initialisation, on the prefill
                                  # data, as the offline taskloom experiment groups); False: after them

  def __post_init__(self):
    if self.mode not in MODES:
      raise ConfigError(f"grouping.mode={self.mode!r}: use one of {', '.join(MODES)}")
    if not 0.0 <= self.tau <= 1.0:
      raise ConfigError(f"grouping.tau={self.tau} must be in [0, 1]")
    if self.measure_every < 0:
      raise ConfigError(f"grouping.measure_every={self.measure_every} must be >= 0 (0: measure once, at group_at)")
    if self.loss not in ("obs", "full"):
      raise ConfigError(f"grouping.loss={self.loss!r}: use obs or full")


def initial_assign(mode: str, num_tasks: int) -> np.ndarray:
  return np.arange(num_tasks) if mode == "single" else np.zeros(num_tasks, np.int64)


def member_rows(assign: np.ndarray, rows_per_task: int) -> np.ndarray:
  """(M, R) task ids: model m's tasks repeated round robin, R = rows_per_task * T / M (rounded up)."""
  m = int(assign.max()) + 1
  r = math.ceil(rows_per_task * len(assign) / m)
  return np.stack([np.resize(np.flatnonzero(assign == g), r) for g in range(m)]).astype(np.int32)


def stack(tree, m: int):
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (m,) + x.shape), tree)


class Agent:
  """A multi-task Dreamer (see the module docstring)."""

  def __init__(self, wm_cfg: rssm.WorldModelConfig, bh_cfg: behavior.BehaviorConfig, cfg: AgentConfig,
               obs_mask=None, exchange: str = ""):
    self.wcfg, self.bcfg, self.cfg = wm_cfg, bh_cfg, cfg
    # Stage 2's parameter subset: a pytree of Python bools over one world model (static under jit).
    template = jax.eval_shape(lambda: rssm.init(jax.random.key(0), wm_cfg))
    self.exchange_mask = param_sharing.select(template, exchange) if exchange else None
    self.num_tasks = wm_cfg.num_tasks
    self.obs_mask = None if obs_mask is None else jnp.asarray(obs_mask, jnp.float32)
    if cfg.optimizer == "laprop":
      self.wm_opt, self.actor_opt, self.critic_opt = (opt_lib.laprop(lr, agc=cfg.agc, warmup=cfg.warmup)
                                                      for lr in (cfg.model_lr, cfg.actor_lr, cfg.critic_lr))
    else:
      self.wm_opt = optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adam(cfg.model_lr, eps=1e-8))
      self.actor_opt = optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adam(cfg.actor_lr, eps=1e-5))
      self.critic_opt = optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adam(cfg.critic_lr, eps=1e-5))
    self._update = jax.jit(self._update_impl, donate_argnums=(0, 1), static_argnames=("members",))
    self._act = jax.jit(self._act_impl, static_argnames=("mode",))
    self._task_grads = jax.jit(self._task_grads_impl, static_argnames=("exclude", "loss"))

  # ---------------------------------------------------------------- state
  def replay_extras(self) -> dict:
    """The per-step extras the replay must store (`replay.init(..., extras=...)`)."""
    if not self.cfg.replay_context:
      return {}
    return {"deter": (self.wcfg.deter,), "stoch": (self.wcfg.stoch, self.wcfg.classes)}

  def init(self, key, assign: np.ndarray) -> dict:
    """A fresh state: world models for the groups of `assign` (all from one initialisation), per-task heads."""
    kw, ka = jax.random.split(key)
    m = int(assign.max()) + 1
    wm = stack(rssm.init(kw, self.wcfg), m)
    heads = jax.vmap(lambda k: behavior.init(k, self.bcfg, self.wcfg.feat_dim))(
        jax.random.split(ka, self.num_tasks))
    ac = {"actor": heads["actor"], "critic": heads["critic"]}
    return {"wm": wm, "wm_opt": jax.vmap(self.wm_opt.init)(wm), "ac": ac, "slow": heads["slow"],
            "actor_opt": jax.vmap(self.actor_opt.init)(ac["actor"]),
            "critic_opt": jax.vmap(self.critic_opt.init)(ac["critic"]),
            "ret_range": jnp.zeros((self.num_tasks,))}

  def split_groups(self, st: dict, old: np.ndarray, new: np.ndarray) -> dict:
    """The state for a new grouping: each new group model (and its Adam state) is the mean of the old models
    of its tasks."""
    wm = param_sharing.regroup(st["wm"], old, new)
    opt = param_sharing.regroup(st["wm_opt"], old, new)
    return {**st, "wm": wm, "wm_opt": opt}

  # ---------------------------------------------------------------- update
  def _update_impl(self, st, buf, key, do_exchange, tau, members):
    wcfg, bcfg, cfg = self.wcfg, self.bcfg, self.cfg
    exchange_mask = self.exchange_mask
    mem = np.asarray(members)                                   # (M, R), static: one trace per grouping
    m, r = mem.shape
    k_s, k_w, k_b = jax.random.split(key, 3)
    ctx = int(cfg.replay_context)
    sample = replay.sample_sequences(buf, k_s, m * r, cfg.seq_len + ctx, tasks=jnp.asarray(mem.reshape(-1)))
    batch = {k: sample[k][:, ctx:] if k in replay.STEP_FIELDS else sample[k] for k in replay.STEP_FIELDS + ("task_id",)}
    context = None
    if ctx:   # the window's first row is context: its stored latent and action start the posterior of the rest
      context = {"deter": sample["extra"]["deter"][:, 0], "stoch": sample["extra"]["stoch"][:, 0],
                 "action": sample["action"][:, 0]}
    split = lambda x: x.reshape((m, r) + x.shape[1:])   # noqa: E731
    batch, context = jax.tree.map(split, batch), jax.tree.map(split, context)

    def wm_one(p, o, b, cx, k):
      (_, (met, states)), g = jax.value_and_grad(rssm.loss, has_aux=True)(p, wcfg, b, k, self.obs_mask, cx)
      upd, o = self.wm_opt.update(g, o, p)
      return optax.apply_updates(p, upd), o, met, states
    wm, wm_opt, wm_met, states = jax.vmap(wm_one)(st["wm"], st["wm_opt"], batch, context, jax.random.split(k_w, m))
    if ctx:   # fresh posteriors back to the replay (rows in member order, as sampled)
      buf = replay.update_extra(buf, sample["task_id"], sample["slot"][:, ctx:],
                                {k: v.reshape((m * r,) + v.shape[2:]) for k, v in states.items()})
    if exchange_mask is not None:
      wm = jax.lax.cond(do_exchange, lambda w: param_sharing.soft_average(w, exchange_mask, tau), lambda w: w, wm)
    wm_sg = jax.lax.stop_gradient(wm)
    scales = jnp.maximum(1.0, st["ret_range"])
    # Imagination starts of each task: the posterior states of its rows (under its group's model), subsampled
    # to the same number per task, so that all tasks imagine in one vmapped rollout.
    rows = [np.argwhere(mem == t) for t in range(self.num_tasks)]
    groups = np.array([int(w[0, 0]) for w in rows])
    n = min(len(w) for w in rows) * cfg.seq_len
    if cfg.imag_starts:
      n = min(n, cfg.imag_starts)
    starts = []
    for t, w in enumerate(rows):
      s_t = jax.tree.map(lambda x, g=int(w[0, 0]), i=w[:, 1]: x[g, i].reshape((-1,) + x.shape[3:]), states)
      pick = jax.random.permutation(jax.random.fold_in(k_b, 1000 + t), len(w) * cfg.seq_len)[:n]
      starts.append(jax.tree.map(lambda x, i=pick: x[i], s_t))
    starts = jax.tree.map(lambda *x: jnp.stack(x), *starts)                  # leaves (T, n, ...)
    wm_t = jax.tree.map(lambda x: x[groups], wm_sg)                           # each task's group model
    emb = wm_t["emb"][jnp.arange(self.num_tasks), jnp.arange(self.num_tasks)]
    keys = jax.random.split(k_b, self.num_tasks)

    def bh_loss(ac):
      heads = {"actor": ac["actor"], "critic": ac["critic"], "slow": st["slow"]}
      loss, (met, ret) = jax.vmap(lambda h, p, s, e, sc, k: behavior.losses(h, bcfg, p, wcfg, s, e, sc, k))(
          heads, wm_t, starts, emb, scales, keys)
      return loss.sum(), (jax.tree.map(jnp.mean, met), ret)
    (_, (bh_met, rets)), g = jax.value_and_grad(bh_loss, has_aux=True)(st["ac"])

    def opt_step(opt, params, grads, state):
      upd, state = jax.vmap(opt.update)(grads, state, params)
      return optax.apply_updates(params, upd), state
    actor, actor_opt = opt_step(self.actor_opt, st["ac"]["actor"], g["actor"], st["actor_opt"])
    critic, critic_opt = opt_step(self.critic_opt, st["ac"]["critic"], g["critic"], st["critic_opt"])
    slow = behavior.update_slow({"slow": st["slow"], "critic": critic}, bcfg.slow_rate)["slow"]
    # The return range of each task: 95th - 5th percentile of its imagined returns, as an EMA (DreamerV3).
    ret_range, _ = jax.vmap(dist.percentile_scale)(rets.reshape(self.num_tasks, -1), st["ret_range"])
    new = {"wm": wm, "wm_opt": wm_opt, "ac": {"actor": actor, "critic": critic}, "slow": slow,
           "actor_opt": actor_opt, "critic_opt": critic_opt, "ret_range": ret_range}
    met = {**{f"wm/{k}": v.mean() for k, v in wm_met.items()}, **{f"ac/{k}": v for k, v in bh_met.items()}}
    return new, buf, met

  def update(self, st, buf, members, key, *, do_exchange=False, tau=0.0):
    """One world-model and actor-critic step; returns (state, replay, metrics) (the state and the replay are
    donated; the replay changes only with `replay_context`); `members` (M, R) are the task ids of each group
    model's rows (`member_rows`); `do_exchange` soft-averages the exchange subset across the group models with
    weight `tau` after the world-model step (stage 2)."""
    members = tuple(tuple(int(x) for x in row) for row in np.asarray(members))
    return self._update(st, buf, key, jnp.asarray(do_exchange), jnp.asarray(tau, jnp.float32), members=members)

  # ---------------------------------------------------------------- acting
  def initial_carry(self, batch: int) -> dict:
    s = rssm.initial(self.wcfg, (batch,))
    return {**s, "action": jnp.zeros((batch, self.wcfg.act_dim))}

  def _act_impl(self, st, groups, tasks, carry, obs, first, key, mode=False):
    wcfg, bcfg = self.wcfg, self.bcfg

    def one(g, t, deter, stoch, prev_a, o, f, k):
      p = jax.tree.map(lambda x: x[g], st["wm"])
      e = p["emb"][t]
      k1, k2 = jax.random.split(k)
      post, _, _ = rssm.obs_step(p, wcfg, {"deter": deter, "stoch": stoch}, prev_a, rssm.encode(p, wcfg, o), f, e,
                                 k1)
      actor = jax.tree.map(lambda x: x[t], st["ac"]["actor"])
      a = behavior.act(actor, bcfg, rssm.feat(post, e), k2, mode)
      return a, post
    keys = jax.random.split(key, obs.shape[0])
    a, post = jax.vmap(one)(groups, tasks, carry["deter"], carry["stoch"], carry["action"], obs, first, keys)
    return a, {**post, "action": a}

  def act(self, st, groups, tasks, carry, obs, first, key, mode: bool = False):
    """Actions (B, act_dim) for observations of tasks `tasks` under group models `groups`; the new carry."""
    return self._act(st, jnp.asarray(groups), jnp.asarray(tasks), carry, jnp.asarray(obs), jnp.asarray(first),
                     key, mode=mode)

  # ---------------------------------------------------------------- grouping
  def task_gradients(self, st, buf, key, batches: int, exclude=("emb", "rew"), loss: str = "obs") -> np.ndarray:
    """(T, P) mean world-model gradient of each task at the mean of the group models (of the observation loss,
    or with loss="full" the whole world-model loss)."""
    model = jax.tree.map(lambda x: x.mean(0), st["wm"])
    t_n, b = self.num_tasks, self.cfg.batch_size
    tids = np.repeat(np.arange(t_n), batches * b).astype(np.int32)
    data = replay.sample_sequences(buf, key, len(tids), self.cfg.seq_len, tasks=jnp.asarray(tids))
    data = {k: data[k].reshape((t_n, batches, b) + data[k].shape[1:]) for k in replay.STEP_FIELDS + ("task_id",)}
    return np.asarray(self._task_grads(model, data, exclude=tuple(exclude), loss=loss))

  def _task_grads_impl(self, model, data, exclude, loss):
    def loss_fn(p, batch):
      total, (met, _) = rssm.loss(p, self.wcfg, batch, jax.random.key(0), self.obs_mask)
      return met["obs"] if loss == "obs" else total
    return grouping_lib.task_gradients(loss_fn, model, data, exclude=exclude)

  def affinity(self, st, buf, key, g: GroupingConfig) -> np.ndarray:
    """(T, T) cosine matrix of the tasks' world-model gradients (`g.grad_batches`, `g.exclude`, `g.loss`)."""
    return grouping_lib.cosine_matrix(self.task_gradients(st, buf, key, g.grad_batches, tuple(g.exclude), g.loss))

  def group(self, st, buf, key, g: GroupingConfig, sim=None) -> tuple[np.ndarray, np.ndarray]:
    """(labels (T,), cosine matrix (T, T)) of the tasks' world-model gradients (or of the given `sim`), clustered
    as `g` says."""
    sim = self.affinity(st, buf, key, g) if sim is None else np.asarray(sim)
    n = g.num_groups or None
    labels = grouping_lib.cluster(sim, n, threshold=None if n else g.threshold)
    return labels.astype(np.int64), sim
