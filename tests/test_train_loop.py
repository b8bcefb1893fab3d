"""The training loop on the test-only toy experiment: sharding, resume, checkpoints, NaN guard."""

import os
import shutil

import jax
import numpy as np
import pytest

from jaxlab import configs, metrics, state as state_lib
from jaxlab import checkpoint as ckpt_lib
from jaxlab import mesh as mesh_lib
from jaxlab.errors import CheckpointError, ConfigError, NonFiniteError


TRAIN_KEYS = tuple(configs.TRAIN_DEFAULTS) + ("optimizer",)


def _config(toy, **over):
  """The toy's tiny config with overrides; short names of train keys (num_steps, optimizer.name) allowed."""
  over = {(f"train.{k}" if k.split(".")[0] in TRAIN_KEYS else k): v for k, v in over.items()}
  return toy.get_config("tiny", over)


def _run(toy, workdir, hooks=(), devices=None, **over):
  return toy.train_module.train_and_evaluate(_config(toy, **over), str(workdir), hooks=hooks, devices=devices)


class Capture:
  """Hook keeping host copies of the params at chosen steps."""

  def __init__(self, *steps):
    self.steps, self.params, self.shardings = set(steps), {}, {}

  def __call__(self, step, st):
    if step in self.steps:
      self.params[step] = jax.device_get(st.params)
      self.shardings[step] = st.params["l1"]["kernel"].sharding


class Crash:
  def __init__(self, at, exc):
    self.at, self.exc = at, exc

  def __call__(self, step, st):
    if step == self.at:
      raise self.exc


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _losses(workdir):
  return [(r["step"], r["train/loss"]) for r in metrics.read_metrics(str(workdir)) if "train/loss" in r]


@pytest.fixture(scope="module")
def reference(toy, tmp_path_factory):
  """An uninterrupted 40-step run on a 4x2 mesh: its workdir and final params."""
  wd = tmp_path_factory.mktemp("ref") / "run"
  cap = Capture(40)
  summary = _run(toy, wd, hooks=[cap], mesh=(("data", 4), ("model", 2)))
  return wd, cap.params[40], summary


def test_run_writes_records_and_learns(reference):
  wd, _, summary = reference
  for name in ("config.json", "metrics.jsonl", "summary.json"):
    assert os.path.exists(wd / name), name
  assert sorted(int(s) for s in os.listdir(wd / "checkpoints") if s.isdigit()) == [30, 40]  # keep 2
  assert summary["step"] == 40 and summary["eval/accuracy"] > 0.8 and summary["mesh"] == {"data": 4, "model": 2}
  assert metrics.read_json(str(wd / "summary.json"))["eval/accuracy"] == summary["eval/accuracy"]
  try:
    import tensorboardX  # noqa: F401
  except ImportError:
    return
  assert os.listdir(wd / "tb"), "tensorboardX is installed but no events were written"


def test_sharded_4x2_matches_single_device(toy, tmp_path, reference):
  wd, _, _ = reference
  _run(toy, tmp_path / "one", devices=jax.devices()[:1])
  sharded, single = _losses(wd), _losses(tmp_path / "one")
  assert [s for s, _ in sharded] == [s for s, _ in single] == list(range(5, 41, 5))
  np.testing.assert_allclose([v for _, v in sharded], [v for _, v in single], rtol=1e-5)


@pytest.mark.parametrize("exc", [RuntimeError("simulated crash"), KeyboardInterrupt()])
def test_interrupted_run_resumes_bit_identical(toy, tmp_path, reference, exc):
  wd_ref, params_ref, _ = reference
  wd = tmp_path / "run"
  with pytest.raises(type(exc)):
    _run(toy, wd, hooks=[Crash(23, exc)], mesh=(("data", 4), ("model", 2)))
  # A crash leaves the periodic checkpoint (20); Ctrl-C also saves the current step (23).
  latest = ckpt_lib.Checkpointer(str(wd / "checkpoints")).latest_step()
  assert latest == (23 if isinstance(exc, KeyboardInterrupt) else 20)
  cap = Capture(40)
  _run(toy, wd, hooks=[cap], mesh=(("data", 4), ("model", 2)))
  _assert_trees_equal(cap.params[40], params_ref)
  # metrics.jsonl reads as one run: increasing steps, same values (except the interval that Ctrl-C cut,
  # whose partial mean is logged at step 23 and whose remainder at 25).
  got, ref = dict(_losses(wd)), dict(_losses(wd_ref))
  steps = [s for s, _ in _losses(wd)]
  assert steps == sorted(set(steps))
  cut = {23, 25} if isinstance(exc, KeyboardInterrupt) else set()
  assert {s: v for s, v in got.items() if s not in cut} == {s: v for s, v in ref.items() if s not in cut}


