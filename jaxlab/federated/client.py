"""Client side of one-shot federated feature alignment: frozen-encoder features and their statistics.

A client runs the shared, frozen encoder on its own data, summarises the features by one Gaussian
(Ledoit-Wolf mean and covariance with an eigenvalue floor) and sends ONLY that summary to the server: a
count, a (d,) mean and a (d, d) covariance. `Channel` is the transport: it accepts nothing else, so raw
features (or any per-sample array) can never leave a client through it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import DataError
from jaxlab.ot import gaussian

MESSAGE_KEYS = ("n", "mean", "cov")


class ClientStats(NamedTuple):
  """What a client sends: sample count n (int), mean (d,) and covariance (d, d), float64 numpy arrays."""
  n: int
  mean: np.ndarray
  cov: np.ndarray


def extract_features(encode: Callable[[jax.Array], jax.Array], inputs: np.ndarray, batch_size: int = 256
                     ) -> np.ndarray:
  """Runs a frozen encoder over inputs in batches (no gradients flow into it).

  Args:
    encode: `inputs (b, ...) -> features (b, d)` with the encoder's parameters closed over (frozen).
    inputs: (n, ...) array.
    batch_size: rows per call.

  Returns:
    (n, d) float32 numpy features.
  """
  fn = jax.jit(encode)   # the same encoder hits the jit cache across calls (no gradient is ever taken here)
  out = [np.asarray(fn(jnp.asarray(inputs[i:i + batch_size]))) for i in range(0, len(inputs), batch_size)]
  feats = np.concatenate(out, axis=0).astype(np.float32)
  if feats.ndim != 2 or len(feats) != len(inputs):
    raise DataError(f"the encoder must return (batch, d) features, got shape {feats.shape}")
  return feats


def client_statistics(features: np.ndarray, spd_eps: float = 1e-8, basis: np.ndarray | None = None,
                      center: np.ndarray | None = None) -> ClientStats:
  """Ledoit-Wolf Gaussian summary of one client's features, in float64.

  Args:
    features: (n, d) features of this client (n >= 2).
    spd_eps: eigenvalue floor spd_eps * max(1, tr C / d) (official default 1e-8).
    basis: optional (d, r) PCA basis (`jaxlab.ot.pooled_pca`); features become (x - center) @ basis.
    center: (d,) PCA centre (required with basis).

  Returns:
    ClientStats(n, mean (d,) or (r,), cov).
  """
  x = np.asarray(features, np.float64)
  if x.ndim != 2 or len(x) < 2 or not np.all(np.isfinite(x)):
    raise DataError(f"client features must be a finite (n >= 2, d) array, got shape {x.shape}")
  if basis is not None:
    x = (x - center) @ basis
  n = len(x)
  rows = 1 << max(int(n - 1).bit_length(), 1)  # pad to a power of two (masked): one compile per size bucket
  mask = np.zeros(rows)
  mask[:n] = 1.0
  xp = np.zeros((rows, x.shape[1]))
  xp[:n] = x
  with jax.enable_x64(True):
    m, c, _ = gaussian.ledoit_wolf(jnp.asarray(xp, jnp.float64), jnp.asarray(mask), spd_eps=spd_eps)
    return ClientStats(int(n), np.asarray(m, np.float64), np.asarray(c, np.float64))


def scatter_statistics(features: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
  """(n, mean (d,), within-client scatter sum_i (x_i - m)(x_i - m)^T (d, d)) for the pooled PCA option."""
  x = np.asarray(features, np.float64)
  m = x.mean(axis=0)
  xc = x - m
  return len(x), m, xc.T @ xc


def encode_message(stats: ClientStats) -> dict[str, np.ndarray]:
  """The wire format of a client's statistics: {"n": (), "mean": (d,), "cov": (d, d)} float64 arrays."""
  return {"n": np.asarray(stats.n, np.float64), "mean": np.asarray(stats.mean, np.float64),
          "cov": np.asarray(stats.cov, np.float64)}


def decode_message(msg: Mapping[str, np.ndarray]) -> ClientStats:
  """Inverse of `encode_message`."""
  return ClientStats(int(msg["n"]), np.asarray(msg["mean"]), np.asarray(msg["cov"]))


class Channel:
  """Client -> server transport that only carries Gaussian summaries.

  `send` checks that a message has exactly the keys n, mean, cov with shapes (), (d,), (d, d), a finite
  symmetric covariance and the same d for every client, and raises DataError otherwise (e.g. when handed
  an (n, d) feature array). Everything sent is kept in `log` for inspection; `floats_sent` counts scalars.
  """

  def __init__(self):
    self.log: list[tuple[int, dict[str, np.ndarray]]] = []
    self.dim: int | None = None

  def send(self, client: int, msg: Any) -> None:
    """Validates and records one client's message."""
    if not isinstance(msg, Mapping) or set(msg) != set(MESSAGE_KEYS):
      keys = sorted(msg) if isinstance(msg, Mapping) else type(msg).__name__
      raise DataError(f"client {client}: a message must be a dict with exactly the keys {MESSAGE_KEYS}, got {keys}; "
                      "only Gaussian statistics may leave a client")
    arrs = {k: np.asarray(v) for k, v in msg.items()}
    d = arrs["mean"].shape[0] if arrs["mean"].ndim == 1 else -1
    if arrs["n"].shape != () or arrs["mean"].ndim != 1 or arrs["cov"].shape != (d, d):
      raise DataError(f"client {client}: message shapes must be n (), mean (d,), cov (d, d); got "
                      f"{arrs['n'].shape}, {arrs['mean'].shape}, {arrs['cov'].shape} (per-sample arrays are refused)")
    if self.dim is not None and d != self.dim:
      raise DataError(f"client {client}: feature dimension {d} differs from the other clients' {self.dim}")
    if not all(np.all(np.isfinite(a)) for a in arrs.values()) or not np.allclose(arrs["cov"], arrs["cov"].T):
      raise DataError(f"client {client}: statistics must be finite with a symmetric covariance")
    if float(arrs["n"]) < 2 or float(arrs["n"]) != int(arrs["n"]):
      raise DataError(f"client {client}: n must be an integer >= 2, got {float(arrs['n'])}")
    self.dim = d
    self.log.append((client, {k: a.copy() for k, a in arrs.items()}))

  def received(self) -> list[ClientStats]:
    """The messages in client order (the latest one per client)."""
    last = {c: m for c, m in self.log}
    return [decode_message(last[c]) for c in sorted(last)]

  @property
  def floats_sent(self) -> int:
    """Scalars sent in total (1 + d + d^2 per client)."""
    return int(sum(a.size for _, m in self.log for a in m.values()))
