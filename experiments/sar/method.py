"""SAR, the pieces: images as tokens, the judge, the two models and their losses, the checks, the scores.

The model side is the shared core `jaxlab.ar` (masks, `SelfTokenTransformer`, the flow head, the grouped
samplers); the judge is the 28x28 MNIST kit (`jaxlab.evals.mnist_kit`, shared with every experiment on that
data) or, for the 8x8 digits of v1, `jaxlab.evals.judge` (the cached digits MLP shared with jit_digits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.ar import generate as gen
from jaxlab.ar import head as head_lib
from jaxlab.ar import masks as masks_lib
from jaxlab.ar import model as model_lib
from jaxlab.ar import tokenizers
from jaxlab.evals import image_scorer

from . import config as config_lib


def digits(config) -> tuple[dict, dict]:
  """(train, held-out) digit images in [-1, 1]: MNIST (4,500 / 500, padded to data.pad_to) or sklearn's 8x8
  digits (data.name; `jaxlab.evals.image_scorer.splits`)."""
  return image_scorer.splits(config.data)


def scorer(config, train: dict) -> image_scorer.Scorer:
  """The judge of the data split (`jaxlab.evals.image_scorer`: the 28x28 kit's CNN on MNIST, the digits judge
  MLP on 8x8 digits), built once per process. Its floor draws class-balanced real digits, as the class-conditional
  samples are balanced."""
  return image_scorer.scorer(config, train)


def tokenizer(config, train: dict):
  """The digits tokenizer: 2x2 pixel patches (tokens.pca = 0) or their PCA (fitted on the training images)."""
  t = config.tokens
  if int(t.pca):
    return tokenizers.PCATokenizer.fit(train["image"], int(t.patch), int(t.pca))
  return tokenizers.PatchTokenizer(int(t.patch), tuple(train["image"].shape[1:]))


def model_configs(config, token_dim: int, grid) -> tuple[model_lib.ARConfig, head_lib.HeadConfig]:
  m = config.model
  ar = model_lib.ARConfig(token_dim=int(token_dim), grid=tuple(grid), hidden=int(m.hidden), depth=int(m.depth),
                          heads=int(m.heads), mlp_ratio=float(m.mlp_ratio), num_classes=int(config.data.num_classes),
                          num_prefix=int(m.num_prefix), intra_pred=bool(m.intra_pred),
                          teacher=float(config.method.jepa_weight) > 0, dtype=m.dtype, attention=m.attention)
  hd = head_lib.HeadConfig(token_dim=int(token_dim), cond_dim=int(m.hidden), width=int(m.head_width),
                           depth=int(m.head_depth))
  return ar, hd


def make_model_fn(config, arm: str, token_dim: int, grid):
  ar, hd = model_configs(config, token_dim, grid)
  if arm == "sar":
    return lambda rngs: gen.SAR(ar, hd, rngs=rngs)
  return lambda rngs: gen.NextTokenRegressor(ar, rngs=rngs)


def make_loss_fn(config, arm: str):
  """`(model, batch, key) -> (loss, metrics)`; batch {"tokens": (B, N, D), "label": (B,)}."""
  me = config.method
  if arm == "regression":
    return lambda model, batch, key: gen.regression_loss(model, batch["tokens"], batch["label"])

  def loss_fn(model, batch, key):
    return gen.sar_loss(model, batch["tokens"], batch["label"], key,
                        group_sizes=tuple(int(s) for s in me.group_sizes), batch_mul=int(me.batch_mul),
                        jepa_weight=float(me.jepa_weight), ema_decay=float(me.teacher_decay),
                        label_drop=float(me.label_drop))
  return loss_fn


def schedules(config, n: int) -> dict[str, tuple[int, ...]]:
  """{name: group sizes} scored: sar_k<k> for each tokens_per_step, and sar_cosine<S> when cosine_steps > 0."""
  s = config.sample
  out = {config_lib.k_name(int(k)): masks_lib.fixed_sizes(n, int(k)) for k in s.tokens_per_step if int(k) <= n}
  if int(s.cosine_steps):
    out[f"sar_cosine{int(s.cosine_steps)}"] = masks_lib.cosine_sizes(n, min(int(s.cosine_steps), n))
  return out


def exactness(net: model_lib.SelfTokenTransformer, tokens, labels, scheds) -> float:
  """Largest |KV-cached incremental - full masked forward| of the prediction features over the schedules, with
  float32 matrix products at full precision (GPUs otherwise use TF32 for float32 dots, whose rounding differs
  between the two orders of summation: 3.6e-3 on an H200)."""
  full = nnx.jit(lambda m, x, y, g: m(x, y, g)[1])
  inc_fn = nnx.jit(model_lib.incremental_features, static_argnums=3)
  worst = 0.0
  with jax.default_matmul_precision("highest"):
    for sizes in scheds.values():
      g = jnp.asarray(masks_lib.groups_from_sizes(sizes))
      inc = inc_fn(net, tokens, labels, tuple(sizes))
      worst = max(worst, float(jnp.max(jnp.abs(inc - full(net, tokens, labels, g)))))
  return worst


def leakage(net: model_lib.SelfTokenTransformer, tokens, labels, key, group_sizes, kinds) -> dict[str, float]:
  """{kind: largest change of any prediction feature of groups <= g when every reference token of groups >= g is
  perturbed} over random partitions and a random g per example (0 exactly when nothing leaks)."""
  kp, kg, kn = jax.random.split(key, 3)
  b, n, _ = tokens.shape
  groups = masks_lib.random_groups(kp, b, n, group_sizes)
  g_star = jax.random.randint(kg, (b, 1), 0, jnp.max(groups, 1, keepdims=True) + 1)
  later = groups >= g_star                                              # perturbed reference tokens
  noisy = tokens + later[..., None] * jax.random.normal(kn, tokens.shape)
  earlier = groups <= g_star                                            # predictions that must not move
  out = {}
  for kind in kinds:
    f = nnx.jit(lambda m, x, kind=kind: m(x, labels, groups, kind=kind)[1])
    diff = jnp.abs(f(net, noisy) - f(net, tokens)) * earlier[..., None]
    out[kind] = float(jnp.max(diff))
  return out
