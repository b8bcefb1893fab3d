"""jaxlab.federated: partitions, statistics-only transport, server alignment, local heads, FedAvg, metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.errors import DataError
from jaxlab.federated import client, data, head, partition, server

pot = pytest.importorskip("ot")


def _domains(seed=0, n=30):
  g = data.gaussian_domains(seed, num_domains=3, dim=4, num_classes=3, train_per_class=n, test_per_class=5)
  return g["train_x"], g["train_y"]


def test_dirichlet_label_skew_fractions_and_alpha_zero():
  ys = [np.repeat(np.arange(5), 200) for _ in range(4)]
  full = partition.dirichlet_label_skew(ys, 5, 0.0, np.random.default_rng(0))
  assert all(len(k) == 1000 for k in full)
  rng = np.random.default_rng(1)
  p = partition.dirichlet_proportions(5, 4, 0.1, np.random.default_rng(1))
  keep = partition.dirichlet_label_skew(ys, 5, 0.1, rng)
  for k, (y, idx) in enumerate(zip(ys, keep)):
    counts = np.bincount(y[idx], minlength=5)
    np.testing.assert_array_equal(counts, np.floor(p[:, k] * 200).astype(int))
    assert len(np.unique(idx)) == len(idx)
  np.testing.assert_allclose(p.sum(1), 1.0)
  # Large alpha -> close to an even split; small alpha -> most classes concentrated on one client.
  even = partition.dirichlet_proportions(200, 4, 1000.0, np.random.default_rng(2))
  assert np.abs(even - 0.25).max() < 0.05
  skew = partition.dirichlet_proportions(200, 4, 0.05, np.random.default_rng(2))
  assert np.mean(skew.max(1) > 0.9) > 0.6


def test_label_skew_tops_up_nearly_empty_clients():
  ys = [np.repeat(np.arange(2), 3) for _ in range(8)]
  keep = partition.dirichlet_label_skew(ys, 2, 0.01, np.random.default_rng(0), min_samples=2)
  assert all(len(k) >= 2 for k in keep)
  with pytest.raises(DataError, match="labels must be"):
    partition.dirichlet_label_skew([np.array([0, 5])], 2, 0.1, np.random.default_rng(0))


def test_domain_per_client():
  idx = partition.domain_per_client(np.array([1, 0, 1, 2, 0]))
  assert [list(i) for i in idx] == [[1, 4], [0, 2], [3]]
  with pytest.raises(DataError, match="no samples"):
    partition.domain_per_client(np.array([0, 2]))


def test_client_statistics_match_sklearn():
  from sklearn.covariance import LedoitWolf
  x, _ = _domains()
  s = client.client_statistics(x[0])
  ref = LedoitWolf().fit(x[0].astype(np.float64))
  np.testing.assert_allclose(s.mean, ref.location_, atol=1e-10)
  np.testing.assert_allclose(s.cov, ref.covariance_, atol=1e-9)
  assert s.n == len(x[0]) and s.cov.dtype == np.float64


def test_transport_never_ships_raw_features():
  """Only (n, mean, cov) crosses the channel: size independent of n, no feature row, order-invariant."""
  sizes = []
  for n in (20, 80):
    x, _ = _domains(n=n)
    ch = client.Channel()
    for k in range(len(x)):
      ch.send(k, client.encode_message(client.client_statistics(x[k])))
    d = x.shape[-1]
    for _, msg in ch.log:
      assert set(msg) == {"n", "mean", "cov"}
      assert msg["mean"].shape == (d,) and msg["cov"].shape == (d, d) and msg["n"].shape == ()
      sent = np.concatenate([a.ravel() for a in msg.values()])
      for row in x.reshape(-1, d):  # no feature vector appears inside any message
        assert not any(np.allclose(sent[i:i + d], row, atol=1e-6) for i in range(len(sent) - d + 1))
    sizes.append(ch.floats_sent)
    # The summary cannot encode sample order: permuting a client's rows leaves its message unchanged.
    perm = client.encode_message(client.client_statistics(x[0][::-1]))
    np.testing.assert_allclose(perm["cov"], ch.log[0][1]["cov"], atol=1e-10)
  assert sizes[0] == sizes[1] == 3 * (1 + 4 + 16)
  ch = client.Channel()
  with pytest.raises(DataError, match="exactly the keys"):
    ch.send(0, {"features": x[0]})
  with pytest.raises(DataError, match="exactly the keys"):
    ch.send(0, {"n": 3, "mean": x[0][0], "cov": np.eye(4), "x": x[0]})
  with pytest.raises(DataError, match="per-sample arrays are refused"):
    ch.send(0, {"n": np.float64(len(x[0])), "mean": x[0], "cov": np.eye(4)})
  with pytest.raises(DataError, match="exactly the keys"):
    ch.send(0, x[0])
  assert ch.log == []


def test_server_alignment_matches_pot_and_pushes_to_barycenter():
  x, _ = _domains(1)
  stats = [client.client_statistics(xk) for xk in x]
  al = server.align(stats, "count", tol=1e-12)
  w = np.array([s.n for s in stats], float)
  ref_m, ref_c = pot.gaussian.bures_wasserstein_barycenter(np.stack([s.mean for s in stats]),
                                                           np.stack([s.cov for s in stats]), w / w.sum(),
                                                           num_iter=1000, eps=1e-12)
  np.testing.assert_allclose(al.mean, ref_m, atol=1e-10)
  np.testing.assert_allclose(al.cov, ref_c, atol=1e-8)
  em, ec = server.map_residuals(stats, al)
  assert em.max() < 1e-10 and ec.max() < 1e-10
  ref_a, ref_b = pot.gaussian.bures_wasserstein_mapping(stats[2].mean, ref_m, stats[2].cov, ref_c)
  np.testing.assert_allclose(al.a[2], ref_a, atol=1e-7)
  np.testing.assert_allclose(al.b[2], ref_b, atol=1e-7)


def _numpy_gd(w, b, x, y, c, steps, lr, mom, wd):
  """Independent reference: softmax regression by (momentum) gradient descent in numpy."""
  vw, vb = np.zeros_like(w), np.zeros_like(b)
  onehot = np.eye(c)[y]
  for _ in range(steps):
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    gz = (p - onehot) / len(x)
    gw, gb = x.T @ gz + wd * w, gz.sum(0) + wd * b
    vw, vb = mom * vw + gw, mom * vb + gb
    w, b = w - lr * vw, b - lr * vb
  return w, b


def test_local_train_matches_numpy_gd_and_ignores_padding():
  x, y = _domains(2)
  xk, yk = x[0].astype(np.float64), y[0]
  ref_w, ref_b = _numpy_gd(np.zeros((4, 3)), np.zeros(3), xk, yk, 3, 30, 0.1, 0.9, 1e-3)
  xp = np.concatenate([xk, 50 * np.ones((7, 4))]).astype(np.float32)
  yp = np.concatenate([yk, np.zeros(7, np.int32)])
  mask = np.r_[np.ones(len(xk)), np.zeros(7)].astype(np.float32)
  p = head.local_train(head.init_head(4, 3), jnp.asarray(xp), jnp.asarray(yp), jnp.asarray(mask),
                       jax.random.key(0), steps=30, lr=0.1, momentum=0.9, weight_decay=1e-3)
  np.testing.assert_allclose(p["w"], ref_w, atol=2e-5)
  np.testing.assert_allclose(p["b"], ref_b, atol=2e-5)


def test_train_clients_budgets_minibatches_and_fedavg():
  x, y = _domains(3)
  keys = jax.random.split(jax.random.key(0), 3)
  mask = np.ones(y.shape, np.float32)
  kw = dict(steps=6, lr=0.1, batch_size=8)
  heads = head.train_clients(head.init_head(4, 3), jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), keys,
                             jnp.array([6, 0, 3]), **kw)
  assert np.all(np.asarray(heads["w"][1]) == 0)  # a zero step budget leaves the init untouched
  three = head.local_train(head.init_head(4, 3), jnp.asarray(x[2]), jnp.asarray(y[2]), jnp.asarray(mask[2]),
                           keys[2], steps=3, lr=0.1, batch_size=8)
  np.testing.assert_allclose(heads["w"][2], three["w"], atol=1e-6)
  m, xc, yc = head.compact_rows(np.array([[0, 1, 0, 1]]), np.arange(4)[None, :, None], np.arange(4)[None])
  assert m.tolist() == [[1, 1, 0, 0]] and yc.tolist() == [[1, 3, 0, 2]] and xc[0, :, 0].tolist() == [1, 3, 0, 2]
  avg = head.fedavg(heads, jnp.array([1.0, 1.0, 0.0]))
  np.testing.assert_allclose(avg["w"], (np.asarray(heads["w"][0]) + np.asarray(heads["w"][1])) / 2, atol=1e-7)
  np.testing.assert_allclose(avg["b"], np.asarray(heads["b"][:2]).mean(0), atol=1e-7)


def test_softmax_quirk_loss_is_ce_on_probabilities():
  z = np.array([[2.0, 0.0, -1.0]])
  params = {"w": jnp.eye(3), "b": jnp.zeros(3)}
  p = np.exp(z) / np.exp(z).sum()
  ref = -np.log(np.exp(p[0, 0]) / np.exp(p).sum())
  got = head.head_loss(params, jnp.asarray(z), jnp.array([0]), jnp.ones(1), "softmax_ce")
  np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_macro_accuracy_matches_numpy():
  correct = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]], np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
  out = head.macro_accuracy(jnp.asarray(correct), jnp.asarray(mask), jnp.array([1.0, 1.0, 0.0]))
  per = [2 / 3, 1 / 4]
  np.testing.assert_allclose(out["per_domain"][:2], per, rtol=1e-6)
  np.testing.assert_allclose(out["macro"], np.mean(per), rtol=1e-6)
  np.testing.assert_allclose(out["std"], np.std(per), rtol=1e-5)


def test_extract_features_and_feature_files(tmp_path):
  w = jnp.ones((3, 2))
  f = client.extract_features(lambda x: x @ w, np.arange(15.0).reshape(5, 3), batch_size=2)
  np.testing.assert_allclose(f, np.arange(15.0).reshape(5, 3) @ np.ones((3, 2)))
  path = str(tmp_path / "f.npz")
  np.savez(path, a_x=np.ones((4, 3)), a_y=np.zeros(4, np.int64), b_x=np.ones((2, 5)), b_y=np.zeros(2, np.int64))
  assert data.load_feature_npz(path, ["a"])["a"][0].shape == (4, 3)
  with pytest.raises(DataError, match="other"):
    data.load_feature_npz(path, ["a", "b"])
  with pytest.raises(DataError, match="no array 'c_x'"):
    data.load_feature_npz(path, ["c"])
  with pytest.raises(DataError, match="not found"):
    data.load_feature_npz(str(tmp_path / "missing.npz"), ["a"])
