"""Evaluation of generative models on features: the Frechet distance (FID / FAD / judge-feature FD).

(`jaxlab.metrics` is the training-metrics writer; this package holds sample-quality measures.)
"""

from jaxlab.evals.frechet import feature_stats, frechet_distance, frechet_from_features  # noqa: F401
