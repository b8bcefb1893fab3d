"""SLOT-Align: one-shot federated learning with Bures-Wasserstein feature alignment (alpha x tau grid).

Paper: Berardini, Pastore, Murino, "Distribution Alignment for One-Shot Federated Learning via Optimal
Transport", ICML 2026 (arXiv 2606.16655); official code daniebera/SLOT-Align.

Each run is one seed of the grid alphas x taus: per alpha the clients (one domain each, Dirichlet(alpha) label
skew) send Ledoit-Wolf Gaussian statistics of their frozen features, the server computes the Bures
barycenter and one closed-form OT map per client, then per tau every client trains a linear head on its
features moved a fraction tau along the geodesic, the heads are averaged once (O-FedAvg) and evaluated on
each domain's test features through that domain's map (macro accuracy over domains).

Variants: tiny (a synthetic Gaussian-domain generator, `jaxlab.federated.data.gaussian_domains`: 4 domains, 16-d features, 10 classes, full-batch GD heads),
small (8 domains, 32-d, 20 classes, minibatch SGD as the official protocol), full (Office-Home CLIP
ViT-B/32 features from an .npz written by a frozen encoder; official O-FedAvg hyperparameters).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2, 3, 4)


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`slot_align` (SLOT-Align, arXiv 2606.16655; method from the official code)",
    claim=("synthetic 4-domain features, one-shot FedAvg of a linear head, 5 seeds: at alpha 0.1, tau 0.4 beats "
           "no alignment by >= 3 points on average and on >= 4/5 seeds; at alpha 0, tau 1 beats it by >= 5 "
           "points; each client's mapped mean and covariance equal the barycenter's within 1e-4"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.train_per_class": 40, "data.test_per_class": 20, "head.steps": 40}

CLAIMS = [
    claims.Claim("label_shift_gain", "alpha=0.1: macro acc at tau=0.4 minus no alignment (tau=0), mean of 5 seeds",
                 claims.mean("gain/a0.1/t0.4"), ">=", 0.03),
    claims.Claim("label_shift_seeds", "alpha=0.1: tau=0.4 >= tau=0 on at least 4 of 5 seeds (fraction of seeds)",
                 claims.fraction(lambda s: s["gain/a0.1/t0.4"] >= 0), ">=", 0.8),
    claims.Claim("domain_shift_gain", "alpha=0 (domain shift only): tau=1 minus tau=0, mean of 5 seeds",
                 claims.mean("gain/a0/t1"), ">=", 0.05),
    claims.Claim("map_exact", "every client's pushed-forward mean and covariance equal the barycenter's "
                 "(max relative error over clients, alphas, seeds)",
                 claims.maximum("map/max_rel_err"), "<=", 1e-4),
]

DATASETS = {  # full-scale feature sets (domains, classes); features come from a frozen encoder, see README
    "office_home": (("Art", "Clipart", "Product", "Real_World"), 65),
    "domainnet": (("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), 345),
    "digits": (("mnist", "usps", "svhn", "synth"), 10),
}


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=full,seed=2")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      source="synthetic", dataset="", path="", encoder="", test_fraction=0.3,
      num_domains=4, dim=16, num_classes=10, class_scale=1.2, distortion=0.4, shift=1.5,
      train_per_class=300, test_per_class=100))
  c.method = ml_collections.ConfigDict(dict(
      alphas=(0.1, 0.0), taus=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), spd_eps=1e-8, weighting="count",
      bary_iters=1000, bary_tol=1e-7, backend="jax", pca=False, pca_var=0.99, min_client_samples=2))
  c.head = ml_collections.ConfigDict(dict(
      steps=200, epochs=0, lr=0.5, momentum=0.0, weight_decay=0.0, batch_size=0, loss="ce", init_scale=0.0))
  if arg.variant == "small":
    c.data.update(num_domains=8, dim=32, num_classes=20, train_per_class=200, test_per_class=50)
    c.method.alphas = (0.1, 0.5, 0.0)
    c.head.update(steps=0, epochs=10, lr=0.05, momentum=0.9, weight_decay=1e-5, batch_size=64)
  elif arg.variant == "full":
    c.data.update(source="features", dataset="office_home", path="", encoder="clip_vitb32_datacomp",
                  num_domains=4, dim=512, num_classes=65)
    c.method.alphas = (0.0, 0.1, 0.5)
    c.method.taus = (0.0, 0.2, 0.4, 0.6, 1.0)
    c.head.update(steps=0, epochs=10, lr=1e-3, momentum=0.9, weight_decay=1e-5, batch_size=64, loss="softmax_ce",
                  init_scale=0.01)
  return configs.finalize(c, validate)


def stage_name(alpha: float, tau: float) -> str:
  """'a0.1/t0.4': the stage of one (alpha, tau) pair (also the tag of its summary keys acc/a0.1/t0.4, ...)."""
  return f"a{alpha:g}/t{tau:g}"


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize` and again by `configs.apply_overrides`)."""
  from jaxlab.errors import ConfigError
  m, h, d = c.method, c.head, c.data
  if not m.alphas or not m.taus:
    raise ConfigError("config.method.alphas and config.method.taus must be non-empty tuples")
  if any(a < 0 for a in m.alphas):
    raise ConfigError(f"config.method.alphas={tuple(m.alphas)}: Dirichlet concentrations must be >= 0 "
                      "(0 = no label skew)")
  if any(not 0.0 <= t <= 1.0 for t in m.taus):
    raise ConfigError(f"config.method.taus={tuple(m.taus)}: transport strengths must be in [0, 1]")
  for key in ("alphas", "taus"):
    tags = [f"{v:g}" for v in m[key]]
    if len(set(tags)) != len(tags):
      raise ConfigError(f"config.method.{key}={tuple(m[key])} repeats a value; list each once")
  if m.weighting not in ("count", "equal"):
    raise ConfigError(f"config.method.weighting={m.weighting!r}: use count or equal")
  if m.backend not in ("jax", "ott"):
    raise ConfigError(f"config.method.backend={m.backend!r}: use jax or ott")
  if not 0.0 < m.pca_var <= 1.0 or m.spd_eps < 0 or m.bary_iters < 1:
    raise ConfigError("config.method.pca_var must be in (0, 1], spd_eps >= 0 and bary_iters >= 1")
  if h.loss not in ("ce", "softmax_ce"):
    raise ConfigError(f"config.head.loss={h.loss!r}: use ce or softmax_ce")
  if (h.steps > 0) == (h.epochs > 0):
    raise ConfigError("set exactly one of config.head.steps (fixed steps) and config.head.epochs (local epochs)")
  if h.epochs > 0 and h.batch_size <= 0:
    raise ConfigError("config.head.epochs needs config.head.batch_size > 0")
  if not h.lr > 0 or h.momentum < 0 or h.weight_decay < 0 or h.batch_size < 0:
    raise ConfigError("config.head.lr must be > 0; momentum, weight_decay and batch_size >= 0")
  if d.source not in ("synthetic", "features"):
    raise ConfigError(f"config.data.source={d.source!r}: use synthetic or features")
  if d.source == "features":
    if d.dataset not in DATASETS:
      raise ConfigError(f"config.data.dataset={d.dataset!r}: use one of {sorted(DATASETS)}")
    if not 0.0 < d.test_fraction < 1.0:
      raise ConfigError(f"config.data.test_fraction={d.test_fraction} must be in (0, 1)")
  elif min(d.num_domains, d.dim, d.num_classes, d.train_per_class, d.test_per_class) < 1 or d.num_domains < 2:
    raise ConfigError("config.data: need num_domains >= 2 and positive dim, num_classes, train/test_per_class")


def sweep(arg=None):
  """alpha x tau: each point runs one label-skew level at one transport strength beside its tau = 0 baseline."""
  del arg
  return [{"method.alphas": (a,), "method.taus": (0.0, t)}
          for a in (0.0, 0.1, 0.5) for t in (0.2, 0.4, 0.6, 1.0)]
