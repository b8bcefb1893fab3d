"""SLOT-Align glue: domains -> clients -> statistics over the channel -> server alignment -> O-FedAvg.

The reusable pieces live in the library: Gaussian OT in `jaxlab.ot` (Ledoit-Wolf, Bures barycenter,
closed-form map, geodesic interpolation), the federated parts in `jaxlab.federated` (partitions, client
statistics and the statistics-only `Channel`, server alignment, vmapped local heads, FedAvg, macro accuracy).

Per alpha (one communication of d + d^2 + 1 floats per client):
  clients: idx_k = Dirichlet(alpha) label skew of domain k; (n_k, m_k, C_k) = LedoitWolf(x_k[idx_k]).
  server:  (m_bar, C_bar) = Bures barycenter with w_k = n_k / sum n; (A_k, b_k) = Gaussian map k -> bar.
Per tau:   client k trains a linear head on T_tau,k(x) = ((1 - tau) I + tau A_k) x + tau b_k; the server averages
           the heads with equal weights; domain k's test features go through T_tau,k; macro accuracy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError, DataError
from jaxlab.federated import client as client_lib
from jaxlab.federated import data as fdata
from jaxlab.federated import head as head_lib
from jaxlab.federated import partition, server
from jaxlab.ot import gaussian


def load_domains(config) -> dict:
  """Per-domain train/test features, padded to common row counts (masks mark valid rows).

  Returns:
    {"train_x": (K, N, d) f32, "train_y": (K, N) i32, "train_mask": (K, N) f32, "test_x": (K, M, d),
     "test_y": (K, M), "test_mask": (K, M), "num_classes": C, "domains": [names]}.
  """
  d = config.data
  if d.source == "synthetic":
    g = fdata.gaussian_domains(config.seed, d.num_domains, d.dim, d.num_classes, d.class_scale, d.distortion,
                               d.shift, d.train_per_class, d.test_per_class)
    return {"train_x": g["train_x"], "train_y": g["train_y"], "train_mask": np.ones(g["train_y"].shape, np.float32),
            "test_x": g["test_x"], "test_y": g["test_y"], "test_mask": np.ones(g["test_y"].shape, np.float32),
            "num_classes": d.num_classes, "domains": [f"domain{k}" for k in range(d.num_domains)]}
  if not d.path:   # checked here, not in validate: the full variant is a valid config before the features exist
    raise ConfigError("config.data.source='features' needs --config.data.path=FEATURES.npz with arrays "
                      "<domain>_x (n, d) and <domain>_y (n,) from a frozen encoder (README, 'Full scale')")
  from . import config as config_lib  # pylint: disable=g-import-not-at-top
  names, num_classes = config_lib.DATASETS[d.dataset]
  try:
    feats = fdata.load_feature_npz(d.path, names)
  except DataError as e:
    if "no array" not in str(e):
      raise
    with np.load(d.path) as z:
      held = set(z.files)
    fits = [k for k, (doms, _) in config_lib.DATASETS.items() if all(f"{n}_x" in held for n in doms)]
    known = ", ".join(f"{k}: {v[0]}" for k, v in config_lib.DATASETS.items())
    hint = (f"the file holds the domains of --config.data.dataset={fits[0]}" if fits else
            f"name its arrays after one dataset's domains ({known}) or add yours to DATASETS in "
            "experiments/slot_align/config.py")
    raise DataError(f"{e}; config.data.dataset={d.dataset!r} reads the domains {list(names)}: {hint}") from None
  rng = np.random.default_rng([config.seed, 7])
  tr, te = [], []
  for name in names:
    x, y = feats[name]
    if y.max() >= num_classes or y.min() < 0:
      raise DataError(f"{d.path}: labels of {name} must be in [0, {num_classes}) for {d.dataset}")
    xtr, ytr, xte, yte = fdata.train_test_split(x, y, d.test_fraction, rng)
    tr.append((xtr, ytr))
    te.append((xte, yte))
  n, m = max(len(a[1]) for a in tr), max(len(a[1]) for a in te)
  return {"train_x": _pad([a[0] for a in tr], n), "train_y": _pad([a[1] for a in tr], n),
          "train_mask": _pad([np.ones(len(a[1]), np.float32) for a in tr], n),
          "test_x": _pad([a[0] for a in te], m), "test_y": _pad([a[1] for a in te], m),
          "test_mask": _pad([np.ones(len(a[1]), np.float32) for a in te], m),
          "num_classes": num_classes, "domains": list(names)}


def _pad(arrays, rows):
  out = []
  for a in arrays:
    pad = [(0, rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1)
    out.append(np.pad(a, pad))
  return np.stack(out)


def client_masks(config, data: dict, alpha_index: int) -> np.ndarray:
  """(K, N) 0/1 masks of the rows each client keeps under Dirichlet(alpha) label skew (alpha = 0: all)."""
  alpha = float(config.method.alphas[alpha_index])
  valid = [np.flatnonzero(m > 0) for m in data["train_mask"]]
  rng = np.random.default_rng([config.seed, 1, alpha_index])
  keep = partition.dirichlet_label_skew([y[v] for y, v in zip(data["train_y"], valid)], data["num_classes"], alpha,
                                        rng, min_samples=config.method.min_client_samples)
  mask = np.zeros(data["train_mask"].shape, np.float32)
  for k, (v, kp) in enumerate(zip(valid, keep)):
    mask[k, v[kp]] = 1.0
  return mask


def communicate(config, x_knd: np.ndarray, mask_kn: np.ndarray):
  """Clients summarise their own features and send the summaries; returns (channel, features used, pca info).

  With `method.pca`, a first exchange of (n, mean, scatter / n) builds the pooled PCA basis (99% of the
  variance); clients then project their features and send Ledoit-Wolf statistics in the reduced space.
  """
  m = config.method
  center = basis = None
  if m.pca:
    pre = client_lib.Channel()
    for k in range(x_knd.shape[0]):
      n, mean, scatter = client_lib.scatter_statistics(x_knd[k][mask_kn[k] > 0])
      pre.send(k, client_lib.encode_message(client_lib.ClientStats(n, mean, scatter / n)))
    got = pre.received()
    with jax.enable_x64(True):
      center, basis, _ = gaussian.pooled_pca(np.array([s.n for s in got]), np.stack([s.mean for s in got]),
                                             np.stack([s.n * s.cov for s in got]), m.pca_var)
      center, basis = np.asarray(center), np.asarray(basis)
  channel = client_lib.Channel()
  for k in range(x_knd.shape[0]):
    stats = client_lib.client_statistics(x_knd[k][mask_kn[k] > 0], m.spd_eps, basis, center)
    channel.send(k, client_lib.encode_message(stats))
  return channel, center, basis


def align(config, channel) -> tuple[server.Alignment, float, float]:
  """Server alignment from the received statistics; returns (alignment, max mean rel. err, max cov rel. err)."""
  m = config.method
  stats = channel.received()
  al = server.align(stats, m.weighting, m.bary_iters, m.bary_tol, m.backend)
  em, ec = server.map_residuals(stats, al)
  return al, float(em.max()), float(ec.max())


def geodesic_maps(al: server.Alignment, tau: float, num_padded: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-client (A_tau (Kp, d, d), b_tau (Kp, d)) in float32; padding clients get the identity."""
  k, d = al.b.shape
  a = np.tile(np.eye(d), (num_padded, 1, 1))
  b = np.zeros((num_padded, d))
  a[:k] = (1.0 - tau) * np.eye(d) + tau * al.a
  b[:k] = tau * al.b
  return a.astype(np.float32), b.astype(np.float32)


