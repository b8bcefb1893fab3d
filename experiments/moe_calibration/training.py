"""The paper's training pipeline for soft MoEs (claim 3): a backbone, the router MLP and linear experts trained end to
end on the mixture's negative log-likelihood, then the robust objective (`jaxlab.calibration.robust`).

As the official code trains (ginawong/calibrated_moe, `scripts/train.py` and `training.py`, read at commit 00b7609):
AdamW (lr 1e-3, weight decay 1e-4), a cosine schedule stepped once per epoch over all epochs, batch 128, plain ERM
for the first `warmup_epochs` (20 of 50), then the robust loss with eta = 2 (weights not detached). Arms:

* vanilla: ERM for all epochs (the "Vanilla MoE"; also the eta = 0 / w == 1 ablation of the full tilt).
* mocae: vanilla + per-expert temperature scaling on gate-weighted validation rows ("MoCaE", the calibrated soft
  MoE of claims 1-2, here with a learned router).
* robust: the full tilt sum_i softmax(eta l)_i l_i after the warm-up ("Robust MoE").
* filtered: mean loss + the tilt over the routing-relevant rows ("Robust Filtered", the paper's best overall ECE).
* filtered_w1: the filtered objective with uniform weights (eta = 0): the w == 1 ablation of the reweighting, same
  filter and same extra term.

Every arm of one world starts from the same initialisation and sees the same minibatches; the arms that share the
warm-up share its parameters and optimiser state. Everything is vmapped over worlds (the leading axis of the data
and of the parameters), so one call trains many worlds at once (the 100-world calibration) or one (a claim seed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlab.calibration import robust as robust_lib
from jaxlab.calibration import temperature
from jaxlab.nn.mlp import MLP
from jaxlab.nn import moe
from jaxlab.nn.moe import MoEClassifier

TRAINED_ARMS = ("vanilla", "robust", "filtered", "filtered_w1")
REPORTED_ARMS = ("vanilla", "mocae", "robust", "robust_ts", "filtered", "filtered_ts", "filtered_w1",
                 "filtered_w1_ts")
_OBJECTIVES = {"robust": ("robust", None), "filtered": ("filtered", None), "filtered_w1": ("filtered", 0.0)}


class MoENet(nnx.Module):
  """Backbone MLP d -> H -> H (ReLU) + `MoEClassifier` (router H -> 128 -> K, K linear experts, soft routing)."""

  def __init__(self, in_features: int, hidden: int, num_classes: int, num_experts: int, *, rngs: nnx.Rngs):
    with nnx.use_eager_sharding(False):      # logical names only; no mesh here
      self.backbone = MLP(in_features, (hidden,), hidden, rngs=rngs, activation=jax.nn.relu)
    self.head = MoEClassifier(hidden, num_classes, num_experts, rngs=rngs, routing="soft")

  def __call__(self, x):
    return self.head(jax.nn.relu(self.backbone(x)))


def objective(out: dict, labels, kind: str, eta: float) -> jax.Array:
  """The minibatch loss: "erm" (mean mixture NLL), "robust" (the tilt) or "filtered" (mean + tilt on relevant)."""
  losses = robust_lib.mixture_nll(out["probs"], labels)
  if kind == "erm":
    return jnp.mean(losses)
  if kind == "robust":
    return robust_lib.tilted_loss(losses, eta)
  if kind == "filtered":
    relevant = robust_lib.routing_relevant(out["probs"], jax.nn.softmax(out["expert_logits"], -1), out["gates"],
                                           labels)
    return robust_lib.filtered_tilted_loss(losses, relevant, eta)
  raise ValueError(kind)


class Trainer:
  """Vmapped (over worlds) training of `MoENet` on (W, N, D) inputs and (W, N) labels."""

  def __init__(self, in_features: int, t):
    self.t = t
    self.graphdef = nnx.graphdef(MoENet(in_features, t.hidden, 2, t.num_experts, rngs=nnx.Rngs(0)))
    self.steps_per_epoch = t.train_size // t.batch_size
    spe, epochs, lr = self.steps_per_epoch, t.epochs, t.lr
    # torch's CosineAnnealingLR(T_max=epochs) stepped per epoch: constant inside an epoch.
    self.tx_schedule = lambda count: lr * 0.5 * (1 + jnp.cos(jnp.pi * (count // spe) / epochs))
    self.tx = optax.adamw(self.tx_schedule, weight_decay=t.weight_decay)
    self.in_features = in_features

  def init(self, keys):
    """(params, opt_state), stacked over worlds, one PRNG key per world."""
    def one(key):
      params = nnx.state(MoENet(self.in_features, self.t.hidden, 2, self.t.num_experts, rngs=nnx.Rngs(key)))
      return params, self.tx.init(params)
    return jax.jit(jax.vmap(one))(keys)

  @functools.partial(jax.jit, static_argnums=(0, 5), donate_argnums=(1,))
  def _epochs(self, carry, x, y, keys, kind_eta):
    kind, eta = kind_eta
    spe, b = self.steps_per_epoch, self.t.batch_size

    def world(carry, x, y, keys):
      def epoch(carry, key):
        perm = jax.random.permutation(key, x.shape[0])[:spe * b].reshape(spe, b)

        def step(carry, idx):
          params, opt = carry
          def loss_fn(p):
            return objective(nnx.merge(self.graphdef, p)(x[idx]), y[idx], kind, eta)
          grads = jax.grad(loss_fn)(params)
          upd, opt = self.tx.update(grads, opt, params)
          return (optax.apply_updates(params, upd), opt), None
        return jax.lax.scan(step, carry, perm)[0], None
      return jax.lax.scan(epoch, carry, keys)[0]
    return jax.vmap(world)(carry, x, y, keys)

  def run(self, carry, x, y, keys, kind: str, eta: float):
    """Trains `keys.shape[1]` epochs (keys (W, E, 2): one shuffle key per world and epoch) with one objective."""
    return self._epochs(carry, x, y, keys, (kind, float(eta)))

  def train_arms(self, x, y, seeds, progress=None) -> dict:
    """{arm: params} for vanilla, robust, filtered and filtered_w1 (mocae reuses vanilla's), stacked over worlds."""
    t = self.t
    keys = jax.vmap(lambda s: jax.random.split(jax.random.key(s), 2))(jnp.asarray(seeds, jnp.uint32))
    carry = self.init(keys[:, 0])
    ekeys = jax.vmap(lambda k: jax.random.split(k, t.epochs))(keys[:, 1])            # (W, epochs)
    warm = self.run(carry, x, y, ekeys[:, :t.warmup_epochs], "erm", 0.0)
    if progress:
      progress("warm-up")
    out = {}
    for arm, (kind, eta) in (("vanilla", ("erm", 0.0)),) + tuple(_OBJECTIVES.items()):
      start = jax.tree.map(jnp.copy, warm)     # `run` donates its carry
      out[arm] = self.run(start, x, y, ekeys[:, t.warmup_epochs:], kind, t.eta if eta is None else eta)[0]
      if progress:
        progress(arm)
    return out

  @functools.partial(jax.jit, static_argnums=(0,))
  def _forward(self, params, x):
    return jax.vmap(lambda p, x: nnx.merge(self.graphdef, p)(x))(params, x)

  def forward(self, params, x, chunk: int = 50_000) -> dict:
    """{"probs", "gates", "expert_logits"} for (W, N, D) inputs, in chunks of rows (numpy, float32)."""
    parts = [self._forward(params, x[:, i:i + chunk]) for i in range(0, x.shape[1], chunk)]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts], axis=1) for k in ("probs", "gates", "expert_logits")}


