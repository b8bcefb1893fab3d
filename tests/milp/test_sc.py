"""SC-MILP training pieces: the lambda and strata schedules, coarse-to-fine strata on blobs, the positive mask
against a brute-force loop, and the joint loss against its parts (lam = 0 is the imitation loss exactly; the head
gets gradient only through the contrastive term)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.milp import gcnn, sc
from jaxlab.nn import contrastive
from test_gcnn import FC, FE, FR, random_sample  # pylint: disable=g-bad-import-order
from test_strata import _blobs  # pylint: disable=g-bad-import-order


def test_lambda_ramp():
  got = [float(sc.lambda_at(s, 100, 0.1, ramp=0.3)) for s in (0, 15, 30, 31, 99)]
  np.testing.assert_allclose(got, [0.0, 0.05, 0.1, 0.1, 0.1], rtol=1e-6)
  assert float(jax.jit(lambda s: sc.lambda_at(s, 100, 0.1, 0.3))(jnp.int32(15))) == pytest.approx(0.05)
  assert float(sc.lambda_at(0, 100, 0.1, ramp=0.0)) == pytest.approx(0.1)
  with pytest.raises(ValueError, match="ramp=1.5 must be in"):
    sc.lambda_at(0, 100, 0.1, ramp=1.5)


def test_k_schedule_is_monotone_coarse_to_fine():
  ks = [sc.k_at(s, 100, 2, 5, ramp=0.5) for s in range(101)]
  assert ks[0] == 2 and ks[50] == 5 and ks[-1] == 5
  assert all(b >= a for a, b in zip(ks, ks[1:]))
  assert sorted(set(ks)) == [2, 3, 4, 5]
  with pytest.raises(ValueError, match="k_start=3 <= k_final=2"):
    sc.k_at(0, 10, 3, 2)


def test_dynamic_strata_on_blobs():
  x, blob = _blobs(4, seed=4)
  depth = blob * 2.0
  d = sc.DynamicStrata.fit(x, depth, num_steps=100, k_start=2, ramp=0.5)
  assert (d.k_start, d.k_final) == (2, 4)                    # the elbow finds the four blobs
  assert len(set(d.labels(0))) == 2 and len(set(d.labels(100))) == 4
  assert (d.labels(100) == blob).all()                       # finest strata = blobs, numbered by depth
  np.testing.assert_array_equal(d.assign(x), d.labels(100))
  np.testing.assert_array_equal(d.assign(x, step=0), d.labels(0))
  assert sc.DynamicStrata.fit(x, depth, 10, k_final=3).k_final == 3


def test_positive_mask_brute_force():
  rng = np.random.default_rng(0)
  s, dec, org = (rng.integers(0, 3, 12) for _ in range(3))
  got = np.asarray(sc.positive_mask(jnp.asarray(s), jnp.asarray(dec), jnp.asarray(org)))
  for i in range(12):
    for j in range(12):
      assert got[i, j] == ((s[i] == s[j] and dec[i] == dec[j]) or org[i] == org[j])
  np.testing.assert_array_equal(np.asarray(sc.positive_mask(jnp.asarray(s))), s[:, None] == s[None])


@pytest.fixture(scope="module")
def batch_and_model():
  rng = np.random.default_rng(1)
  samples = [random_sample(rng, m=int(rng.integers(12, 25)), n=int(rng.integers(20, 31))) for _ in range(8)]
  model = gcnn.BipartiteGCNN(FR, FC, FE, emb=16, rngs=nnx.Rngs(0))
  gcnn.fit_prenorm(model, [gcnn.pack(samples)])
  batch = dict(gcnn.pack(samples), stratum=np.array([0, 0, 1, 1, 2, 2, 0, 1], np.int32),
               origin=np.array([0, 0, 1, 2, 3, 4, 5, 6], np.int32))
  head = contrastive.ProjectionHead(2 * 16, 16, 8, rngs=nnx.Rngs(1))
  return model, head, batch


def test_sc_loss_is_imitation_plus_weighted_supcon(batch_and_model):
  model, head, batch = batch_and_model
  base, _ = gcnn.imitation_loss(model, batch, ties=True)
  loss0, m0 = sc.sc_loss(model, head, batch, 0.0, ties=True)
  assert float(loss0) == float(base)
  z = head(model.node_embedding(batch))
  pos = np.asarray(sc.positive_mask(batch["stratum"], None, batch["origin"]))
  con = contrastive.supcon_loss(z, jnp.asarray(pos), 0.2, batch["sample_weight"])
  loss, m = sc.sc_loss(model, head, batch, 0.5, tau=0.2, ties=True)
  assert float(loss) == pytest.approx(float(base) + 0.5 * float(con), rel=1e-6)
  assert float(m["contrastive"]) == pytest.approx(float(con), rel=1e-6) and float(m["lambda"]) == 0.5
  assert float(m0["contrastive"]) > 0


def test_head_learns_only_through_the_contrastive_term(batch_and_model):
  model, head, batch = batch_and_model

  def grads(lam):
    g = nnx.grad(lambda h, m: sc.sc_loss(m, h, batch, lam)[0], argnums=(0, 1))(head, model)
    return [jax.tree.leaves(nnx.state(x, nnx.Param)) for x in g]

  (gh0, gm0), (gh1, gm1) = grads(0.0), grads(1.0)
  assert all(float(jnp.abs(x).max()) == 0 for x in gh0)
  assert any(float(jnp.abs(x).max()) > 0 for x in gh1)
  assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(gm0, gm1))    # the contrast reaches the GCNN
