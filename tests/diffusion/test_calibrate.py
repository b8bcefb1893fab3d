"""Polyphonia's attention calibration (`controllers.calibrate`) against a brute-force loop over pairs, heads,
queries and tokens; its limits (M == 0: the source's logits off j*; M == 1, gamma = 0: the target's), step and
layer gating, and errors."""

import math

import numpy as np
import pytest

from jaxlab.diffusion import controllers as ctl
from jaxlab.errors import ConfigError


def _brute(src, tgt, prior, target, gamma, eps, modulation="log"):
  out = np.array(tgt, np.float64)
  b, h, l, s = tgt.shape
  for i in range(b):
    for k in range(h):
      for q in range(l):
        m = prior[i, q]
        for j in range(s):
          v = (1 - m) * src[i, k, q, j] + m * tgt[i, k, q, j]
          if j == target[i]:
            v += gamma * (m if modulation == "linear" else math.log(m + eps))
          out[i, k, q, j] = v
  return out


def _case(seed=0, b=3, h=2, l=5, s=4):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(2 * b, h, l, s)).astype(np.float32)
  prior = rng.uniform(size=(b, l)).astype(np.float32)
  target = rng.integers(0, s, size=b).astype(np.int32)
  return logits, prior, target


def test_matches_a_brute_force_loop():
  logits, prior, target = _case()
  c = ctl.calibrate(gamma=1.7, eps=0.05)
  out = np.asarray(c(logits, 0, np.full(6, 500), {"prior": prior, "target": target}))
  np.testing.assert_array_equal(out[:3], logits[:3])                       # the source half is untouched
  np.testing.assert_allclose(out[3:], _brute(logits[:3], logits[3:], prior, target, 1.7, 0.05), rtol=1e-5,
                             atol=1e-5)


def test_linear_modulation_matches_the_loop():
  """The paper's form: + gamma G on the stem token (no suppression outside the stem: G == 0 gives the source)."""
  logits, prior, target = _case(3)
  out = np.asarray(ctl.calibrate(gamma=2.5, modulation="linear")(logits, 0, np.zeros(6), {"prior": prior,
                                                                                          "target": target}))
  np.testing.assert_allclose(out[3:], _brute(logits[:3], logits[3:], prior, target, 2.5, 0.0, "linear"), rtol=1e-5,
                             atol=1e-5)
  zero = ctl.calibrate(gamma=2.5, modulation="linear")(logits, 0, np.zeros(6), {"prior": np.zeros_like(prior),
                                                                                "target": target})
  np.testing.assert_allclose(np.asarray(zero)[3:], logits[:3], atol=1e-6)
  with pytest.raises(ConfigError, match="modulation"):
    ctl.calibrate(modulation="exp")


def test_limits_of_the_prior():
  logits, _, target = _case(1)
  b, l = 3, logits.shape[2]
  zero = ctl.calibrate(gamma=2.0, eps=0.01)(logits, 0, np.zeros(6), {"prior": np.zeros((b, l)), "target": target})
  zero = np.asarray(zero)[3:]
  off = np.arange(logits.shape[-1])[None, None, None, :] != target[:, None, None, None]
  np.testing.assert_allclose(np.where(off, zero, 0), np.where(off, logits[:3], 0), atol=1e-6)
  np.testing.assert_allclose(np.where(off, 0, zero), np.where(off, 0, logits[:3] + 2 * math.log(0.01)), atol=1e-5)
  one = ctl.calibrate(gamma=0.0)(logits, 0, np.zeros(6), {"prior": np.ones((b, l)), "target": target})
  np.testing.assert_array_equal(np.asarray(one)[3:], logits[3:])


def test_step_and_layer_gating():
  logits, prior, target = _case(2)
  ctx = {"prior": prior, "target": target}
  c = ctl.calibrate(gamma=1.0, layers=[1], t_range=(100, 200))
  np.testing.assert_array_equal(np.asarray(c(logits, 0, np.full(6, 150), ctx)), logits)     # layer 0 skipped
  np.testing.assert_array_equal(np.asarray(c(logits, 1, np.full(6, 300), ctx)), logits)     # step outside
  assert not np.allclose(np.asarray(c(logits, 1, np.full(6, 150), ctx)), logits)


