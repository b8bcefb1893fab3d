"""Data selection for fine-tuning: difficulty scorers and budgeted selection (`difficulty`), generalisation and
extrapolation gaps (`gaps`), Gaussian PAC-Bayes bounds (`pac_bayes`).

Import the submodules you need: `from jaxlab.selection import difficulty, gaps, pac_bayes`.
"""
