"""Project layout and dependency rules , README/CI consistency, packaging."""

import ast
import glob
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest

from jaxlab import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imports(path):
  tree = ast.parse(open(path).read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      yield node.module
      yield from (f"{node.module}.{a.name}" for a in node.names)


def _py(folder):
  return glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)


def test_required_top_level():
  for name in ("setup.py", "README.md", ".ci/run", "jaxlab", "experiments", "kernels", "tests", "colab"):
    assert os.path.exists(os.path.join(ROOT, name)), name


def test_library_never_imports_experiments():
  for path in _py("jaxlab"):
    bad = [m for m in _imports(path) if m.startswith("jaxlab.experiments")]
    assert not bad, f"{path} imports {bad}; the library finds experiments by name (jaxlab.registry)"


def test_kernels_import_no_library_or_experiment_code():
  for path in _py("kernels"):
    bad = [m for m in _imports(path) if m.startswith("jaxlab") and not m.startswith("jaxlab.kernels")]
    assert not bad, f"{path} imports {bad}; kernels sit below the library (jaxlab.kernels <- jaxlab)"


@pytest.mark.parametrize("name", registry.names())
def test_experiment_folder_is_complete(name):
  folder = os.path.join(ROOT, "experiments", name)
  for f in ("__init__.py", "config.py", "train.py", "README.md"):
    assert os.path.exists(os.path.join(folder, f)), f"experiments/{name} has no {f}"
  exp = registry.load(name)
  assert exp.claims, f"experiments/{name}/config.py declares no CLAIMS"
  assert exp.description, f"experiments/{name}/config.py needs a module docstring (first paragraph = description)"
  assert exp.description.endswith((".", ")")) and "\n" not in exp.description, (
      f"experiments/{name}: the description (`reproduce --list`) is the docstring's first paragraph, whole "
      f"sentences: {exp.description[-60:]!r}")
  assert callable(getattr(exp.train_module, "train_and_evaluate", None))
  assert os.path.exists(os.path.join(ROOT, "colab", f"{name}.ipynb")), f"colab/{name}.ipynb is missing"
  assert os.path.exists(os.path.join(ROOT, "tests", "experiments", f"test_{name}.py"))


def test_kernel_folders_are_complete():
  for folder in sorted(glob.glob(os.path.join(ROOT, "kernels", "*", ""))):
    if os.path.basename(os.path.normpath(folder)).startswith("__"):
      continue
    for f in ("__init__.py", "reference.py", "kernel.py", "ops.py", "README.md"):
      assert os.path.exists(os.path.join(folder, f)), f"{folder} has no {f}"


def _readme():
  return open(os.path.join(ROOT, "README.md")).read()


def test_readme_quickstart_has_exactly_two_commands_and_ci_runs_the_second():
  text = _readme()
  quick = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", quick, re.S)
  commands = [ln for b in blocks for ln in b.strip().splitlines() if ln.strip() and not ln.startswith("#")]
  assert len(commands) == 2, commands
  assert "python -m jaxlab.reproduce" in commands[0]
  assert commands[1].endswith("python -m pytest")
  ci = open(os.path.join(ROOT, ".ci", "run")).read()
  assert '-m pip install --quiet -e ".[all,test]"' in ci and '/bin/python" -m pytest ' in ci


def test_readme_results_table_has_a_row_per_experiment():
  table = _readme().split("## Results", 1)[1]
  for name in registry.names():
    assert f"`{name}`" in table, f"README results table has no row for {name}"


def test_notebooks_are_valid_and_output_free():
  for path in glob.glob(os.path.join(ROOT, "colab", "*.ipynb")):
    nb = json.load(open(path))
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), path


def test_wheel_installs_one_namespace(tmp_path):
  pytest.importorskip("setuptools")
  r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                      str(tmp_path), ROOT], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  names = zipfile.ZipFile(glob.glob(str(tmp_path / "*.whl"))[0]).namelist()
  tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
  assert tops == {"jaxlab"}, tops
  for must in ("jaxlab/kernels/__init__.py", "jaxlab/experiments/quickstart/config.py",
               "jaxlab/experiments/quickstart/README.md", "jaxlab/train/loop.py"):
    assert must in names, must
