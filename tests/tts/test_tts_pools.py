"""PETS JSONL answer pools: parsing, free-form options, confidences, line-numbered errors, atomic writes."""

import json
import os

import numpy as np
import pytest

from jaxlab.errors import DataError
from jaxlab.tts import pools


def _write(path, lines):
  path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
  return str(path)


def test_round_trip_multiple_choice(tmp_path):
  recs = [{"id": "a", "answers": ["A", "b", " C ", "A", "E", None], "final": "A", "answer": "C",
           "trace_confidence": [1.0, {"mean_confidence": 2.0}, {"conf_summary": {"mean_confidence": 3.0}}, 4.0, 5.0,
                                6.0]},
          {"id": "b", "answers": ["D", "D", "B"], "correct_answer": 1}]
  path = str(tmp_path / "p.jsonl")
  assert pools.write_pools(path, recs) == 2
  p = pools.read_pools(path)
  assert p.ids == ["a", "b"] and p.num_options == 4 and p.skipped_answers == 2   # "E" and None dropped
  np.testing.assert_array_equal(p.answers, [[0, 1, 2, 0], [3, 3, 1, -1]])
  np.testing.assert_array_equal(p.lengths, [4, 3])
  np.testing.assert_allclose(p.confidences[0], [1, 2, 3, 4])
  np.testing.assert_array_equal(p.labels, [0, 3])                  # final, then the pool majority
  np.testing.assert_array_equal(p.gold, [2, 1])
  assert p.has_confidence


def test_free_form_options_and_relabel(tmp_path):
  rec = {"answers": ["12", "7", "12", "3", "9", "7", "7"], "final": "12", "answer": "5"}
  path = _write(tmp_path / "f.jsonl", [rec])
  p = pools.read_pools(path, choices=None, max_options=3)
  assert p.options[0] == ["12", "7", "3"] and p.skipped_answers == 1           # "9" exceeds max_options
  np.testing.assert_array_equal(p.answers[0], [0, 1, 0, 2, 1, 1])
  assert p.labels[0] == 0 and p.gold[0] == pools.UNMATCHED
  assert pools.read_pools(path, choices=None, max_options=3, relabel_mv=True).labels[0] == 1


def test_pool_majority_tie_rules():
  rows = np.array([[2, 1, 1, 2], [-1, -1, -1, -1], [3, 0, 3, 1]])
  np.testing.assert_array_equal(pools.pool_majority(rows, 4), [1, -1, 3])                    # default: smallest
  np.testing.assert_array_equal(pools.pool_majority(rows, 4, tie_break="first"), [2, -1, 3])  # earliest answer
  with pytest.raises(ValueError, match="tie_break"):
    pools.pool_majority(rows, 4, tie_break="last")
  assert pools.majority_answer(["b", "", "a", "a", "b"]) == "b"
  assert pools.majority_answer(["b", "", "a", "a", "b"], unique=True) is None                 # tied: no `final`
  assert pools.majority_answer(["b", "a", "a"], unique=True) == "a"
  assert pools.majority_answer(["", ""]) is None


def test_missing_final_is_labelled_by_the_readers_tie_rule(tmp_path):
  path = _write(tmp_path / "t.jsonl", [{"answers": ["B", "A", "B", "A"]}, {"answers": ["C", "D", "D"], "final": "C"}])
  assert pools.read_pools(path).labels.tolist() == [0, 2]                   # "min": A; a given final is kept
  assert pools.read_pools(path, tie_break="first").labels.tolist() == [1, 2]


@pytest.mark.parametrize("lines,message", [
    (['{"answers": ["A"]}', "{not json"], r":2: not valid JSON"),
    (['{"answers": ["A"]}', "[1, 2]"], r":2: expected a JSON object"),
    (['{"answers": "A"}'], r":1: 'answers' must be a list"),
    (['{"answers": ["A", ["B"]]}'], r":1: answers must be strings or numbers"),
    (['{"answers": ["A", "B"], "trace_confidence": [1.0]}'], r":1: 'trace_confidence' must be a list with one entry"),
    (['{"answers": ["A"], "trace_confidence": [{"tail": 1}]}'], r":1: trace_confidence\[0\]: .* no 'mean_confidence'"),
    (['{"answers": ["A"], "trace_confidence": [-1]}'], r"finite and >= 0"),
    (['{"id": 1, "answers": ["A"]}', '', '{"id": 1, "answers": ["B"]}'], r":3: duplicate id '1' \(first on line 1\)"),
    (['{"answers": ["A"], "final": "Z"}'], r":1: 'final' 'Z' is not one of"),
    (['{"answers": ["A"], "answer": "Q"}'], r":1: gold answer 'Q' is not one of the choices"),
    (['{"answers": ["A"], "answer": 7}'], r":1: answer index 7 is outside"),
    ([''], r"no questions"),
])
def test_malformed_lines_name_the_line(tmp_path, lines, message):
  path = _write(tmp_path / "bad.jsonl", lines)
  with pytest.raises(DataError, match=message):
    pools.read_pools(path)


def test_missing_file(tmp_path):
  with pytest.raises(DataError, match="no such file"):
    pools.read_pools(str(tmp_path / "nope.jsonl"))


def test_write_is_atomic(tmp_path):
  path = tmp_path / "out.jsonl"
  path.write_text("old\n")
  with pytest.raises(DataError, match="record 1: needs an 'answers' list"):
    pools.write_pools(str(path), [{"answers": ["A"]}, {"id": "x"}])
  with pytest.raises(DataError, match="record 0: not JSON-serialisable"):
    pools.write_pools(str(path), [{"answers": [float("nan")]}])

  def boom():
    yield {"answers": ["A"]}
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    pools.write_pools(str(path), boom())
  assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["out.jsonl"]
