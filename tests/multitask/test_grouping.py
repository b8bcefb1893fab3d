"""Gradient grouping and parameter sharing: cosine matrix, clustering and ARI against sklearn / brute force,
path selection, soft averaging."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.errors import ConfigError
from jaxlab.multitask import grouping, param_sharing


def test_task_gradients_equal_a_loop_and_recover_planted_groups():
  params = {"w": jnp.arange(6.0).reshape(3, 2), "emb": jnp.ones((4, 2))}

  def loss(p, batch):
    return jnp.sum((batch["x"] @ p["w"] - batch["y"]) ** 2) + jnp.sum(p["emb"] * 0.0)
  rng = np.random.default_rng(0)
  targets = [np.array([3.0, -1.0]), np.array([3.0, -1.0]), np.array([-2.0, 4.0]), np.array([-2.0, 4.0])]
  x = 1.0 + 0.1 * rng.normal(size=(4, 5, 7, 3))          # a common input direction: gradients follow y
  y = np.stack([np.broadcast_to(t, (5, 7, 2)) for t in targets]) * 10
  batches = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
  g = grouping.task_gradients(loss, params, batches)
  for t in range(4):
    want = np.mean([np.ravel(jax.grad(loss)(params, {"x": x[t, k], "y": y[t, k]})["w"]) for k in range(5)], axis=0)
    np.testing.assert_allclose(g[t], want, rtol=1e-5)             # the embedding is left out
  s = grouping.cosine_matrix(g)
  np.testing.assert_allclose(np.diag(s), 1.0)
  labels = grouping.cluster(s, 2)
  assert grouping.adjusted_rand_index(labels, [0, 0, 1, 1]) == 1.0
  assert list(labels) == [0, 0, 1, 1]                             # relabelled by first appearance
  assert list(grouping.cluster(s, threshold=0.9)) == [0, 0, 1, 1]
  assert grouping.adjusted_rand_index(grouping.cluster(s, 2, method="spectral"), [0, 0, 1, 1]) == 1.0


def test_ari_against_a_pair_count():
  rng = np.random.default_rng(1)
  for _ in range(20):
    a, b = rng.integers(0, 3, 9), rng.integers(0, 3, 9)
    pairs = list(itertools.combinations(range(9), 2))
    same_a = np.array([a[i] == a[j] for i, j in pairs])
    same_b = np.array([b[i] == b[j] for i, j in pairs])
    n = len(pairs)
    index = np.sum(same_a & same_b)
    expected = same_a.sum() * same_b.sum() / n
    maximum = (same_a.sum() + same_b.sum()) / 2
    want = 1.0 if maximum == expected else (index - expected) / (maximum - expected)
    assert grouping.adjusted_rand_index(a, b) == pytest.approx(want)


def test_cluster_errors():
  with pytest.raises(ConfigError, match="exactly one of num_groups or threshold"):
    grouping.cluster(np.eye(3))
  with pytest.raises(ConfigError, match="num_groups=5 must be in"):
    grouping.cluster(np.eye(3), 5)


def test_select_and_soft_average():
  tree = {"enc": [{"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)}],
          "dyn": [{"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}]}
  assert param_sharing.paths(tree) == ["dyn/0/b", "dyn/0/w", "enc/0/b", "enc/0/w", "enc/1/b", "enc/1/w"]
  mask = param_sharing.select(tree, r"^enc/0/")
  assert jax.tree.leaves(mask) == [False, False, True, True, False, False]
  assert param_sharing.count(tree, mask) == 9
  stacked = jax.tree.map(lambda x: jnp.stack([x, x + 2.0, x + 4.0]), tree)
  mixed = param_sharing.soft_average(stacked, mask, 0.25)
  np.testing.assert_allclose(mixed["enc"][0]["w"][:, 0, 0], [1.5, 3.0, 4.5])     # 0.75 x + 0.25 * 3
  np.testing.assert_allclose(mixed["enc"][1]["w"][:, 0, 0], [1.0, 3.0, 5.0])     # not selected: unchanged
  full = param_sharing.soft_average(stacked, mask, 1.0)
  np.testing.assert_allclose(full["enc"][0]["b"], 2.0)
