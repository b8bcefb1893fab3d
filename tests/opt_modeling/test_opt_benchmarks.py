"""Benchmark loaders: MAMO, ORLM / IndustryOR, NL4Opt and OptiBench field names, errata, and bad input."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from jaxlab.errors import DataError
from jaxlab.opt_modeling.benchmarks import FORMATS, Problem, load_benchmark, load_errata


def _write(tmp_path, name: str, rows, *, blank_after: int | None = None) -> str:
  """Writes rows (dicts, or raw strings written as they are) one per line; returns the path."""
  path = os.path.join(tmp_path, name)
  with open(path, "w", encoding="utf-8") as f:
    for i, row in enumerate(rows):
      f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
      if blank_after is not None and i == blank_after:
        f.write("\n")
  return path


def _error(fn, *args, **kwargs) -> str:
  with pytest.raises(DataError) as e:
    fn(*args, **kwargs)
  msg = str(e.value)
  assert "\n" not in msg
  return msg


# ---------------------------------------------------------------------------------------------------------------
# formats


def test_mamo(tmp_path):
  path = _write(tmp_path, "EasyLP.jsonl", [{"Question": "Maximise x.", "Answer": 12.5},
                                           {"Question": "Minimise y.", "Answer": "1,200"}])
  probs = load_benchmark(path)
  assert probs == [Problem("EasyLP:1", "Maximise x.", 12.5, "mamo", {}),
                   Problem("EasyLP:2", "Minimise y.", 1200.0, "mamo", {})]
  assert load_benchmark(path, fmt="mamo") == probs
  with pytest.raises(dataclasses.FrozenInstanceError):
    probs[0].answer = 3.0


def test_orlm_industryor(tmp_path):
  path = _write(tmp_path, "IndustryOR.json", [
      {"en_question": "Plan trips.", "en_answer": "3050.0", "id": 7, "difficulty": "easy"},
      {"en_question": "Impossible plan.", "en_answer": "No Best Solution", "type": "IP"},
      {"en_question": "Free plan.", "en_answer": None, "id": "x9"},
  ])
  probs = load_benchmark(path)
  assert [p.id for p in probs] == ["7", "IndustryOR:2", "x9"]
  assert [p.answer for p in probs] == [3050.0, None, None]
  assert {p.source for p in probs} == {"orlm"}
  assert probs[0].extra == {"difficulty": "easy"} and probs[1].extra == {"type": "IP"}
  assert probs[0].description == "Plan trips."


def test_nl4opt_field_variants(tmp_path):
  path = _write(tmp_path, "nl4opt.jsonl", [
      {"question": "q1", "optimal_value": 4},
      {"description": "q2", "answer": "$1,250.50"},
      {"en_question": "q3", "Answer": "-3e2"},
      {"question": "q4", "en_answer": "infeasible"},
      {"question": "q5", "results": {"objective": "8.0"}},
  ], blank_after=1)
  probs = load_benchmark(path)
  assert [p.source for p in probs] == ["nl4opt"] * 5
  assert [p.description for p in probs] == ["q1", "q2", "q3", "q4", "q5"]
  assert [p.answer for p in probs] == [4.0, 1250.5, -300.0, None, 8.0]
  assert [p.id for p in probs] == ["nl4opt:1", "nl4opt:2", "nl4opt:4", "nl4opt:5", "nl4opt:6"]  # blank line 3


def test_optibench_jsonl_and_json_array(tmp_path):
  rows = [{"question": "Max profit?", "results": {"The maximum profit": "3600.0"}, "type": "linear-notable",
           "index": 0},
          {"question": "Min area?", "results": {"Area": 1250}, "index": 1}]
  probs = load_benchmark(_write(tmp_path, "optibench.jsonl", rows))
  assert [(p.id, p.answer, p.source) for p in probs] == [("optibench:1", 3600.0, "optibench"),
                                                         ("optibench:2", 1250.0, "optibench")]
  assert probs[0].extra == {"type": "linear-notable", "index": 0}
  array = os.path.join(tmp_path, "e-opt.json")
  with open(array, "w") as f:
    json.dump(rows, f, indent=4)  # one pretty-printed JSON array, as OptiBench ships it
  assert [(p.id, p.answer) for p in load_benchmark(array)] == [("e-opt:1", 3600.0), ("e-opt:2", 1250.0)]


def test_optibench_results_with_several_entries_need_an_erratum(tmp_path):
  path = _write(tmp_path, "ob.jsonl", [{"question": "q", "results": {"x": "1.0", "Total": "9.0"}},
                                       {"question": "r", "results": {"Total": "5"}}])
  msg = _error(load_benchmark, path)
  assert f"{path}:1" in msg and "'results' has 2 entries" in msg and "'ob:1'" in msg
  errata = _write(tmp_path, "fix.jsonl", [{"id": "ob:1", "answer": 9}])
  probs = load_benchmark(path, errata=errata)
  assert [p.answer for p in probs] == [9.0, 5.0] and "answer_before_errata" not in probs[0].extra
  path = _write(tmp_path, "ob2.jsonl", [{"question": "q", "results": {"x": "1.0", "Total": "9.0"}, "optimal_value": 9}])
  assert load_benchmark(path)[0].answer == 9.0  # an explicit objective field wins over the results dict


def test_limit(tmp_path):
  path = _write(tmp_path, "m.jsonl", [{"Question": f"q{i}", "Answer": i} for i in range(5)])
  assert [p.answer for p in load_benchmark(path, limit=2)] == [0.0, 1.0]
  assert load_benchmark(path, limit=0) == []
  for bad in (-1, 1.5, True):
    assert "limit" in _error(load_benchmark, path, limit=bad)


# ---------------------------------------------------------------------------------------------------------------
# errata


def test_errata_jsonl_and_csv(tmp_path):
  path = _write(tmp_path, "IndustryOR.jsonl", [{"en_question": "a", "en_answer": "10", "id": 1},
                                               {"en_question": "b", "en_answer": "20"},
                                               {"en_question": "c", "en_answer": "30"}])
  fix = _write(tmp_path, "errata.jsonl", [{"id": 1, "answer": "11.5", "note": "typo"},
                                          {"id": "IndustryOR:3", "answer": "No Best Solution"}])
  probs = load_benchmark(path, errata=fix)
  assert [p.answer for p in probs] == [11.5, 20.0, None]
  assert probs[0].extra["answer_before_errata"] == 10.0 and probs[2].extra["answer_before_errata"] == 30.0
  assert "answer_before_errata" not in probs[1].extra
  csv_path = os.path.join(tmp_path, "errata.csv")
  with open(csv_path, "w") as f:
    f.write("id,answer,comment\n1,\"1,000\",thousands\nIndustryOR:2,infeasible,\n")
  assert [p.answer for p in load_benchmark(path, errata=csv_path)] == [1000.0, None, 30.0]
  assert load_errata(csv_path) == {"1": 1000.0, "IndustryOR:2": None}


def test_errata_errors(tmp_path):
  path = _write(tmp_path, "b.jsonl", [{"Question": "a", "Answer": 1}])
  unknown = _write(tmp_path, "unknown.jsonl", [{"id": "b:1", "answer": 2}, {"id": "b:7", "answer": 3}])
  msg = _error(load_benchmark, path, errata=unknown)
  assert "'b:7'" in msg and "not in" in msg and "'b:1'" not in msg.split("e.g.")[0]
  twice = _write(tmp_path, "twice.jsonl", [{"id": "b:1", "answer": 2}, {"id": "b:1", "answer": 3}])
  assert f"{twice}:2" in _error(load_benchmark, path, errata=twice)
  no_answer = _write(tmp_path, "noanswer.jsonl", [{"id": "b:1", "value": 2}])
  assert "'answer'" in _error(load_benchmark, path, errata=no_answer)
  bad_answer = _write(tmp_path, "bad.jsonl", [{"id": "b:1", "answer": "two"}])
  msg = _error(load_benchmark, path, errata=bad_answer)
  assert f"{bad_answer}:1" in msg and "'two'" in msg
  header = os.path.join(tmp_path, "h.csv")
  with open(header, "w") as f:
    f.write("problem,value\nb:1,2\n")
  assert "id,answer" in _error(load_benchmark, path, errata=header)
  txt = os.path.join(tmp_path, "e.txt")
  with open(txt, "w") as f:
    f.write("b:1 2\n")
  assert ".csv" in _error(load_benchmark, path, errata=txt)
  assert "no such errata file" in _error(load_benchmark, path, errata=os.path.join(tmp_path, "missing.csv"))


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_json_lines_name_file_and_line(tmp_path):
  path = _write(tmp_path, "bad.jsonl", [{"Question": "a", "Answer": 1}, '{"Question": "b", "Answer": '])
  assert f"{path}:2" in _error(load_benchmark, path)
  path = _write(tmp_path, "list.jsonl", [{"Question": "a", "Answer": 1}, "[1, 2]"])
  msg = _error(load_benchmark, path)
  assert f"{path}:2" in msg and "JSON object" in msg


def test_missing_fields_name_the_expected_ones(tmp_path):
  path = _write(tmp_path, "m.jsonl", [{"Question": "a", "Answer": 1}, {"Question": "b", "answer": 2}])
  msg = _error(load_benchmark, path)
  assert f"{path}:2" in msg and "'Answer'" in msg and "mamo" in msg
  path = _write(tmp_path, "o.jsonl", [{"en_question": "a", "en_answer": 1}, {"question": "b", "en_answer": 2}])
  msg = _error(load_benchmark, path)
  assert f"{path}:2" in msg and "'en_question'" in msg
  path = _write(tmp_path, "n.jsonl", [{"question": "a", "answer": 1}, {"question": "b"}])
  msg = _error(load_benchmark, path)
  assert f"{path}:2" in msg and "'optimal_value'" in msg


def test_wrong_explicit_format(tmp_path):
  path = _write(tmp_path, "IndustryOR.jsonl", [{"en_question": "a", "en_answer": "10"}])
  msg = _error(load_benchmark, path, fmt="mamo")
  assert f"{path}:1" in msg and "'Question'" in msg and "'en_question'" in msg  # expected vs found
  assert load_benchmark(path, fmt="nl4opt")[0].source == "nl4opt"  # en_question/en_answer also fit NL4Opt


def test_unknown_format(tmp_path):
  path = _write(tmp_path, "x.jsonl", [{"foo": 1, "bar": 2}])
  msg = _error(load_benchmark, path)
  assert "cannot tell the benchmark format" in msg and "'foo'" in msg and "fmt=" in msg and f"{path}:1" in msg
  msg = _error(load_benchmark, path, fmt="mps")
  assert "'mps'" in msg and all(f in msg for f in FORMATS)


def test_bad_values(tmp_path):
  path = _write(tmp_path, "v.jsonl", [{"Question": "a", "Answer": "about 12"}])
  msg = _error(load_benchmark, path)
  assert f"{path}:1" in msg and "'Answer'" in msg and "'about 12'" in msg
  path = _write(tmp_path, "nan.jsonl", ['{"Question": "a", "Answer": NaN}'])
  assert "finite" in _error(load_benchmark, path)
  path = _write(tmp_path, "d.jsonl", [{"Question": "  ", "Answer": 1}])
  assert "'Question' must be a non-empty string" in _error(load_benchmark, path)
  path = _write(tmp_path, "r.jsonl", [{"question": "a", "results": [1, 2]}])
  assert "'results' is a list" in _error(load_benchmark, path)
  path = _write(tmp_path, "i.jsonl", [{"Question": "a", "Answer": 1, "id": [1]}])
  assert "'id'" in _error(load_benchmark, path)


def test_duplicate_ids_empty_and_missing_files(tmp_path):
  path = _write(tmp_path, "dup.jsonl", [{"en_question": "a", "en_answer": 1, "id": 3},
                                        {"en_question": "b", "en_answer": 2, "id": "3"}])
  msg = _error(load_benchmark, path)
  assert f"{path}:2" in msg and "duplicate id '3'" in msg and f"{path}:1" in msg
  empty = os.path.join(tmp_path, "empty.jsonl")
  with open(empty, "w") as f:
    f.write("\n  \n")
  assert "no records" in _error(load_benchmark, empty)
  assert "no such file" in _error(load_benchmark, os.path.join(tmp_path, "nope.jsonl"))
