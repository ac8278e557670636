"""benchmarks/bench_handwritten.py --quick: every case runs and every equality check passes.

The script times four hand-written pieces of the kit (the CSV reader, the bootstrap's
Threefry sampler, the radix stable order, the conv filter gradient) against the library
way; here only its smoke run at tiny sizes, in a subprocess: the JSON record must hold
every case, none raised, and each check (arrays equal, orders equal, gradients within
float32 rounding, random indices in range with the right moments) passed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Runs a benchmark script end to end: left to CI.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CSV_LIBRARIES = {"pyarrow.csv.read_csv", "pyarrow.csv.read_csv(use_threads=False)",
                 "pyarrow.csv.open_csv (streamed batches)"}
CSV_LAYOUTS = {"csv read: confidence,correct (correct)",
               "csv read: y_true,y_pred,confidence (labels)",
               "csv read: y_true,y_pred,confidence (names)"}
# --quick times the first conv layer of each kind: MNIST's 1 -> 32 (first layer), its
# 32 -> 64 (input gradient too), CIFAR-10's 3 -> 24 (odd channels padded) and 48 -> 48
# (above the channel limit: lax's filter gradient, the control).
CONV_LAYERS = {"conv mnist 28x28 1->32 value_and_grad", "conv mnist 14x14 32->64 value_and_grad",
               "conv cifar10 32x32 3->24 value_and_grad",
               "conv cifar10 16x16 48->48 value_and_grad"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("handwritten") / "handwritten.json"
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "bench_handwritten.py"), "--quick",
       "--out", str(out)],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  return proc, out


def test_quick_run_emits_every_case_and_every_check_passes(quick_run):
  proc, out = quick_run
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(proc.stdout)
  assert record == json.loads(out.read_text())  # --out: the same record
  assert record["benchmark"] == "handwritten" and record["device"] and record["jax"]
  assert record["load_average_before"] is None or len(record["load_average_before"]) == 3
  cases = record["cases"]
  assert not record["summary"]["errors"], record["summary"]["errors"]
  assert not record["summary"]["checks_failed"], record["summary"]["checks_failed"]
  for case in cases:
    assert "error" not in case, case
    assert case["check_ok"] is True, case
    if "skipped" in case:
      continue
    for field in ("what", "n", "kit", "library", "kit_min_s", "kit_median_s", "library_min_s",
                  "library_median_s", "ratio", "equal", "note"):
      assert field in case, (field, case)
    assert 0 < case["kit_min_s"] <= case["kit_median_s"]
    assert 0 < case["library_min_s"] <= case["library_median_s"]
    assert case["ratio"] == pytest.approx(case["kit_median_s"] / case["library_median_s"])
  pairs = {(c["what"], c.get("library")) for c in cases}

  # 1. CSV: every layout against each pyarrow reader, the arrays identical.
  csv = [c for c in cases if c["component"] == "csv"]
  assert {c["what"] for c in csv} == CSV_LAYOUTS
  if importlib.util.find_spec("pyarrow") is None:
    assert all("pyarrow is not installed" in c["skipped"] for c in csv)
  else:
    assert {(w, lib) for w in CSV_LAYOUTS for lib in CSV_LIBRARIES} <= pairs
    assert all(c["equal"] is True for c in csv)

  # 2. Bootstrap: different streams (not equal), both checked in range with their moments.
  boot = [c for c in cases if c["component"] == "bootstrap"]
  assert {(c["what"], c["library"]) for c in boot} == {
      ("bootstrap resample indices [B, n] int32",
       "jax.random.randint(split(key, B)) vmapped, jit"),
      ("bootstrap resample indices [B, n] int32",
       "jax.random.choice(split(key, B), replace=True) vmapped, jit"),
      ("bootstrap Poisson(1) multiplicities [B, n] int32",
       "jax.random.poisson(split(key, B), 1.0) vmapped, jit")}
  assert all("both pass their checks" in c["equal"] for c in boot)
  semantics = record["bootstrap_semantics"]
  assert semantics["kit_first_resamples_equal_a_shorter_run"] is True
  assert semantics["choice_replace_equals_randint_with_the_same_keys"] is True
  assert semantics["kit_equals_randint"] is False

  # 3. Sort: the same stable order from NumPy's argsort, sorted words and lax.sort.
  sort = [c for c in cases if c["component"] == "sort"]
  assert {c["library"] for c in sort} == {'np.argsort(c, kind="stable")',
                                          "np.sort of uint64 (key, position) words",
                                          "jax.lax.sort((c, iota), is_stable=True), jit, CPU"}
  assert all(c["equal"] is True for c in sort)

  # 4. Conv: each kind of layer, value and gradients within float32 rounding of lax's.
  conv = [c for c in cases if c["component"] == "conv"]
  assert {c["what"] for c in conv} == CONV_LAYERS
  assert all(c["equal"].startswith("within float32 rounding") for c in conv)
  custom = {c["what"]: c["kit_program_has_custom_vjp"] for c in conv}
  assert custom == {w: "48->48" not in w for w in CONV_LAYERS}
