"""Training and run orchestration: optimizers, pure sharded steps, and the three run shapes.

* `fit`: gradient training of an NNX model over batches (builds everything from the config).
* `run_loop`: the resumable step loop around any state and any jitted `step_fn` (own updates).
* `run_stages`: named stages, each recorded, checkpointed and skipped on rerun (non-loop experiments).
"""

from jaxlab.train.loop import FitResult, Preempted, fit, run_loop
from jaxlab.train.optim import make_optimizer, make_schedule
from jaxlab.train.stages import StageContext, run_stages, stage_arrays, union
from jaxlab.train.step import make_eval_step, make_train_step

__all__ = ["FitResult", "Preempted", "StageContext", "fit", "run_loop", "run_stages", "stage_arrays", "union",
           "make_optimizer", "make_schedule", "make_eval_step", "make_train_step"]