def test_checkpoint_restores_onto_another_mesh(toy, tmp_path, reference):
  wd_ref, params_ref, _ = reference
  wd = tmp_path / "moved"
  shutil.copytree(wd_ref, wd)
  # Direct restore of the 4x2 checkpoint onto a 2x4 mesh.
  c = _config(toy)
  m = mesh_lib.make_mesh((("data", 2), ("model", 4)))
  md = state_lib.ModelDef(toy.train_module.model_fn(c))
  from jaxlab.train import optim
  tx, _ = optim.make_optimizer(c.train.optimizer, c.train.num_steps)
  fresh, shardings = state_lib.create_train_state(md, tx, m, c.sharding_rules, seed=5)
  items, meta = ckpt_lib.Checkpointer(str(wd / "checkpoints")).restore(40, state_lib.abstract_with_shardings(shardings, fresh))
  restored = ckpt_lib.from_items(items, fresh)
  assert restored.params["l1"]["kernel"].sharding.mesh == m and meta["step"] == 40
  _assert_trees_equal(restored.params, params_ref)
  # And the loop continues on 8x1 devices from step 40.
  cap = Capture(41)
  summary = _run(toy, wd, hooks=[cap], mesh=(("data", 8), ("model", 1)), num_steps=45)
  assert summary["step"] == 45 and dict(cap.shardings[41].mesh.shape) == {"data": 8, "model": 1}


def _listing(wd):
  return sorted((os.path.relpath(os.path.join(d, f), wd), os.path.getsize(os.path.join(d, f)))
                for d, _, files in os.walk(wd) for f in files)


def test_a_changed_config_is_refused_and_writes_nothing(toy, tmp_path, reference):
  wd = tmp_path / "other"
  shutil.copytree(reference[0], wd)
  before, config_text = _listing(wd), (wd / "config.json").read_text()
  with pytest.raises(ConfigError, match=r"was started with a different config \(model.hidden: 16 -> 32\); rerun "
                                        r"with the same config to resume it, or use another --workdir"):
    _run(toy, wd, num_steps=50, **{"model.hidden": 32})
  with pytest.raises(ConfigError, match=r"train.optimizer.name: 'adamw' -> 'sgd'"):
    _run(toy, wd, **{"optimizer.name": "sgd"})
  assert _listing(wd) == before and (wd / "config.json").read_text() == config_text
  # Execution keys may change on resume (here: more steps on another mesh).
  assert _run(toy, wd, num_steps=45, mesh=(("data", 2), ("model", 4)))["step"] == 45


def test_a_checkpoint_of_another_model_or_optimizer_is_named_as_such(toy, tmp_path, reference):
  wd = tmp_path / "noconfig"
  shutil.copytree(reference[0], wd)
  os.remove(wd / "config.json")                        # no record: the checkpoint's signature decides
  os.remove(wd / "summary.json")
  with pytest.raises(CheckpointError, match=r"different model: 'model/\S+' is float32\(16,\) in the "
                                            r"checkpoint but float32\(32,\) in the model.*another --workdir"):
    _run(toy, wd, num_steps=50, **{"model.hidden": 32})
  with pytest.raises(CheckpointError, match=r"same model but another optimizer's state.*init_from"):
    _run(toy, wd, num_steps=50, **{"optimizer.name": "sgd"})


def test_a_workdir_of_another_experiment_is_refused(toy, tmp_path, reference):
  from jaxlab import registry
  wd = tmp_path / "quick"
  shutil.copytree(reference[0], wd)
  before = _listing(wd)
  exp = registry.load("quickstart")
  c = exp.get_config("tiny", {"train.num_steps": 20})
  with pytest.raises(CheckpointError, match=r"holds a run of experiment toy, not quickstart; use another --workdir"):
    exp.train_module.train_and_evaluate(c, str(wd))
  assert _listing(wd) == before


