"""Input pipelines: deterministic index-based batching, TFDS sources, offline datasets."""

from jaxlab.data.pipeline import ArraySource, Batcher, eval_batches, process_rows, to_global
from jaxlab.data.synthetic import digits, gaussian_blobs, linear_regression

__all__ = ["ArraySource", "Batcher", "eval_batches", "process_rows", "to_global", "digits",
           "gaussian_blobs", "linear_regression"]
