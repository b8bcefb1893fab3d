"""python -m jaxlab.experiments.sft_difficulty.score: scores written back next to the original fields, resume
after an interruption equal to an uninterrupted run, refusals (existing --out, a partial file of other settings)
and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from jaxlab import cli
from jaxlab.errors import ConfigError, DataError, Interrupted
from jaxlab.experiments.sft_difficulty import score
from jaxlab.lm import Transformer, TransformerConfig, from_pretrained, save_pretrained
from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.selection import difficulty

TOK = ByteTokenizer()
RECORDS = [
    {"id": "a", "prompt": "q0: ", "completion": "<answer>1</answer>", "answer": "1", "level": 2},
    {"id": "b", "prompt": "q1: ", "completion": "two", "answer": 2, "level": 1, "meta": {"src": "x"}},
    {"prompt": "q2: ", "id": "c", "completion": "a much longer completion", "answer": "3", "level": 5},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "answer": "4",
     "level": 3},
    {"id": "e", "prompt": "q4: ", "completion": "x", "answer": "5", "level": 0},
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
  """A random tiny Llama saved as a Hugging Face checkpoint (no tokenizer.json: runs pass --tokenizer byte)."""
  path = tmp_path_factory.mktemp("ckpt")
  config = TransformerConfig(vocab_size=-(-TOK.vocab_size // 8) * 8, hidden=32, n_layers=2, n_heads=4, mlp_hidden=64,
                             max_position=96)
  save_pretrained(Transformer(config, rngs=nnx.Rngs(3)), str(path))
  return str(path)


@pytest.fixture()
def data(tmp_path) -> str:
  path = tmp_path / "data.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
  return str(path)


def _argv(data, ckpt, out, *extra):
  return ["--data", data, "--model", ckpt, "--tokenizer", "byte", "--out", str(out), *extra]


FULL = ("--scores", "loss,perplexity,length,pass_rate,field:level", "--k", "2", "--max_new_tokens", "4",
        "--batch", "4", "--chunk", "2", "--buckets", "2", "--answer_format", "raw")


def _wrapped(argv, monkeypatch, capsys, fn=score.main) -> tuple[int, str]:
  """Runs `fn` through cli.main_wrapper in-process: (exit code, stderr)."""
  monkeypatch.setattr(sys, "argv", ["score", *argv])
  old = signal.getsignal(signal.SIGTERM)
  try:
    with pytest.raises(SystemExit) as e:
      cli.main_wrapper(fn)
  finally:
    signal.signal(signal.SIGTERM, old)
  return e.value.code, capsys.readouterr().err


def _read(path) -> list[dict]:
  return [json.loads(line) for line in open(path)]


def test_scores_are_written_back(data, ckpt, tmp_path, capsys):
  out = tmp_path / "out.jsonl"
  assert score.main(_argv(data, ckpt, out, *FULL)) == 0
  assert "wrote 5 records" in capsys.readouterr().out
  got = _read(out)
  assert not os.path.exists(str(out) + ".partial")
  new = ["difficulty_loss", "difficulty_perplexity", "difficulty_length", "difficulty_pass_rate",
         "difficulty_level", "difficulty_bucket"]
  for rec, row in zip(RECORDS, got):
    assert list(row) == list(rec) + new and {k: row[k] for k in rec} == rec       # originals kept, in order
  ref = difficulty.reference_loss(from_pretrained(ckpt), TOK, RECORDS, batch=4)
  np.testing.assert_allclose([r["difficulty_loss"] for r in got], ref["loss"], atol=1e-5, rtol=0)
  np.testing.assert_allclose([r["difficulty_perplexity"] for r in got], ref["perplexity"], rtol=1e-5)
  assert [r["difficulty_length"] for r in got] == list(difficulty.length(RECORDS, TOK))
  assert [r["difficulty_level"] for r in got] == [2.0, 1.0, 5.0, 3.0, 0.0]
  assert all(r["difficulty_pass_rate"] in (0.0, 0.5, 1.0) for r in got)
  buckets = difficulty.quantile_buckets([r["difficulty_loss"] for r in got], 2)
  assert [r["difficulty_bucket"] for r in got] == list(buckets)


def test_resume_equals_uninterrupted_run(data, ckpt, tmp_path, monkeypatch, capsys):
  whole = tmp_path / "whole.jsonl"
  assert score.main(_argv(data, ckpt, whole, *FULL)) == 0
  out = tmp_path / "resumed.jsonl"
  partial = str(out) + ".partial"
  args = score.parse_args(_argv(data, ckpt, out, *FULL))
  with pytest.raises(Interrupted) as e:
    score.run(args, max_chunks=1)
  assert e.value.checkpoint == 2 and e.value.workdir == partial and not os.path.exists(out)
  lines = open(partial).read().splitlines()
  assert len(lines) == 3 and score.HEADER_KEY in json.loads(lines[0])           # header + one chunk of 2
  # Through the CLI wrapper: a second chunk, then the one-line stop message with the resume command.
  code, err = _wrapped(_argv(data, ckpt, out, *FULL), monkeypatch, capsys,
                       fn=lambda argv: score.run(score.parse_args(argv), max_chunks=1))
  assert code == 130 and "4 of 5 records scored" in err and "resume with: python -m" in err
  with open(partial, "a") as f:                                    # a torn line, as a kill mid-write leaves
    f.write('{"line": 5, "loss": 0.1')
  assert score.main(_argv(data, ckpt, out, *FULL)) == 0
  assert open(out).read() == open(whole).read()
  assert not os.path.exists(partial)


def test_partial_of_a_chunk_is_redone(data, ckpt, tmp_path):
  """Lines of an unfinished chunk are dropped so chunks (and sampling keys) stay aligned with a clean run."""
  whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
  base = _argv(data, ckpt, whole, "--scores", "length,field:level", "--chunk", "2")
  assert score.main(base) == 0
  args = score.parse_args(_argv(data, ckpt, out, "--scores", "length,field:level", "--chunk", "2"))
  with pytest.raises(Interrupted):
    score.run(args, max_chunks=2)
  partial = str(out) + ".partial"
  lines = open(partial).read().splitlines(keepends=True)
  open(partial, "w").write("".join(lines[:4]))                     # header + 3 rows: chunk 2 half written
  assert score.run(args) == 0 and open(out).read() == open(whole).read()


def test_refuses_to_overwrite(data, ckpt, tmp_path, monkeypatch, capsys):
  out = tmp_path / "out.jsonl"
  out.write_text("keep me\n")
  argv = _argv(data, ckpt, out, "--scores", "length")
  code, err = _wrapped(argv, monkeypatch, capsys)
  assert code == 2 and err.strip().splitlines() == [f"error: {out} exists; pass --overwrite to replace it, or "
                                                    "choose another --out"]
  assert out.read_text() == "keep me\n"
  assert score.main(argv + ["--overwrite"]) == 0
  assert [r["difficulty_length"] for r in _read(out)] == list(difficulty.length(RECORDS, TOK))


def test_partial_of_other_settings_is_refused(data, ckpt, tmp_path, monkeypatch, capsys):
  out = tmp_path / "out.jsonl"
  with pytest.raises(Interrupted):
    score.run(score.parse_args(_argv(data, ckpt, out, "--scores", "length", "--chunk", "1")), max_chunks=1)
  code, err = _wrapped(_argv(data, ckpt, out, "--scores", "length,field:level", "--chunk", "1"), monkeypatch, capsys)
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert err.startswith("error: ") and "differs in: scores" in err and "delete it to start over" in err
  with open(data, "a") as f:                                       # the data changed since the partial run
    f.write(json.dumps(RECORDS[0]) + "\n")
  code, err = _wrapped(_argv(data, ckpt, out, "--scores", "length", "--chunk", "1"), monkeypatch, capsys)
  assert code == 2 and "differs in: data_sha256" in err
  os.remove(str(out) + ".partial")
  with pytest.raises(Interrupted):                                 # a header alone: nothing is lost by replacing it
    score.run(score.parse_args(_argv(data, ckpt, out, "--scores", "field:level")), max_chunks=0)
  assert score.main(_argv(data, ckpt, out, "--scores", "length", "--chunk", "1")) == 0
  assert len(_read(out)) == len(RECORDS) + 1


@pytest.mark.parametrize("edit,extra,match", [
    (lambda d, c, t: (d, str(t)), (), "has no config.json"),
    (lambda d, c, t: (d, c), ("--scores", "pass_rate", "--answer_field", "gold"),
     ":1: no 'gold' field, which --scores pass_rate"),
    (lambda d, c, t: (d, c), ("--scores", "loss,difficulty"), "unknown score 'difficulty'"),
    (lambda d, c, t: (d, c), ("--scores", "field:hardness"), ":1: no 'hardness' field"),
    (lambda d, c, t: (d, c), ("--buckets", "9"), "--buckets 9 is more than the 5 records"),
    (lambda d, c, t: (str(t / "nope.jsonl"), c), (), "no such file"),
    (lambda d, c, t: (d, c), ("--scores", "pass_rate", "--max_new_tokens", "95"), "exceeds the model's max_position"),
])
def test_bad_input_is_one_error_line(data, ckpt, tmp_path, monkeypatch, capsys, edit, extra, match):
  d, c = edit(data, ckpt, tmp_path)
  code, err = _wrapped(["--data", d, "--model", c, "--tokenizer", "byte", "--out", str(tmp_path / "o.jsonl"),
                        *extra], monkeypatch, capsys)
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err


def test_missing_tokenizer_names_the_flag(data, ckpt, tmp_path):
  with pytest.raises(DataError, match=re.escape("pass --tokenizer FILE|DIR|byte")):
    score.main(["--data", data, "--model", ckpt, "--out", str(tmp_path / "o.jsonl")])
  with pytest.raises(ConfigError, match="--k must be >= 1"):
    score.parse_args(_argv(data, ckpt, tmp_path / "o.jsonl", "--k", "0"))


def test_module_entry_point_bad_json_line(ckpt, tmp_path, root):
  data = tmp_path / "bad.jsonl"
  data.write_text(json.dumps(RECORDS[0]) + "\n\n" + '{"prompt": "x", "completion": \n')
  r = subprocess.run([sys.executable, "-m", "jaxlab.experiments.sft_difficulty.score", "--data", str(data),
                      "--model", ckpt, "--tokenizer", "byte", "--out", str(tmp_path / "o.jsonl")],
                     cwd=root, capture_output=True, text=True, timeout=300)
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
  assert lines[0].startswith(f"error: {data}:3:") and "not valid JSON" in lines[0]
  assert not os.path.exists(tmp_path / "o.jsonl") and not os.path.exists(tmp_path / "o.jsonl.partial")


def test_a_jaxlab_run_directory_scores_as_its_exported_checkpoint(data, tmp_path):
  """--model may be a finished jaxlab run (lm_sft here, byte tokenizer): the scores equal those of the same model
  exported as a Hugging Face checkpoint."""
  from jaxlab import registry
  from jaxlab.llm import local
  exp = registry.load("lm_sft")
  run = tmp_path / "run"
  over = dict(exp.config_module.CANARY, **{"train.num_steps": 2, "train.eval_every": 0, "train.checkpoint_every": 0,
                                           "generate.examples": 0})
  exp.train_module.train_and_evaluate(exp.get_config("tiny", over), str(run))
  model, tok = local.load_run(str(run))
  assert isinstance(tok, ByteTokenizer)
  save_pretrained(model, str(tmp_path / "hf"))
  args = ("--scores", "loss,length", "--buckets", "0")
  assert score.main(["--data", data, "--model", str(run), "--out", str(tmp_path / "a.jsonl"), *args]) == 0
  assert score.main(_argv(data, str(tmp_path / "hf"), tmp_path / "b.jsonl", *args)) == 0
  assert _read(tmp_path / "a.jsonl") == _read(tmp_path / "b.jsonl")


def test_ties_split_by_file_order_or_kept_in_one_bucket(tmp_path, ckpt):
  path = tmp_path / "tied.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}: ", "completion": "x", "level": lv}) + "\n"
                          for i, lv in enumerate([0, 0, 0, 0, 1, 2])))
  buckets = {}
  for ties in ("order", "group"):
    out = tmp_path / f"{ties}.jsonl"
    assert score.main(["--data", str(path), "--model", ckpt, "--out", str(out), "--scores", "field:level",
                       "--buckets", "3", "--ties", ties]) == 0
    buckets[ties] = [r["difficulty_bucket"] for r in _read(out)]
  assert buckets["order"] == [0, 0, 1, 1, 2, 2]          # equal sizes: the tie at level 0 spans two buckets
  assert len(set(buckets["group"][:4])) == 1              # one bucket for the whole tie
