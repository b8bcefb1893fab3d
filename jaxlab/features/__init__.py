"""Random features (positive / orthogonal Gaussian features), shared by SWING and Performer-style attention."""

from jaxlab.features.random_features import gaussian_omegas, log_positive_features

__all__ = ["gaussian_omegas", "log_positive_features"]
