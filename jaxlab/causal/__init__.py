"""Causal discovery in multivariate time series with additive neural models and their response functions.

* `navar`: NAVAR-MLP / NAVAR-LSTM (per-source networks vmapped over sources, L1 on contributions).
* `ensemble`: an ensemble of NAVAR retrainings (bootstrap resamples) trained in one vmapped, shardable step.
* `scores`: std-of-contribution edge scores, AUROC (self links ignored), the linear VAR baseline.
* `ice`: ICE / partial dependence / centred ICE curves for every edge, dispersion, bootstrap bands.
* `mechanisms`: shape indicators and labels (monotone, threshold, saturating, sign-changing).
* `data`: CSV / panel readers with clear errors, lag windows that respect unit boundaries, normalisation,
  synthetic systems (four mechanisms, a regime-dependent edge, a V-Dem-like panel stand-in).
"""