def test_post_softmax_control_differs_and_masks_padding():
  logits, prior, target = _case(3)
  mask = np.ones((3, 4), bool)
  mask[:, -1] = False
  ctx = {"prior": prior, "target": np.minimum(target, 2), "mask": mask}
  pre = np.asarray(ctl.calibrate(gamma=1.0)(logits, 0, np.zeros(6), ctx))[3:]
  post = np.asarray(ctl.calibrate(gamma=1.0, mode="probs")(logits, 0, np.zeros(6), ctx))[3:]
  assert np.all(np.isfinite(post[..., :3]))
  p = np.exp(post[..., :3]) / np.exp(post[..., :3]).sum(-1, keepdims=True)
  ps = np.exp(logits[:3, ..., :3]) / np.exp(logits[:3, ..., :3]).sum(-1, keepdims=True)
  pt = np.exp(logits[3:, ..., :3]) / np.exp(logits[3:, ..., :3]).sum(-1, keepdims=True)
  m = prior[:, None, :, None]
  mix = (1 - m) * ps + m * pt
  sel = np.arange(3)[None, None, None, :] == ctx["target"][:, None, None, None]
  want = mix * np.where(sel, (m + 0.01), 1.0)
  np.testing.assert_allclose(p, want / want.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
  assert not np.allclose(pre, post)


def test_errors():
  logits, prior, target = _case(4)
  with pytest.raises(ConfigError, match="mode"):
    ctl.calibrate(mode="after")
  with pytest.raises(ConfigError, match="eps > 0"):
    ctl.calibrate(eps=0.0)
  with pytest.raises(ConfigError, match="needs 'prior'"):
    ctl.calibrate()(logits, 0, np.zeros(6), {"target": target})
  with pytest.raises(ConfigError, match="pool the mask"):
    ctl.calibrate()(logits, 0, np.zeros(6), {"prior": prior[:, :2], "target": target})
  with pytest.raises(ConfigError, match="halves"):
    ctl.calibrate()(logits[:5], 0, np.zeros(5), {"prior": prior, "target": target})


def test_official_stem_bias_matches_a_brute_force_loop():
  """`stem_bias` (the official `_masked_cross_attention`): + gamma G_j[q] on every stem's token j, each with its
  own prior, no interpolation; the source half untouched; gated by layer and step."""
  rng = np.random.default_rng(7)
  b, h, l, s = 3, 2, 5, 4
  logits = rng.normal(size=(2 * b, h, l, s)).astype(np.float32)
  g = rng.uniform(size=(b, s, l)).astype(np.float32)
  out = np.asarray(ctl.stem_bias(gamma=2.5)(logits, 0, np.full(2 * b, 10), {"stem_priors": g}))
  want = np.array(logits[b:], np.float64)
  for i in range(b):
    for k in range(h):
      for q in range(l):
        for j in range(s):
          want[i, k, q, j] += 2.5 * g[i, j, q]
  np.testing.assert_array_equal(out[:b], logits[:b])
  np.testing.assert_allclose(out[b:], want, rtol=1e-6, atol=1e-6)
  off = ctl.stem_bias(gamma=2.5, layers=(1,), t_range=(0, 5))
  np.testing.assert_array_equal(np.asarray(off(logits, 0, np.full(2 * b, 3), {"stem_priors": g})), logits)
  np.testing.assert_array_equal(np.asarray(off(logits, 1, np.full(2 * b, 9), {"stem_priors": g})), logits)
  with pytest.raises(ConfigError, match="stem_priors"):
    ctl.stem_bias(gamma=1.0)(logits, 0, np.zeros(2 * b), {"stem_priors": g[:, :, :2]})
  with pytest.raises(ConfigError, match="gamma"):
    ctl.stem_bias(gamma=-1.0)


def test_official_source_interpolation_matches_the_loop_and_calibrate():
  """`interpolate_source` (the official `apply_asr`): (1 - G) l_src + G l_tgt per query, on any (B, H, L, S)
  logits, e.g. the self-attention's L x L; equal to `calibrate(gamma=0, modulation="linear")`."""
  rng = np.random.default_rng(8)
  b, h, l = 2, 3, 6
  logits = rng.normal(size=(2 * b, h, l, l)).astype(np.float32)
  prior = rng.uniform(size=(b, l)).astype(np.float32)
  out = np.asarray(ctl.interpolate_source()(logits, 0, np.zeros(2 * b), {"prior": prior}))
  want = _brute(logits[:b], logits[b:], prior, np.zeros(b, np.int32), 0.0, 1.0, "linear")
  np.testing.assert_allclose(out[b:], want, rtol=1e-6, atol=1e-6)
  same = ctl.calibrate(gamma=0.0, modulation="linear")(logits, 0, np.zeros(2 * b), {"prior": prior,
                                                                                    "target": np.zeros(b, int)})
  np.testing.assert_array_equal(out, np.asarray(same))
  with pytest.raises(ConfigError, match="prior"):
    ctl.interpolate_source()(logits, 0, np.zeros(2 * b), {})
