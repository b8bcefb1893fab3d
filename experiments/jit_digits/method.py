"""JiT on digits, the pieces: data, the judge (trained once per data split, cached), the DiT loss and sampler.

Everything model-side is the shared core: `jaxlab.nn.dit.DiT` (one stream "image"), `jaxlab.diffusion.flow`
(t = 1 clean: z_t = t x + (1 - t) eps, x-prediction, v-loss, logit-normal times, Heun sampling) and
`jaxlab.diffusion.guidance` (classifier-free guidance through the null class), `jaxlab.evals.frechet`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, traverse_util

from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab.data import synthetic
from jaxlab.diffusion import flow, guidance
from jaxlab.errors import ConfigError, DataError
from jaxlab.evals import frechet
from jaxlab.nn import MLP, dit

STREAM = "image"


# ----------------------------------------------------------------------------------------------- data


def digits(config) -> tuple[dict, dict]:
  """(train, held-out) sklearn digits in [-1, 1]: {"image": (N, 8, 8, 1) float32, "label": (N,) int32}."""
  d = config.data
  if d.name != "digits":
    raise ConfigError(f"config.data.name={d.name!r}: the judge-scored claim runs on digits (ImageNet runs use "
                      "jaxlab.data.images and an Inception feature file for FID)")
  kw = dict(test_fraction=float(d.test_fraction), seed=int(d.split_seed), value_range=(-1.0, 1.0))
  return synthetic.digits("train", **kw), synthetic.digits("test", **kw)


# ---------------------------------------------------------------------------------------------- judge


def _judge_model(config, rngs):
  with nnx.use_eager_sharding(False):    # the judge is small and unsharded, whatever the run's mesh
    return MLP(64, tuple(config.judge.hidden), config.data.num_classes, rngs=rngs, activation=jax.nn.relu)


def judge_features(judge: MLP, x) -> jax.Array:
  """The judge's last hidden layer (after its ReLU) on images (N, 8, 8, 1): (N, hidden[-1])."""
  h = jnp.asarray(x, jnp.float32).reshape(len(x), -1)
  for layer in judge.layers[:-1]:
    h = jax.nn.relu(layer(h))
  return h


def judge_logits(judge: MLP, x) -> jax.Array:
  return judge.layers[-1](judge_features(judge, x))


def cache_dir(config) -> str:
  """config.judge.cache_dir, else $JAXLAB_CACHE_DIR, else ~/.cache/jaxlab (then `judges/` inside)."""
  root = config.judge.cache_dir or os.environ.get("JAXLAB_CACHE_DIR") or os.path.expanduser("~/.cache/jaxlab")
  return os.path.join(root, "judges")


def judge_key(config) -> str:
  """Digest of everything the judge depends on: the data split and the judge's own settings (not the seed)."""
  spec = {"data": configs.flatten(config.data), "judge": {k: v for k, v in configs.flatten(config.judge).items()
                                                          if k != "cache_dir"}, "version": 1}
  return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def train_judge(config, train: dict) -> MLP:
  """Minibatch AdamW on softmax cross-entropy; deterministic given the data split (key = split_seed)."""
  j = config.judge
  model = _judge_model(config, nnx.Rngs(int(config.data.split_seed)))
  opt = nnx.Optimizer(model, optax.adamw(j.learning_rate, weight_decay=j.weight_decay), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, x, y):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(judge_logits(m, x), y).mean()
    _, g = nnx.value_and_grad(loss)(model)
    opt.update(model, g)

  rng = np.random.default_rng(int(config.data.split_seed))
  x, y = jnp.asarray(train["image"]), jnp.asarray(train["label"])
  for _ in range(int(j.steps)):
    idx = rng.integers(0, len(y), int(j.batch_size))
    step(model, opt, x[idx], y[idx])
  return model


