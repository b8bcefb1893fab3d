"""ToM RFT (staged: audit, cold starts, eval_cold, one stage per arm): end to end with every arm and resume, the
claims' paired bootstrap against a brute-force loop, the word-level tokenizer, JSONL data, clear config errors."""

import json

import numpy as np
import pytest

from experiment_checks import VOLATILE, canary_covered, check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

# The experiment's canary (its config.py's CANARY), on a 4x2 mesh of the 8 test devices.
SHORT = {**registry.load("tom_rft").config_module.CANARY, "mesh": (("data", 4), ("model", 2))}
STAGES = ["audit", "pretrain", "cold_think", "cold_nothink", "eval_cold", "gate", "sft", "nothink", "think",
          "shuffled", "rft"]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
  """The cached base model goes to a test directory, shared by the module's runs."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JAXLAB_CACHE_DIR", str(tmp_path_factory.mktemp("tom_cache")))
    yield


def _run(workdir, overrides):
  exp = registry.load("tom_rft")
  c = exp.get_config("tiny", overrides)
  configs.check_devices(c, 8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  wd = tmp_path_factory.mktemp("tom") / "reference"
  check_resume("tom_rft", wd, SHORT)
  return wd, check_end_to_end("tom_rft", wd, SHORT)


@canary_covered
def test_end_to_end_every_arm_and_resume(reference):
  wd, s = reference
  assert s["stages"] == STAGES and s["resumes"] == 1
  assert s["num_test"] == 40 and len(s["eval/test_orders"]) == 40
  assert s["eval/test_orders"] == "".join(str(k) * 8 for k in range(5))
  for arm in ("cold_think", "cold_nothink", "sft", "nothink", "think", "shuffled", "rft"):
    bits = s[f"eval/correct_{arm}"]
    assert len(bits) == 40 and set(bits) <= {"0", "1"}
    assert s[f"eval/acc_{arm}"] == pytest.approx(bits.count("1") / 40)
    assert 0.0 <= s[f"eval/format_{arm}"] <= 1.0
    for k in range(5):
      assert s[f"eval/acc_{arm}_o{k}"] == pytest.approx(bits[8 * k:8 * k + 8].count("1") / 8)
  for arm in ("nothink", "think", "shuffled"):
    assert np.isfinite(s[f"eval/kl_{arm}"])
    rows = metrics.read_metrics(str(wd / "stages" / arm))
    assert [r["step"] for r in rows] == [1, 2] and np.isfinite(rows[-1]["rollout/answer"])
  assert "rollout/format" in metrics.read_metrics(str(wd / "stages" / "think"))[-1]
  assert s["audit/naive_best_heuristic_gap"] > 0.3       # claim 1's naive half already shows at 200 / 100 stories
  fb, orders = np.array([int(b) for b in s["eval/test_fb"]]), np.array([int(o) for o in s["eval/test_orders"]])
  assert not fb[orders == 0].any() and fb[orders > 0].any()  # order 0 is the real location: never a false belief
  for arm in ("cold_think", "think"):
    bits = np.array([int(b) for b in s[f"eval/correct_{arm}"]])
    for k in range(1, 5):
      if (fb & (orders == k)).any():
        assert s[f"eval/acc_{arm}_o{k}_fb"] == pytest.approx(bits[(fb == 1) & (orders == k)].mean())
  for fmt in ("think", "nothink"):   # the canary's base and cold starts fail the gate; gate.enforce is off there
    assert 0.0 <= s[f"gate/base_o0_{fmt}"] <= 1.0
  assert s["gate/pass"] is False and {"gate/cold_think_o1_fb", "gate/cold_nothink_o1_fb"} <= set(s)
  assert s["pretrain/cached"] is False and s["rl_max_order"] == 2
  assert (wd / "stages" / "rft" / "rft_stats.json").exists()


@canary_covered
def test_only_the_needed_cold_starts_run(tmp_path, reference):
  s = _run(tmp_path, {**SHORT, "method.arms": ("think",), "audit.n_train": 60, "audit.n_test": 60})
  assert s["stages"] == ["audit", "pretrain", "cold_think", "eval_cold", "gate", "think"]
  assert s["pretrain/cached"] is True                      # the reference run built this base
  assert "eval/correct_cold_nothink" not in s


def test_failed_gate_skips_every_arm_and_fails_their_claims(tmp_path, reference, caplog):
  overrides = {**SHORT, "method.arms": ("sft", "think"), "gate.enforce": True}
  s = _run(tmp_path, overrides)
  assert s["gate/pass"] is False and "competence gate failed" in caplog.text
  assert s["sft/skipped"] == "competence gate failed" and "eval/correct_sft" not in s
  assert not (tmp_path / "stages" / "sft").exists() and not (tmp_path / "stages" / "think").exists()
  by_name = {c.name: c for c in registry.load("tom_rft").config_module.CLAIMS}
  for name in ("think_vs_sft_o2_fb", "think_format"):
    r = by_name[name].check([s])
    assert r["passed"] is False and "competence gate failed" in r["error"], r


def test_plot_with_and_without_arms(tmp_path, reference):
  wd, s = reference
  train = registry.load("tom_rft").train_module
  gated = {k: v for k, v in s.items() if not any(k.startswith(f"eval/acc_{a}") for a in ("sft", "nothink", "think",
                                                                                             "shuffled", "rft"))}
  for name, runs in (("all", [s]), ("gated", [gated])):
    (path,) = train.plot(runs, [str(wd)], str(tmp_path / name))
    assert path.endswith("tom_rft.png") and (tmp_path / name / "tom_rft.png").stat().st_size > 0


def test_calibration_refuses_claim_seeds(tmp_path, capsys):
  from jaxlab.experiments.tom_rft import calibrate
  with pytest.raises(SystemExit):
    calibrate.main(["--seed", "1", "--workdir", str(tmp_path / "cal")])
  assert "not a validation seed" in capsys.readouterr().err and not (tmp_path / "cal").exists()


def test_format_words_end_the_vocabulary():
  from jaxlab.tom import tokens
  words = tokens.vocabulary()
  assert tuple(words[-2:]) == tokens.FORMAT_WORDS and len(set(words)) == len(words)
  tok, c = tokens.tokenizer(), registry.load("tom_rft").get_config("tiny", {})
  for instruction in (c.data.instruction_think, c.data.instruction_nothink):
    assert len(tok.encode(instruction)) == 1 and tok.decode(tok.encode(instruction)) == instruction


def test_false_belief_interval_matches_a_brute_force_loop():
  cfg = registry.load("tom_rft").config_module
  rng = np.random.default_rng(4)
  runs = []
  for _ in range(3):
    runs.append({"eval/test_orders": "".join(str(k) for k in rng.integers(0, 5, size=400)),
                 "eval/test_fb": "".join(str(b) for b in rng.integers(0, 2, size=400)),
                 **{f"eval/correct_{a}": "".join(str(b) for b in (rng.random(400) < p).astype(int))
                    for a, p in (("think", 0.6), ("sft", 0.5))}})
  point, low, high = cfg.paired_interval(runs, "think", "sft", (1, 2), fb=True, reps=2000)
  diffs = [np.mean([int(r["eval/correct_think"][i]) - int(r["eval/correct_sft"][i]) for i in range(400)
                    if r["eval/test_orders"][i] in "12" and r["eval/test_fb"][i] == "1"]) for r in runs]
  assert point == pytest.approx(np.mean(diffs), abs=1e-12) and low < point < high


def test_paired_bootstrap_matches_a_brute_force_loop():
  cfg = registry.load("tom_rft").config_module
  rng = np.random.default_rng(3)
  runs = []
  for _ in range(3):
    orders = "".join(str(k) for k in rng.integers(0, 5, size=300))
    runs.append({"eval/test_orders": orders,
                 **{f"eval/correct_{a}": "".join(str(b) for b in (rng.random(300) < p).astype(int))
                    for a, p in (("think", 0.6), ("sft", 0.5))}})
  point, low = cfg.paired_diff(runs, "think", "sft", (2,), reps=2000)
  # brute force: per seed the order-2 questions, their mean difference, then the mean over seeds
  diffs = []
  for r in runs:
    idx = [i for i, o in enumerate(r["eval/test_orders"]) if o == "2"]
    diffs.append(np.mean([int(r["eval/correct_think"][i]) - int(r["eval/correct_sft"][i]) for i in idx]))
  assert point == pytest.approx(np.mean(diffs), abs=1e-12)
  se = np.sqrt(sum(np.var([int(r["eval/correct_think"][i]) - int(r["eval/correct_sft"][i])
                           for i, o in enumerate(r["eval/test_orders"]) if o == "2"]) /
                   r["eval/test_orders"].count("2") for r in runs)) / 3
  assert low == pytest.approx(point - 1.96 * se, abs=0.3 * se)     # the normal interval, within bootstrap noise


def test_word_tokenizer_round_trips_generated_data():
  from jaxlab.tom import stories, tokens
  tok = tokens.tokenizer()
  recs = stories.to_records(stories.generate(200, seed=5, orders=(0, 1, 2, 3, 4)), thinking=True)
  texts = [r["prompt"] + r["completion"] for r in recs]
  assert tokens.unknown_bytes(tok, texts) == 0
  for t in texts[:50]:
    assert tok.decode(tok.encode(t)) == t
  assert max(len(tok.encode(r["prompt"])) + len(tok.encode(r["completion"])) for r in recs) < 112


def test_anchor_trace_names_the_first_leaving_chain_agent():
  from jaxlab.tom import simulator, stories
  train = registry.load("tom_rft").train_module
  c = registry.load("tom_rft").get_config("tiny", {})
  examples = stories.generate(400, seed=4, orders=(0, 1, 2, 3))
  recs = train._records(c, examples)
  from jaxlab.tom import tokens
  for ex, r in zip(examples, recs):
    ex = tokens.canonical(ex)
    who, where = r["trace"].split(" -> ")
    assert where == r["answer"] == ex.answer
    chain = ex.question.chain
    if who == "none":
      assert simulator.belief(ex.story, chain) == stories.witnessed_path(ex.story, ())[-1]
    else:   # the answer is what the anchor agent saw last, and no chain agent left before it
      assert who in chain and simulator.belief(ex.story, (who,)) == r["answer"]
      first = [e.agent for e in ex.story.events if e.kind == "exit" and e.agent in chain][0]
      assert first == who


def test_jsonl_data_and_its_errors(tmp_path):
  from jaxlab.tom import stories
  exp = registry.load("tom_rft")
  train_p, test_p = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
  stories.write_jsonl(train_p, stories.generate(40, seed=1, orders=(0, 1, 2)))
  stories.write_jsonl(test_p, stories.generate(10, seed=2, orders=(3,)))
  c = exp.get_config("tiny", {**SHORT, "data.source": "jsonl", "data.train_path": str(train_p),
                              "data.test_path": str(test_p)})
  cold, train, test = exp.train_module.datasets(c)
  assert {r["order"] for r in cold} <= {0, 1} and {r["order"] for r in train} <= {0, 1, 2}
  assert len(test) == 10 and all(r["trace"] for r in cold) and test[0]["pair"] is not None
  test_p.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n")
  with pytest.raises(ConfigError, match="'order'"):
    exp.train_module.datasets(c)
  with pytest.raises(ConfigError, match="trace"):
    exp.train_module.completion_of({"prompt": "p", "answer": "a", "trace": None}, True)


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("tom_rft", tmp_path, {**SHORT, "method.arms": ("think",)}, rtol=1e-4)


@pytest.mark.parametrize("overrides,msg", [
    ({"method.arms": ("ppo",)}, "method.arms"),
    ({"method.arms": ("think", "think")}, "at most once"),
    ({"grpo.num_generations": 1}, "num_generations"),
    ({"grpo.temperature": 0.0}, "temperature"),
    ({"data.test_orders": (0, 5)}, "num_agents"),
    ({"data.rl_orders": ()}, "rl_orders"),
    ({"data.source": "csv"}, "data.source"),
    ({"cold.shrink": 0.0}, "cold.shrink"),
    ({"cold.perturb": -0.1}, "cold.perturb"),
])
def test_bad_config_values_are_clear_errors(overrides, msg):
  with pytest.raises(ConfigError, match=msg):
    registry.load("tom_rft").get_config("tiny", overrides)


def test_missing_inputs_are_clear_errors_before_anything_is_written(tmp_path):
  exp = registry.load("tom_rft")
  exp.get_config("full")                                       # builds without model.hf_path / data paths
  for overrides, msg in (({"data.source": "jsonl"}, "train_path"), ({"cold.num_steps": 0}, "pretrained start")):
    with pytest.raises(ConfigError, match=msg):
      exp.train_module.train_and_evaluate(exp.get_config("tiny", overrides), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_shrink_perturb_starts_the_cold_start_between_base_and_fresh(tmp_path, reference, monkeypatch):
  import jax
  from flax import nnx
  from jaxlab.state import ModelDef
  exp = registry.load("tom_rft")
  seen = []

  def fake_sft(config, workdir, modeldef, rows, *, init_params, **kw):
    seen.append(init_params)
    return init_params, {"step": 0}
  monkeypatch.setattr(exp.train_module.trainers, "sft", fake_sft)
  for shrink, perturb in ((1.0, 0.0), (0.5, 0.25)):
    c = exp.get_config("tiny", {**SHORT, "method.arms": ("think",), "cold.shrink": shrink, "cold.perturb": perturb})
    exp.train_module.train_and_evaluate(c, str(tmp_path / f"s{shrink}"), until="gate")
  plain, mixed = seen
  run = exp.train_module
  cfg = exp.get_config("tiny", SHORT)
  tok = run.tokenizer_for(cfg, [])
  mcfg = run.model_config(cfg, tok)
  fresh = ModelDef.split(run.Transformer(mcfg, rngs=nnx.Rngs(cfg.seed + 7)))[0]
  want = jax.tree.map(lambda b, f: 0.5 * b + 0.25 * f, plain, fresh)
  for a, b in zip(jax.tree.leaves(mixed), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@canary_covered
def test_stable_keys_are_volatile_free(reference):
  _, s = reference
  assert not set(VOLATILE) & {k for k in s if k.startswith("eval/")}
