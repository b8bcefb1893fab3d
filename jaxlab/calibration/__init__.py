"""Calibration of probabilistic classifiers: binned ECE (top-label, classwise, weighted), differentiable
surrogates (soft-binned ECE, MMCE), bootstrap intervals, the calibrated noise floor, temperature scaling
(one predictor, or one per expert of a mixture under hard or soft routing) and reliability diagrams."""

from jaxlab.calibration.metrics import (  # noqa: F401
    accuracy, bin_index, bin_stats, bootstrap_ece, calibrated_floor, classwise_ece, ece, mmce, reliability,
    soft_binned_ece, top_label, top_label_ece)
from jaxlab.calibration.temperature import fit_expert_temperatures, fit_temperature, weighted_nll  # noqa: F401