def load_or_train_judge(config, train: dict) -> tuple[MLP, bool]:
  """(judge, loaded from cache). The cache file is written atomically, so an interrupted write leaves none."""
  path = os.path.join(cache_dir(config), f"digits_judge_{judge_key(config)}.npz")
  abstract = nnx.eval_shape(lambda: _judge_model(config, nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  if os.path.exists(path):
    want = {"/".join(map(str, k)): k for k in traverse_util.flatten_dict(state.to_pure_dict())}
    with np.load(path) as f:
      stored = {k: f[k] for k in f.files}
    shapes = traverse_util.flatten_dict(jax.tree.map(lambda a: a.shape, state.to_pure_dict()))
    if set(stored) != set(want) or any(stored[k].shape != shapes[want[k]] for k in want):
      raise DataError(f"judge cache {path} does not match config.judge (delete it to retrain)")
    values = traverse_util.unflatten_dict({want[k]: jnp.asarray(v) for k, v in stored.items()})
    state.replace_by_pure_dict(values)
    return nnx.merge(graphdef, state), True
  judge = train_judge(config, train)
  flat = traverse_util.flatten_dict(nnx.state(judge).to_pure_dict())
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz")
  os.close(fd)
  np.savez(tmp, **{"/".join(map(str, k)): np.asarray(v) for k, v in flat.items()})
  os.replace(tmp, path)
  return judge, False


# ------------------------------------------------------------------------------------------------ DiT


def dit_config(config) -> dit.DiTConfig:
  m = config.model
  size = 8 if config.data.name == "digits" else int(config.data.image_size)
  g = size // int(m.patch)
  return dit.DiTConfig(
      streams={STREAM: (int(m.channels), int(m.patch))}, grid=(g, g), hidden=int(m.hidden), depth=int(m.depth),
      heads=int(m.heads), mlp_ratio=float(m.mlp_ratio), bottleneck=int(m.bottleneck),
      num_classes=int(config.data.num_classes), class_tokens=int(m.class_tokens),
      in_context_start=int(m.in_context_start), dtype=m.dtype, attention=m.attention, remat=bool(m.remat))


def make_loss_fn(config):
  """`(model, batch, key) -> (v-loss, metrics)` for `jaxlab.train.fit`: logit-normal t, Gaussian noise, label
  dropout to the null class (classifier-free guidance), optional random flips."""
  me, nc = config.method, int(config.data.num_classes)

  def loss_fn(model, batch, key):
    x, y = batch["image"], batch["label"]
    kt, ke, ky = jax.random.split(key, 3)
    if me.flip:   # random horizontal flips (ImageNet), drawn from the step key
      flip = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.5, (x.shape[0], 1, 1, 1))
      x = jnp.where(flip, x[:, :, ::-1], x)
    t = flow.logit_normal(kt, (x.shape[0],), me.t_mean, me.t_std)
    eps = me.noise_scale * jax.random.normal(ke, x.shape, x.dtype)
    z = flow.interpolate(x, eps, t)
    x_hat = model({STREAM: z}, {STREAM: t}, dit.drop_labels(ky, y, me.label_drop, nc))[STREAM]
    loss = flow.v_loss(x_hat, x, z, t, t_eps=me.t_eps)
    return loss, {"x_mse": jnp.mean(jnp.square(x_hat - x))}
  return loss_fn


def make_sampler(config, graphdef):
  """`(params, noise (B, H, W, C), labels (B,)) -> samples`: `flow.sample` over config.sample.steps with
  classifier-free guidance at config.sample.cfg_scale (cond and null-class branches in one batch)."""
  s, nc = config.sample, int(config.data.num_classes)
  scale = float(s.cfg_scale)
  table = flow.joint_times([STREAM], int(s.steps))

  def run(params, noise, labels):
    model = nnx.merge(graphdef, params)

    def denoise(z, t):
      if scale == 1.0:
        return model(z, t, labels)
      both = model({k: jnp.concatenate([v, v]) for k, v in z.items()},
                   {k: jnp.concatenate([v, v]) for k, v in t.items()},
                   jnp.concatenate([labels, jnp.full_like(labels, nc)]))
      n = labels.shape[0]
      return guidance.combine({k: v[:n] for k, v in both.items()}, {k: v[n:] for k, v in both.items()}, t,
                              {STREAM: scale}, {STREAM: tuple(s.cfg_interval)})
    return flow.sample(denoise, {STREAM: noise}, table, method=s.method, t_eps=config.method.t_eps,
                       jit=False)[STREAM]
  return jax.jit(run)


def generate_chunks(config, graphdef, params, labels: np.ndarray, key: jax.Array, mesh):
  """Yields (start row, samples clipped to [-1, 1]) for `labels` in chunks of sample.batch_size, each sharded
  over the batch axis; the sampler is compiled once. Chunk i's noise is drawn from fold_in(key, i)."""
  shape = dit_config(config).stream_shape(STREAM)
  sampler = make_sampler(config, graphdef)
  bsh = mesh_lib.batch_sharding(mesh, mesh_lib.current_rules())
  data = dict(mesh.shape).get("data", 1)
  chunk = -(-int(config.sample.batch_size) // data) * data
  for i, start in enumerate(range(0, len(labels), chunk)):
    y = np.asarray(labels[start:start + chunk], np.int32)
    n = len(y)
    pad = -(-n // data) * data
    y = np.concatenate([y, np.zeros(pad - n, np.int32)])
    noise = config.method.noise_scale * jax.random.normal(jax.random.fold_in(key, i), (pad, *shape))
    x = sampler(params, jax.device_put(noise, bsh), jax.device_put(jnp.asarray(y), bsh))
    yield start, np.clip(np.asarray(jax.device_get(x))[:n], -1.0, 1.0)


def generate(config, graphdef, params, labels: np.ndarray, key: jax.Array, mesh) -> np.ndarray:
  """All samples of `generate_chunks` in one array (small runs; large ones consume the chunks as they come)."""
  return np.concatenate([x for _, x in generate_chunks(config, graphdef, params, labels, key, mesh)])


def scores(judge: MLP, samples: np.ndarray, labels: np.ndarray, train: dict, held: dict) -> dict:
  """Frechet distances in judge features (samples and held-out real images, each against the training
  images), their ratio, and the judge's accuracy on the samples' conditioning labels (overall, per class)."""
  feats = jax.jit(lambda x: judge_features(judge, x))
  f_train, f_held, f_gen = (np.asarray(feats(jnp.asarray(a))) for a in (train["image"], held["image"], samples))
  floor = frechet.frechet_from_features(f_held, f_train)
  fd = frechet.frechet_from_features(f_gen, f_train)
  pred = np.asarray(jnp.argmax(judge.layers[-1](jnp.asarray(f_gen)), -1))
  hit = pred == labels
  out = {"fd": fd, "fd_floor": floor, "fd_ratio": fd / floor, "judge_acc": float(hit.mean()),
         "pixel_fd": frechet.frechet_from_features(samples.reshape(len(samples), -1),
                                                   train["image"].reshape(len(train["image"]), -1)),
         "pixel_fd_floor": frechet.frechet_from_features(held["image"].reshape(len(held["image"]), -1),
                                                         train["image"].reshape(len(train["image"]), -1))}
  for c in np.unique(labels):
    out[f"judge_acc/{int(c)}"] = float(hit[labels == c].mean())
  return out