def calibrated(out: dict, temps) -> np.ndarray:
  """sum_k g_k softmax(z_k / T_k) of one world's forward outputs."""
  return np.asarray(moe.mixture(out["expert_logits"], out["gates"], np.asarray(temps, np.float32)))


def arm_probs_batch(trainer: Trainer, params: dict, val_x, val_y, test_x: dict) -> list[tuple[dict, dict]]:
  """Per world: ({shift: {arm: (N, C) probabilities}}, {arm: per-expert temperatures}).

  params: {trained arm: params stacked over W worlds}; val_x (W, N, D), val_y (W, N); test_x {shift: (W, N, D)}.
  Every trained arm is reported as trained and with per-expert temperature scaling fitted on its gate-weighted
  validation rows ("<arm>_ts"); vanilla's calibrated version is MoCaE ("mocae").
  """
  n_worlds = val_x.shape[0]
  worlds = [({s: {} for s in test_x}, {}) for _ in range(n_worlds)]
  for arm, p in params.items():
    vo = trainer.forward(p, val_x)
    outs = {s: trainer.forward(p, x) for s, x in test_x.items()}
    name_ts = "mocae" if arm == "vanilla" else f"{arm}_ts"
    for w in range(n_worlds):
      probs, temps = worlds[w]
      temps[name_ts] = temperature.fit_expert_temperatures(vo["expert_logits"][w], val_y[w], vo["gates"][w])
      for s, o in outs.items():
        ow = {k: v[w] for k, v in o.items()}
        probs[s][arm] = ow["probs"]
        probs[s][name_ts] = calibrated(ow, temps[name_ts])
  return worlds


def arm_probs(trainer: Trainer, params: dict, val: dict, tests: dict) -> tuple[dict, dict]:
  """`arm_probs_batch` for one world (params stacked over one world; val / tests unbatched data dicts)."""
  return arm_probs_batch(trainer, params, val["x"][None], val["y"][None],
                         {s: t["x"][None] for s, t in tests.items()})[0]


def tilt_diagnostics(trainer: Trainer, params, x, y, eta: float, seed: int = 0) -> list[dict]:
  """Per world, what the tilt sees on the training set under `params`: training accuracy and mean NLL, the mean
  effective sample size of the tilt weights q = softmax(eta l) over random minibatches as a fraction of the batch
  ((sum q)^2 / sum q^2 / B: 1 = uniform, no reweighting), and the fraction of routing-relevant rows (the filter)."""
  out = trainer.forward(params, x)
  b = trainer.t.batch_size
  res = []
  for w in range(x.shape[0]):
    probs, gates = jnp.asarray(out["probs"][w]), jnp.asarray(out["gates"][w])
    labels = jnp.asarray(y[w])
    losses = robust_lib.mixture_nll(probs, labels)
    relevant = robust_lib.routing_relevant(probs, jax.nn.softmax(jnp.asarray(out["expert_logits"][w]), -1), gates,
                                           labels)
    perm = np.random.default_rng([seed, w]).permutation(len(labels))[:(len(labels) // b) * b].reshape(-1, b)
    q = jax.nn.softmax(eta * losses[perm], axis=-1)
    ess = jnp.mean(1.0 / jnp.sum(q ** 2, axis=-1)) / b
    res.append({"acc": float(jnp.mean(jnp.argmax(probs, -1) == labels)), "nll": float(jnp.mean(losses)),
                "tilt_ess": float(ess), "relevant": float(jnp.mean(relevant))})
  return res