def test_corrupt_checkpoint_falls_back_and_none_readable_is_a_clear_error(toy, tmp_path, reference, caplog):
  wd = tmp_path / "corrupt"
  shutil.copytree(reference[0], wd)
  older = sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit())[:-1]
  shutil.rmtree(wd / "checkpoints" / "40" / "meta")
  _run(toy, wd, num_steps=50)
  assert "checkpoints/40 is damaged (" in caplog.text and "checkpoints.damaged/40" in caplog.text
  assert f"resuming from step {older[-1]}" in caplog.text
  wd = tmp_path / "all_corrupt"
  shutil.copytree(reference[0], wd)
  for d in os.listdir(wd / "checkpoints"):
    shutil.rmtree(wd / "checkpoints" / d / "meta", ignore_errors=True)
  with pytest.raises(CheckpointError, match="checkpoints/40 is damaged.*no older checkpoint reads back whole|"
                                            "checkpoints/40 is damaged.*neither do the"):
    _run(toy, wd, num_steps=50)
  assert os.path.isdir(wd / "checkpoints" / "40") and not os.path.exists(wd / "checkpoints.damaged")


def test_init_from_takes_params_only(toy, tmp_path, reference):
  wd_ref, params_ref, _ = reference
  cap = Capture(1)
  _run(toy, tmp_path / "ft", hooks=[cap], init_from=str(wd_ref), num_steps=2, **{
      "optimizer.name": "sgd", "optimizer.learning_rate": 1e-9})
  for a, b in zip(jax.tree.leaves(cap.params[1]), jax.tree.leaves(params_ref)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(CheckpointError, match="holds no checkpoint"):
    _run(toy, tmp_path / "ft2", init_from=str(tmp_path / "nowhere"))


def test_nan_guard_names_metric_and_step(toy, tmp_path):
  with pytest.raises(NonFiniteError, match=r"train/\S+ became (nan|inf|-inf) at step \d+; lower the learning rate"):
    _run(toy, tmp_path / "nan", **{"optimizer.name": "sgd", "optimizer.learning_rate": 1e30})


def test_sigterm_saves_a_checkpoint_then_stops(toy, tmp_path):
  import signal
  from jaxlab.train import Preempted

  def preempt(step, st):
    if step == 7:
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(Preempted):
    _run(toy, tmp_path / "pre", hooks=[preempt])
  assert ckpt_lib.Checkpointer(str(tmp_path / "pre" / "checkpoints")).latest_step() == 7


def test_progress_bar_switch(monkeypatch):
  from jaxlab import progress
  monkeypatch.setenv("JAXLAB_PROGRESS", "1")
  assert progress.enabled() and not progress.bar(10).disable
  monkeypatch.setenv("JAXLAB_PROGRESS", "0")
  assert not progress.enabled() and progress.bar(10).disable


def test_a_hook_returning_true_stops_early_and_the_stop_survives_resume(toy, tmp_path):
  wd = tmp_path / "early"
  cap = Capture(12)
  summary = _run(toy, wd, hooks=[lambda step, st: step == 12, cap], num_steps=40, checkpoint_every=5)
  assert summary["stopped_early"] is True and summary["step"] == 12
  assert "eval/accuracy" in summary                               # evaluated at the stop
  steps = sorted(int(s) for s in os.listdir(wd / "checkpoints") if s.isdigit())
  assert steps[-1] == 12
  calls = []
  again = _run(toy, wd, hooks=[lambda step, st: calls.append(step)], num_steps=40, checkpoint_every=5)
  assert not calls and again["step"] == 12                        # no further training on rerun
  md = state_lib.ModelDef(toy.train_module.model_fn(_config(toy)))
  _assert_trees_equal(ckpt_lib.load_params(str(wd), md)[0], cap.params[12])


def test_param_ema_matches_a_brute_force_average():
  import jax.numpy as jnp
  import optax
  from jaxlab.train import optim
  tx = optim.with_param_ema(optax.sgd(0.1), 0.9)
  params = {"w": jnp.array([1.0, -2.0]), "b": jnp.array(0.5)}
  st = tx.init(params)
  ema = jax.tree.map(np.asarray, params)
  for k in range(5):
    grads = jax.tree.map(lambda p: p * (k + 1.0), params)
    upd, st = tx.update(grads, st, params)
    params = optax.apply_updates(params, upd)
    ema = jax.tree.map(lambda e, p: 0.9 * e + 0.1 * np.asarray(p), ema, params)
  got = optim.param_ema(st)
  for name in ("w", "b"):
    np.testing.assert_allclose(got[name], ema[name], rtol=1e-6)
  with pytest.raises(ValueError, match="no parameter average"):
    optim.param_ema(optax.sgd(0.1).init(params))
  with pytest.raises(ConfigError, match="decay"):
    optim.with_param_ema(optax.sgd(0.1), 1.0)
