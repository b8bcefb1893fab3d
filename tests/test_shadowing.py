"""The top-level kernels/ and experiments/ folders (jaxlab.kernels, jaxlab.experiments) never shadow an installed
package of the same name, though python puts the working directory first on sys.path: run from the repository
root, `import kernels` gives the installed package (Hugging Face's, which transformers imports) or fails clearly."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("kernels", "experiments")


def _run(code, **env):
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout


@pytest.mark.parametrize("name", NAMES)
def test_folder_is_not_importable_by_its_own_name(name):
  out = _run(f"""
import os
try:
  import {name}
  print("found", os.path.dirname(os.path.realpath({name}.__file__)))
except ModuleNotFoundError as e:
  print("missing", e)
""")
  if out.startswith("found"):   # the installed package of that name
    assert out.split(None, 1)[1].strip() != os.path.join(os.path.realpath(ROOT), name), out
  else:
    assert out.strip() == (f"missing No module named '{name}' (the repository's {name}/ folder is jaxlab.{name}; "
                           "import that)"), out


@pytest.mark.parametrize("name", NAMES)
def test_installed_package_of_that_name_wins(name, tmp_path):
  (tmp_path / name).mkdir()
  (tmp_path / name / "__init__.py").write_text("X = 1\n")
  (tmp_path / name / "sub.py").write_text("Y = 2\n")
  out = _run(f"import jaxlab.{name}, {name}, {name}.sub; print({name}.__file__, {name}.X, {name}.sub.Y, "
             f"jaxlab.{name}.__name__)", PYTHONPATH=str(tmp_path))
  assert out.split() == [str(tmp_path / name / "__init__.py"), "1", "2", f"jaxlab.{name}"], out


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_imports_from_the_repository_root():
  _run("from transformers import LlamaForCausalLM")
