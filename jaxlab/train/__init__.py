"""Training: optimizers, pure sharded steps, and the resumable loop."""

from jaxlab.train.loop import FitResult, Preempted, fit, run_loop
from jaxlab.train.optim import make_optimizer, make_schedule
from jaxlab.train.step import make_eval_step, make_train_step

__all__ = ["FitResult", "Preempted", "fit", "run_loop", "make_optimizer", "make_schedule", "make_eval_step",
           "make_train_step"]
