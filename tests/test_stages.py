"""`jaxlab.train.run_stages`: records, resume, carried state, SIGTERM between and inside stages, errors."""

import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import configs, metrics
from jaxlab.errors import CheckpointError
from jaxlab.train import Preempted, run_stages, stage_arrays


def _config(seed=0):
  c, _ = configs.variant_config(f"seed={seed}")
  return configs.finalize(c)


class Counter:
  """Stage functions of a small staged run that count their calls (optionally sending SIGTERM)."""

  def __init__(self, sigterm_in=None):
    self.calls, self.sigterm_in = [], sigterm_in

  def stages(self):
    def draw(ctx):
      self.calls.append(ctx.name)
      x = jax.random.normal(ctx.key(), (16,))
      if ctx.name == self.sigterm_in:
        os.kill(os.getpid(), signal.SIGTERM)      # arrives inside the stage
      ctx.state = {"total": ctx.state["total"] + x.sum()}
      return {"mean": float(x.mean()), "x": x, "nested": {"k": ctx.index, "arr": np.arange(ctx.index + 1)}}

    def report(ctx):
      self.calls.append(ctx.name)
      means = [ctx.results[f"draw{i}"]["mean"] for i in range(3)]
      first = ctx.results["draw0"]["x"]
      return {"mean_of_means": float(np.mean(means)), "first0": float(first[0]),
              "arr_len": int(ctx.results["draw2"]["nested"]["arr"].size), "total": float(ctx.state["total"])}

    return {"draw0": draw, "draw1": draw, "draw2": draw, "report": report}


def _run(workdir, counter, **kw):
  return run_stages(_config(), str(workdir), counter.stages(), state={"total": jnp.zeros(())}, **kw)


def _strip(summary):
  return {k: v for k, v in summary.items() if k not in ("wall_s", "resumes")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  wd = tmp_path_factory.mktemp("stages") / "ref"
  c = Counter()
  return wd, _run(wd, c), c.calls


def test_records_summary_and_metrics(reference):
  wd, summary, calls = reference
  assert calls == ["draw0", "draw1", "draw2", "report"]
  assert summary["stages"] == ["draw0", "draw1", "draw2", "report"]
  assert summary["arr_len"] == 3 and summary["nested"] == {"k": 2}
  np.testing.assert_allclose(summary["total"], sum(stage_arrays(str(wd), i, f"draw{i}")["x"].sum() for i in range(3)),
                             rtol=1e-6)
  rows = metrics.read_metrics(str(wd))
  assert [r["stage"] for r in rows] == ["draw0", "draw1", "draw2", "report"] and [r["step"] for r in rows] == [1, 2, 3, 4]
  assert rows[1]["nested/k"] == 1 and "x" not in rows[0]
  assert metrics.read_json(str(wd / "summary.json")) == metrics.jsonable(summary)


def test_finished_run_is_not_rerun(reference):
  wd, summary, _ = reference
  c = Counter()
  assert _strip(_run(wd, c)) == _strip(summary) and c.calls == []


def test_resume_skips_finished_stages_and_ends_identical(reference, tmp_path):
  wd = tmp_path / "resumed"
  shutil.copytree(reference[0], wd)
  assert sorted(os.listdir(wd / "checkpoints")) == ["3", "4"]     # the two newest are kept
  shutil.rmtree(wd / "checkpoints" / "4")
  os.remove(wd / "summary.json")
  c = Counter()
  assert _strip(_run(wd, c)) == _strip(reference[1])
  assert c.calls == ["report"]                        # draw0..2 were restored, carried state included
  assert [r["stage"] for r in metrics.read_metrics(str(wd))] == ["draw0", "draw1", "draw2", "report"]


@pytest.mark.parametrize("where", ["draw1", "report"])
def test_sigterm_inside_a_stage_records_it_then_stops(reference, tmp_path, where):
  wd = tmp_path / "term"
  c = Counter(sigterm_in=where)
  if where == "report":            # the last stage: nothing is left to stop before, the run completes
    assert _strip(_run(wd, c)) == _strip(reference[1])
    return
  with pytest.raises(Preempted, match="after stage 2"):
    _run(wd, c)
  assert c.calls == ["draw0", "draw1"]
  c2 = Counter()
  assert _strip(_run(wd, c2)) == _strip(reference[1]) and c2.calls == ["draw2", "report"]


def test_ctrl_c_inside_a_stage_drops_only_that_stage(reference, tmp_path):
  wd = tmp_path / "ctrlc"
  c = Counter()
  stages = c.stages()

  def interrupted(ctx):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    run_stages(_config(), str(wd), {**stages, "draw2": interrupted}, state={"total": jnp.zeros(())})
  c2 = Counter()
  assert _strip(_run(wd, c2)) == _strip(reference[1]) and c2.calls == ["draw2", "report"]


def test_a_workdir_of_other_stages_is_refused(reference, tmp_path):
  wd = tmp_path / "other"
  shutil.copytree(reference[0], wd)
  os.remove(wd / "summary.json")
  with pytest.raises(CheckpointError, match="holds a run whose stages .* use another --workdir"):
    run_stages(_config(), str(wd), {"something": lambda ctx: {}, "else": lambda ctx: {}})


def test_stage_results_must_be_a_mapping(tmp_path):
  with pytest.raises(TypeError, match="stage 'bad' must return a mapping"):
    run_stages(_config(), str(tmp_path), {"bad": lambda ctx: 3.0})


def test_stages_run_inside_the_config_mesh(tmp_path):
  from jaxlab import mesh as mesh_lib
  seen = {}

  def look(ctx):
    seen["mesh"] = dict(mesh_lib.current_mesh().shape)
    seen["rules"] = dict(mesh_lib.current_rules())
    return {}

  c = _config()
  configs.apply_overrides(c, {"mesh": (("data", 4), ("model", 2)), "sharding_rules": "fsdp"})
  run_stages(c, str(tmp_path), {"look": look})
  assert seen["mesh"] == {"data": 4, "model": 2} and seen["rules"]["embed"] == "data"
  assert mesh_lib.current_mesh() is None
