"""Fuzzing the user-facing parsers: every generated input parses or raises the project's one-line error.

Each parser is fed `hypothesis`-generated text; anything but a successful parse must be a
`jaxlab.errors.JaxlabError` whose message is one line (no traceback-like dumps, no stray exception types).
"""

import contextlib
import json
import os
import string
import tempfile

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test extra: pip install -e '.[test]'")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from jaxlab import cli, configs  # noqa: E402
from jaxlab.errors import JaxlabError  # noqa: E402

FUZZ = settings(max_examples=int(os.environ.get("JAXLAB_FUZZ_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(alphabet=string.printable + "éü\u2028\x00", max_size=80)


def _one_line(e: Exception) -> None:
  assert isinstance(e, JaxlabError), f"{type(e).__name__}: {e}"
  assert "\n" not in str(e) and str(e).strip(), repr(str(e))


def _parses_or_fails_cleanly(fn, *args, **kwargs):
  try:
    return fn(*args, **kwargs)
  except JaxlabError as e:
    _one_line(e)
  return None


@contextlib.contextmanager
def _file(name: str, content):
  """A temporary file holding `content` (str: UTF-8 text; bytes: as is); yields its path."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, name)
    with open(path, "wb") as f:
      f.write(content.encode("utf-8") if isinstance(content, str) else content)
    yield path


def _config():
  c = configs.base_config()
  c.train = configs.train_config()
  c.model = configs.ml_collections.ConfigDict(dict(hidden=(16, 16), name="mlp", dropout=0.1, bias=True))
  return c


KEYS = st.sampled_from(["train.num_steps", "train.optimizer.learning_rate", "model.hidden", "model.name",
                        "model.bias", "mesh", "sharding_rules", "seed", "train.optimizer.nam", "nosuch.key", ""])


@FUZZ
@given(key=KEYS, value=TEXT)
def test_config_overrides(key, value):
  c = _config()
  _parses_or_fails_cleanly(configs.apply_overrides, c, [f"{key}={value}"])
  _parses_or_fails_cleanly(configs.apply_overrides, c, [value])        # maybe no '=' at all


@FUZZ
@given(arg=TEXT)
def test_config_arguments(arg):
  _parses_or_fails_cleanly(configs.parse_arg, arg, variant="tiny", seed=0, data="")


@FUZZ
@given(text=st.one_of(TEXT, st.lists(st.integers(-5, 50), max_size=5).map(lambda v: ",".join(map(str, v)))))
def test_seeds(text):
  seeds = _parses_or_fails_cleanly(cli.parse_seeds, text)
  if seeds is not None:
    assert all(isinstance(s, int) and s >= 0 for s in seeds) and len(set(seeds)) == len(seeds)


CELL = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-1000, 1000).map(str),
                 st.sampled_from(["", "NA", "x", "1e400", " 3 ", "-", "nan", "1,5"]))


@st.composite
def csv_texts(draw):
  cols = draw(st.integers(1, 4))
  header = draw(st.lists(st.sampled_from(["a", "b", "c", "time", "a", "unit", ""]), min_size=cols, max_size=cols))
  rows = draw(st.lists(st.lists(CELL, min_size=max(cols - 1, 0), max_size=cols + 1), max_size=30))
  lines = [",".join(header)] + [",".join(r) for r in rows]
  if draw(st.booleans()):
    lines = [draw(TEXT)] + lines
  return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n\n"]))


@FUZZ
@given(text=csv_texts(), lags=st.integers(1, 4), val=st.sampled_from([0.0, 0.2]))
def test_navar_csv(text, lags, val):
  from jaxlab.causal import data
  with _file("f.csv", text) as path:
    panel = _parses_or_fails_cleanly(data.read_panel, path)
    if panel is not None:
      w = _parses_or_fails_cleanly(data.make_windows, panel, lags, "global", val)
      if w is not None:
        assert np.all(np.isfinite(w.x)) and (~w.val).sum() >= data.MIN_TRAIN_WINDOWS


@FUZZ
@given(text=csv_texts())
def test_timeseries_csv(text):
  from jaxlab.data import timeseries
  with _file("f.csv", text) as path:
    out = _parses_or_fails_cleanly(timeseries.read_csv, path)
    if out is not None:
      assert np.all(np.isfinite(out[0]))


@FUZZ
@given(lines=st.lists(st.one_of(TEXT, st.dictionaries(st.sampled_from(["prompt", "answer", "x"]), TEXT).map(json.dumps)),
                      max_size=6))
def test_jsonl(lines):
  from jaxlab.data.jsonl import iter_jsonl
  with _file("f.jsonl", "\n".join(lines)) as path:
    _parses_or_fails_cleanly(lambda p: list(iter_jsonl(p)), path)


POOL_ENTRY = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.integers(), TEXT), "answers": st.lists(st.one_of(st.sampled_from(["A", "B", "c", "Z", ""]),
                                                                          st.integers(), st.none()), max_size=6),
    "final": st.one_of(st.sampled_from(["A", "B"]), st.none(), st.integers()),
    "trace_confidence": st.lists(st.one_of(st.floats(allow_nan=True), st.dictionaries(
        st.sampled_from(["mean_confidence", "x"]), st.floats(allow_nan=True)), TEXT), max_size=6),
    "gold": st.one_of(st.sampled_from(["A", "D"]), st.none())})


@FUZZ
@given(lines=st.lists(st.one_of(POOL_ENTRY.map(json.dumps), TEXT), max_size=5), free=st.booleans())
def test_pets_pools(lines, free):
  from jaxlab.tts import pools
  with _file("pools.jsonl", "\n".join(lines)) as path:
    _parses_or_fails_cleanly(pools.read_pools, path, choices=None if free else ("A", "B", "C", "D"))


SFT_RECORD = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(TEXT, st.integers()), "completion": st.one_of(TEXT, st.lists(st.one_of(
        st.fixed_dictionaries({"text": TEXT}, optional={"train": st.booleans()}), TEXT), max_size=3)),
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "assistant", "x"]),
                                                            "content": TEXT}), max_size=3)})


@FUZZ
@given(lines=st.lists(st.one_of(SFT_RECORD.map(json.dumps), TEXT), max_size=5))
def test_sft_jsonl(lines):
  from jaxlab.lm import sft_data
  with _file("sft.jsonl", "\n".join(lines)) as path:
    _parses_or_fails_cleanly(sft_data.read_jsonl, path)


@st.composite
def safetensors_files(draw):
  entry = st.fixed_dictionaries({}, optional={
      "dtype": st.sampled_from(["F32", "BF16", "I8", "F8", "", 3]),
      "shape": st.lists(st.integers(-2, 5), max_size=3),
      "data_offsets": st.lists(st.integers(-4, 64), max_size=3)})
  header = draw(st.one_of(st.dictionaries(st.sampled_from(["w", "b", "__metadata__"]), entry, max_size=3),
                          st.lists(st.integers(), max_size=2), TEXT.map(json.dumps)))
  text = json.dumps(header).encode() if not isinstance(header, str) else header.encode()
  n = draw(st.one_of(st.just(len(text)), st.integers(0, 2 ** 40)))
  return n.to_bytes(8, "little") + text + draw(st.binary(max_size=64))


@FUZZ
@given(blob=safetensors_files())
def test_safetensors_headers(blob):
  pytest.importorskip("safetensors", reason="the hf extra: pip install -e '.[hf]'")
  from jaxlab.lm import hf
  with _file("model.safetensors", blob) as path:
    _parses_or_fails_cleanly(hf.read_safetensors, path)


@pytest.mark.parametrize("line,col", [('{"prompt": "a" "completion": "b"}', 16), ("{'prompt': 'a'}", 2),
                                      ('{"prompt": "a", "completion": "b",}', 35), ("hello", 1)])
def test_jsonl_errors_name_the_column_of_the_error(tmp_path, line, col):
  from jaxlab.data.jsonl import iter_jsonl
  from jaxlab.errors import DataError
  path = tmp_path / "f.jsonl"
  path.write_text('{"prompt": "ok"}\n' + line + "\n")
  with pytest.raises(DataError, match=rf"f.jsonl:2:{col}: not valid JSON"):
    list(iter_jsonl(str(path)))
