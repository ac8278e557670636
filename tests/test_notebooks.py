"""The notebooks execute top to bottom (with small sizes) and produce their figures.

Each notebook has one cell tagged ``parameters`` holding its sizes; the test
replaces it with smaller values, runs the notebook in a ``python3`` kernel
(the interpreter running pytest, i.e. the project's venv) and checks the
outputs.
"""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"

SMALL_SIZES = {
    "quickstart.ipynb": {"NUM_SAMPLES": 300, "NUM_SEEDS": 8},
    "soft_cwsa.ipynb": {"NUM_SAMPLES": 300, "NUM_TRAIN": 400, "TRAIN_STEPS": 20},
}
# Outputs each notebook must produce: (number of figures, texts that must appear).
EXPECTED = {
    "quickstart.ipynb": (5, ["max |vmap(cwsa) - sweep| = 0.0", "max |nested vmap - batched| = 0.0",
                             "metrics.json", "AUMCC(CWSA)"]),
    "soft_cwsa.ipynb": (4, ["hard gradient: zero for every prediction below tau? True",
                            "soft gradient: non-zero below tau? True", "cross-entropy + soft CWSA"]),
}


def _parameter_cell(nb):
  cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(cells) == 1, "exactly one cell must be tagged 'parameters'"
  return cells[0]


@pytest.mark.slow  # a kernel start and a fresh JAX compile per notebook: about 30 s each
@pytest.mark.parametrize("name", sorted(SMALL_SIZES))
def test_notebook_executes(name, tmp_path):
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  cell = _parameter_cell(nb)
  defined = {line.split("=")[0].strip() for line in cell.source.splitlines()
             if "=" in line and not line.lstrip().startswith("#")}
  assert defined == set(SMALL_SIZES[name]), "the test overrides every size the notebook defines"
  cell.source = "\n".join(f"{k} = {v}" for k, v in SMALL_SIZES[name].items())
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  texts, figures = [], 0
  for c in nb.cells:
    if c.cell_type != "code":
      continue
    assert c.get("execution_count"), "every code cell ran"
    for out in c.get("outputs", []):
      assert out.get("output_type") != "error"
      if out.get("output_type") == "stream":
        texts.append(out["text"])
      data = out.get("data", {})
      figures += "image/png" in data
      texts.append(data.get("text/plain", ""))
  num_figures, snippets = EXPECTED[name]
  assert figures == num_figures
  joined = "\n".join(texts)
  for snippet in snippets:
    assert snippet in joined
  assert "Traceback" not in joined
