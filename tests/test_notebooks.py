"""Every colab/*.ipynb runs top to bottom (code cells, JAXLAB_SMOKE=1), quickstart first."""

import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")),
                   key=lambda p: (os.path.basename(p) != "quickstart.ipynb", p))


def notebook_script(path: str) -> str:
  """The notebook's code cells joined into one script (IPython magics and shell lines dropped)."""
  cells = json.load(open(path))["cells"]
  lines = []
  for cell in cells:
    if cell["cell_type"] != "code":
      continue
    src = "".join(cell["source"])
    lines += [ln for ln in src.splitlines() if not ln.lstrip().startswith(("!", "%"))]
    lines.append("")
  return "\n".join(lines)


def test_quickstart_notebook_exists_and_has_no_outputs():
  assert NOTEBOOKS and os.path.basename(NOTEBOOKS[0]) == "quickstart.ipynb"
  for path in NOTEBOOKS:
    for cell in json.load(open(path))["cells"]:
      assert not cell.get("outputs"), f"{path} was committed with outputs; clear them"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path):
  script = tmp_path / "nb.py"
  script.write_text(notebook_script(path))
  env = dict(os.environ, JAXLAB_SMOKE="1", MPLBACKEND="Agg")
  r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                     timeout=1200)
  assert r.returncode == 0, r.stderr[-3000:]
