"""docs/performance.md is generated from results/benchmarks/*.json, never edited by hand.

``benchmarks/performance_doc.py --check`` must find the committed page equal to
the page it generates from the committed records: after a benchmark writes a
new record (or the script's templates change), rerun
``python benchmarks/performance_doc.py`` and commit the page with it. The other
tests show the check can fail: a changed number in a copy of the records
changes the generated page, and the templates hold no numbers of their own.
Standard library only; no JAX.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "performance_doc.py"
RESULTS = ROOT / "results" / "benchmarks"
PAGE = ROOT / "docs" / "performance.md"


def _module():
  spec = importlib.util.spec_from_file_location("performance_doc", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)


def test_committed_page_is_the_generated_page():
  proc = _run("--check")
  assert proc.returncode == 0, (
      "docs/performance.md differs from what benchmarks/performance_doc.py generates from "
      "results/benchmarks/; run `python benchmarks/performance_doc.py` and commit the page:\n"
      + proc.stdout[-6000:] + proc.stderr[-2000:])


def test_a_changed_record_changes_the_page(tmp_path):
  results = tmp_path / "results"
  shutil.copytree(RESULTS, results)
  before = _module().render(results)

  # One number of one record: the first kernel row's ratio in vs_numpy.json.
  path = results / "vs_numpy.json"
  record = json.loads(path.read_text(encoding="utf-8"))
  record["rows"][0]["ratio_kit_over_best"] = 9.87654
  path.write_text(json.dumps(record, indent=1), encoding="utf-8")

  out = tmp_path / "page.md"
  proc = _run("--results", str(results), "--out", str(out))
  assert proc.returncode == 0, proc.stderr
  after = out.read_text(encoding="utf-8")
  assert "9.88" not in before
  changed = [line for line in after.splitlines() if line not in before.splitlines()]
  assert changed and all("9.88" in line for line in changed), changed
  # Written atomically: no temporary file is left beside the page.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md", "results"]

  # --check sees the difference, shows it, and writes nothing.
  out.write_text(before, encoding="utf-8")
  proc = _run("--results", str(results), "--out", str(out), "--check")
  assert proc.returncode == 1
  assert "+" in proc.stdout and "9.88" in proc.stdout
  assert out.read_text(encoding="utf-8") == before


def test_templates_hold_no_numbers():
  """Every number on the page comes from a record: the prose templates hold none of their own
  (digits only inside code spans and in names such as int32 or AVX-512)."""
  module = _module()
  for name, template in module.TEXT.items():
    text = re.sub(r"```.*?```", "", template, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\{[a-z_0-9]*\}", "", text)
    for allowed in module.ALLOWED_WITH_DIGITS:
      text = text.replace(allowed, "")
    digits = re.findall(r"\S*\d\S*", text)
    assert not digits, f"TEXT[{name!r}] holds numbers {digits}: read them from a record instead"


def test_peers_record_adds_its_section_only_when_present(tmp_path):
  """results/benchmarks/peers.json (benchmarks/bench_peers.py) shows as a table of kit / peer rows;
  without it the page has no such section."""
  module = _module()
  results = tmp_path / "results"
  shutil.copytree(RESULTS, results)
  (results / "peers.json").unlink(missing_ok=True)
  heading = "### Beside scikit-learn, relplot and torch"
  assert heading not in module.render(results)

  record = {
      "benchmark": "peers", "device": "cpu:cpu", "cpu_count": 2, "jax": "0.0.0",
      "peers": {"scikit-learn": "9.9.9", "relplot": "1.0.3", "torch": "not installed",
                "torchmetrics": "not installed"},
      "settings": {"repeats": 5, "tolerances": {"ranking_and_classwise_ece": 1e-6,
                                                "smooth_ece_vs_relplot": 1e-3},
                   "data": {"distinct": "uniform"}},
      "rows": [
          {"metric": "auroc", "options": {}, "data": "distinct", "n": 10000,
           "kit": {"value": 0.7, "first_call_s": 1.5, "min_s": 0.002},
           "peers": {"sklearn.roc_auc_score": {"value": 0.7, "abs_diff": 3.2e-8, "ok": True,
                                               "tol": 1e-6, "min_s": 0.008,
                                               "ratio_kit_over_peer": 0.25}}},
          {"metric": "smooth_ece", "options": {"bandwidth": "auto"}, "data": "distinct",
           "n": 10000000, "kit": {"value": 0.01, "first_call_s": 2.0, "min_s": 0.5},
           "peers": {"relplot.smECE": {"skipped": "too slow"}}},
      ],
  }
  (results / "peers.json").write_text(json.dumps(record), encoding="utf-8")
  page = module.render(results)
  assert heading in page
  assert ("| `auroc` | `distinct` | 1e4 | `sklearn.roc_auc_score` | 2.00 | 8.00 | 0.25 | 3.2e-8 | 1.50 |"
          in page)
  assert "| `smooth_ece(bandwidth=auto)` | `distinct` | 1e7 | `relplot.smECE` | 500 | skipped |" in page
  assert "`relplot.smECE` skipped at n = 1e7 (`distinct`): too slow." in page
  assert "scikit-learn (9.9.9)" in page
  assert "| `peers.json` | `peers` | `cpu:cpu` | Beside scikit-learn, relplot and torch |" in page