def client_steps(config, mask_kn: np.ndarray) -> tuple[int, np.ndarray | None]:
  """(static step count, per-client budgets or None) from config.head (fixed steps or local epochs)."""
  h = config.head
  if h.steps:
    return int(h.steps), None
  per = np.array([h.epochs * math.ceil(max(n, 1) / h.batch_size) for n in mask_kn.sum(1)], np.int32)
  return int(per.max()), per


def make_round(config, steps: int, per_client: bool):
  """The jitted one-shot round over a client axis sharded on the "data" axis of the mesh in context.

  Returns:
    `round(x, y, mask, a, b, keys, budgets, weights, test_x, test_y, test_mask) -> metrics` where x (Kp, N, d)
    are raw client features, (a, b) the per-client geodesic maps, weights (Kp,) the FedAvg weights
    (0 for padding clients); metrics: macro accuracy, std and per-domain accuracy, mean final local loss.
  """
  h = config.head
  kw = dict(steps=steps, lr=h.lr, momentum=h.momentum, weight_decay=h.weight_decay, batch_size=h.batch_size,
            loss=h.loss)
  mesh = mesh_lib.current_mesh()
  cl = NamedSharding(mesh, P("data"))
  rep = NamedSharding(mesh, P())

  def fn(x, y, mask, a, b, keys, budgets, weights, init, test_x, test_y, test_mask):
    xt = jnp.einsum("knd,ked->kne", x, a) + b[:, None, :]
    heads = head_lib.train_clients(init, xt, y, mask, keys, budgets if per_client else None, **kw)
    losses = jax.vmap(head_lib.head_loss, in_axes=(0, 0, 0, 0, None))(heads, xt, y, mask, h.loss)
    avg = head_lib.fedavg(heads, weights)
    zt = head_lib.logits(avg, jnp.einsum("knd,ked->kne", test_x, a) + b[:, None, :])
    correct = (jnp.argmax(zt, -1) == test_y).astype(jnp.float32)
    acc = head_lib.macro_accuracy(correct, test_mask, (weights > 0).astype(jnp.float32))
    loss = jnp.sum(losses * (weights > 0)) / jnp.sum(weights > 0)
    return {"macro": acc["macro"], "std": acc["std"], "per_domain": acc["per_domain"], "loss": loss}

  shard = (cl,) * 8 + (rep,) + (cl,) * 3
  return jax.jit(fn, in_shardings=shard, out_shardings=rep)


def pad_clients(arr: np.ndarray, num_padded: int) -> np.ndarray:
  """Pads the leading client axis with zeros to `num_padded` entries."""
  return np.pad(arr, [(0, num_padded - arr.shape[0])] + [(0, 0)] * (arr.ndim - 1))


def padded_count(k: int) -> int:
  """Smallest multiple of the data-axis size of the mesh in context that is >= k."""
  s = dict(mesh_lib.current_mesh().shape)["data"]
  return -(-k // s) * s
