"""One folder per paper (installed as `jaxlab.experiments`): config.py, train.py, method.py, README.md."""
