"""The benchmarks' NumPy / torch baselines against the float64 references, and the scripts' smoke runs.

The baselines of ``benchmarks/numpy_baselines.py`` are what the kit is timed
and checked against, so each must equal an independent slow reference
(``tests/reference.py``) on small data full of ties and edge values: c = 0
and 1, confidences exactly on bin edges and on thresholds. The scripts
(``bench_vs_numpy.py --quick``, ``accelerator.sh --quick``) must run and emit
valid JSON; they run in subprocesses, started together, at tiny n. The bench's
``bootstrap_sweep`` check reproduces the kit's own resamples in NumPy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _common  # noqa: E402
import numpy_baselines as nb  # noqa: E402

# Every case runs a benchmark script end to end: left to CI (./dev.sh test runs them there).
pytestmark = pytest.mark.slow

CONVENTIONS = ("step", "trapezoid", "published_code")
TOL = dict(rtol=1e-12, atol=1e-12)


def edge_data(seed: int, n: int, accuracy: float | None = None):
  """float32 confidences: half on special values (0, 1, the 15-bin edges, two-decimal ties,
  0.5..0.99 grid thresholds), half uniform; correct with probability c (or ``accuracy``)."""
  rng = np.random.default_rng(seed)
  special = np.concatenate([[0.0, 1.0, -0.0], nb.width_edges(15), nb.width_edges(10),
                            nb.default_thresholds(), np.round(rng.random(8), 2)]).astype(np.float32)
  c = np.where(rng.random(n) < 0.5, rng.choice(special, n), rng.random(n)).astype(np.float32)
  p = c if accuracy is None else accuracy
  return c, rng.random(n) < p


CASES = [edge_data(0, 300), edge_data(1, 64, accuracy=0.9), edge_data(2, 7), edge_data(3, 1),
         edge_data(4, 40, accuracy=1.0), edge_data(5, 40, accuracy=0.0)]


def assert_close(got, want, **tol):
  np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                             **(tol or TOL))


# --------------------------------------------------------------------------- binning


@pytest.mark.parametrize("num_bins", [1, 2, 3, 7, 10, 15, 100])
def test_width_bins_on_edges_and_their_neighbours(num_bins):
  edges = nb.width_edges(num_bins)
  c = np.concatenate([edges, np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(2))])
  c = np.clip(c, 0, 1).astype(np.float32)
  want = [max(b for b in range(num_bins) if edges[b] <= x) for x in c]
  np.testing.assert_array_equal(nb.width_bins(c, num_bins), want)


@pytest.mark.parametrize("thresholds", [
    np.linspace(0.5, 0.99, 50), np.linspace(0.0, 0.999, 1000), [0.0], [0.3, 0.3, 0.7],
    [0.1, 0.1000001, 0.1000002, 0.1000003, 0.1000004, 0.1000005, 0.5],  # a crowded cell: fallback
    np.linspace(0.9, 0.9001, 5),
])
def test_bucketize_counts_thresholds_at_or_below(thresholds):
  t = np.sort(np.asarray(thresholds, np.float32))
  c, _ = edge_data(6, 500)
  c = np.concatenate([c, t, np.nextafter(t, np.float32(0)), np.nextafter(t, np.float32(1))])
  c = np.clip(c, 0, 1).astype(np.float32)
  np.testing.assert_array_equal(nb.bucketize(c, t), np.searchsorted(t, c, side="right"))
  np.testing.assert_array_equal(nb.bucketize(c, t, max_steps=100), np.searchsorted(t, c, side="right"))


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("binning", ["width", "mass"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_ece_and_bins_match_reference(binning, case):
  c, ok = CASES[case]
  for num_bins in (1, 15):
    for norm in ("l1", "l2", "max"):
      want = reference.ece(c, ok, num_bins, norm, binning)
      assert_close(nb.ece(c, ok, num_bins=num_bins, norm=norm, binning=binning), want)
    assert_close(nb.ece(c, ok, num_bins=num_bins, binning=binning, gap_dtype=np.float32),
                 reference.ece(c, ok, num_bins, "l1", binning), rtol=1e-6, atol=1e-7)
    for graded in (ok, np.where(ok, 0.75, 0.125)):
      got = nb.calibration_bins(c, graded, num_bins=num_bins, binning=binning)
      for g, w in zip(got, reference.calibration_bins(c, graded, num_bins, binning)):
        assert_close(g, w)


# --------------------------------------------------------------------------- risk-coverage


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_risk_coverage_areas_match_reference(convention, case):
  c, ok = CASES[case]
  got = nb.risk_coverage_areas(c, ok, convention=convention)
  assert_close(got.aurc, reference.aurc(c, ok, convention))
  assert_close(got.augrc, reference.aurc(c, ok, convention, generalized=True))
  assert_close(got.eaurc, reference.eaurc(c, ok, convention))
  assert nb.aurc(c, ok, convention=convention) == got.aurc
  assert nb.augrc(c, ok, convention=convention) == got.augrc
  assert nb.eaurc(c, ok, convention=convention) == got.eaurc


def test_published_code_keeps_ties_in_input_order():
  c = np.array([0.5, 0.5, 0.5, 0.9], np.float32)
  for ok in ([True, False, False, True], [False, False, True, True]):
    assert_close(nb.aurc(c, ok, convention="published_code"), reference.aurc(c, ok, "published_code"))
  assert nb.aurc(c, [True, False, False, True], convention="published_code") != nb.aurc(
      c, [False, False, True, True], convention="published_code")


@pytest.mark.parametrize("case", range(len(CASES)))
def test_curve_matches_reference(case):
  c, ok = CASES[case]
  got = nb.risk_coverage_curve(c, ok)
  want = reference.risk_coverage_curve(c, ok)
  m = got.num_points
  assert m == len(want[0])
  for g, w in zip(got[:4], want):
    assert len(g) == len(c)
    assert_close(g[:m], w)
    assert np.all(g[m:] == g[m - 1])  # padded with the last point


# --------------------------------------------------------------------------- sweep family


def sweep_thresholds(c):
  """Unsorted thresholds with duplicates, 0, values equal to confidences and the default grid."""
  return np.concatenate([[0.97, 0.0, 0.5, 0.5], c[:5], nb.default_thresholds()[::7]]).clip(0, 0.999)


@pytest.mark.parametrize("normalize", ["retained", "all"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sweep_matches_reference(normalize, case):
  c, ok = CASES[case]
  th = sweep_thresholds(c).astype(np.float32)
  for kappa in (ok, np.where(ok, 0.8, 0.1)):
    want = reference.sweep(c, kappa, th, normalize)
    for bucketing in ("table", "searchsorted"):
      got = nb.sweep(c, kappa, th, normalize=normalize, bucketing=bucketing)
      assert_close(np.stack(got, -1), want)
    assert_close(np.stack(nb.sweep_per_threshold_loop(c, kappa, th, normalize=normalize), -1), want)


def test_batched_sweep_equals_loop_over_models():
  c = np.stack([edge_data(s, 200)[0] for s in range(4)])
  ok = np.stack([edge_data(s, 200)[1] for s in range(4)])
  th = np.linspace(0.5, 0.99, 50).astype(np.float32)
  want = np.stack([reference.sweep(ci, ki, th) for ci, ki in zip(c, ok)])
  assert_close(np.stack(nb.sweep(c, ok, th), -1), want)
  assert_close(np.stack(nb.sweep_loop_over_models(c, ok, th), -1), want)


@pytest.mark.parametrize("normalize", ["retained", "all"])
def test_sweep_by_group_matches_reference(normalize):
  c, ok = CASES[0]
  groups = np.random.default_rng(7).integers(0, 4, len(c))  # group 4 of 5 stays empty
  th = sweep_thresholds(c).astype(np.float32)
  got = nb.sweep_by_group(c, ok, groups, th, num_groups=5, normalize=normalize)
  want = reference.sweep_by_group(c, ok, groups, th, 5, normalize)
  assert_close(np.stack(got, -1), want)
  assert np.all(np.isnan(np.stack(got, -1)[4]))


@pytest.mark.parametrize("metric", ["cwsa", "cwsa_plus", "selective_accuracy"])
@pytest.mark.parametrize("constraints", [{}, {"min_coverage": 0.5}, {"max_risk": 0.2},
                                         {"min_coverage": 0.3, "max_risk": 0.4}])
def test_select_threshold_matches_reference(metric, constraints):
  c, ok = CASES[0]
  th = nb.default_thresholds()
  got = nb.select_threshold(c, ok, metric=metric, **constraints)
  want = reference.select_threshold(c, ok, th, metric, **constraints)
  assert got.threshold == want[0]
  assert_close(got[1:], want[1:])


# --------------------------------------------------------------------------- bootstrap


def test_bootstraps_with_given_resamples_match_reference_loops():
  c, ok = edge_data(8, 150)
  indices = np.random.default_rng(9).integers(0, len(c), (40, len(c)))
  th = np.array([0.9, 0.5, 0.7], np.float32)
  got = nb.bootstrap_sweep(c, ok, th, indices=indices)
  want = reference.bootstrap(lambda a, b: reference.sweep(a, b, th), c, ok, indices)
  for g, w in zip(got, want):
    assert_close(np.stack(g, -1), w)
  for convention in ("step", "trapezoid"):
    got = nb.bootstrap_aurc(c, ok, convention=convention, indices=indices)
    want = reference.bootstrap(lambda a, b: reference.aurc(a, b, convention), c, ok, indices)
    assert_close(got, want)
  got = nb.bootstrap_ece(c, ok, indices=indices)
  assert_close(got, reference.bootstrap(lambda a, b: reference.ece(a, b), c, ok, indices))


def test_bootstraps_draw_their_own_resamples():
  c, ok = edge_data(10, 300)
  r = nb.bootstrap_sweep(c, ok, np.array([0.5], np.float32), num_resamples=64)
  assert r.low.cwsa[0] <= r.estimate.cwsa[0] <= r.high.cwsa[0]
  a = nb.bootstrap_aurc(c, ok, num_resamples=64)
  assert a.low <= a.estimate <= a.high


# torch is not a dependency of the kit or its tests (a CPU build is a large download), so the torch
# baselines are not tested here: benchmarks/bench_vs_numpy.py checks each one against the float64
# NumPy reference before timing it and leaves out any that disagrees.


# --------------------------------------------------------------------------- the scripts


SMOKE_RUNS = {
    "bench_sweep.py": ["--quick"],
    "bench_groups.py": ["--quick"],
    "bench_bootstrap.py": ["--quick"],
    "streaming_aurc_error.py": ["--n", "20000"],
    "bench_process_merge.py": ["--n", "20000"],
    "bench_numpy_sort.py": ["--sizes", "3000", "--repeats", "1"],
    "gpu_choices.py": ["--quick", "--repeats", "1"],
    "bench_peers.py": ["--quick", "--sizes", "1000", "--repeats", "1"],
}


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
  """bench_vs_numpy.py --quick, accelerator.sh --quick and :data:`SMOKE_RUNS`, started
  together at tiny n."""
  tmp = tmp_path_factory.mktemp("bench")
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  commands = {
      "bench": [sys.executable, os.path.join(ROOT, "benchmarks", "bench_vs_numpy.py"), "--quick",
                "--only", "ece,bootstrap_sweep", "--sizes", "300", "--repeats", "1",
                "--out", str(tmp / "vs_numpy.json")],
      "accelerator": ["bash", os.path.join(ROOT, "benchmarks", "accelerator.sh"), "--quick",
                      "--only", "aurc", "--sizes", "300", "--repeats", "1",
                      "--out", str(tmp / "gpu.json")],
      # A case that outlives --case-limit-s (0 s: every case) ends the run, keeping the JSON.
      "accelerator_hang": [sys.executable, os.path.join(ROOT, "benchmarks", "accelerator.py"),
                           "--quick", "--only", "aurc", "--sizes", "300", "--repeats", "1",
                           "--case-limit-s", "0", "--out", str(tmp / "hang.json")],
  }
  # The other scripts' smoke runs: each must end by printing its JSON record.
  for name, args in SMOKE_RUNS.items():
    commands[name] = [sys.executable, os.path.join(ROOT, "benchmarks", name), *args]
  env["PYTHON"] = sys.executable
  procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=ROOT) for name, cmd in commands.items()}
  out = {}
  for name, proc in procs.items():
    stdout, stderr = proc.communicate(timeout=300)
    out[name] = (proc.returncode, stdout, stderr)
  return tmp, out


# The tests of the script runs share one worker (dev.sh: --dist loadfile; the mark does the same
# under --dist loadgroup): the fixture runs once.
_SCRIPTS = pytest.mark.xdist_group("benchmark_scripts")


@_SCRIPTS
@pytest.mark.parametrize("script", sorted(SMOKE_RUNS))
def test_benchmark_script_smoke_run_emits_its_record(script_runs, script):
  _, out = script_runs
  rc, stdout, stderr = out[script]
  assert rc == 0, stderr[-3000:]
  record = json.loads(stdout)
  assert record["benchmark"] == script.removesuffix(".py").removeprefix("bench_")
  assert record["device"] and record["jax"]
  assert set(record) - set(_common.environment()) - {"benchmark"}, record  # its own results


@_SCRIPTS
def test_gpu_choices_quick_checks_every_form_exact(script_runs):
  """On the CPU (Pallas' interpreter): every kernel form equal to the scatter path, bit for bit."""
  _, out = script_runs
  rc, stdout, stderr = out["gpu_choices.py"]
  assert rc == 0, stderr[-3000:]
  payload = json.loads(stdout)
  cases = payload["cases"]
  height = {"sweep_T10": "16", "ece_15_bins": "16", "sweep_T20": "32", "sweep_T50": "64"}
  for name in height:
    assert cases[name]["configs"] and all(c == {"exact": True} for c in cases[name]["configs"].values())
    assert cases[name]["public_equal"] is True
    # the public functions ran with the fastest exact launch of their mask height
    assert cases[name]["public_launch"] == payload["launch"][height[name]]
  from cwsa_jax._kernels import _dense
  assert {h: launch[0] in _dense.FORMS for h, launch in payload["launch"].items()} == {
      "16": True, "32": True, "64": True}
  assert cases["sweep_64_models"]["public_equal"] is True
  assert all(cases[name]["equal"] is True
             for name in ("sweep_T1000", "ece_mass", "aurc_step", "aurc_trapezoid", "eaurc_step",
                          "summary_trapezoid", "curve"))


@_SCRIPTS
def test_bench_vs_numpy_quick_emits_valid_json(script_runs):
  tmp, out = script_runs
  rc, stdout, stderr = out["bench"]
  assert rc == 0, stderr[-3000:]
  payload = json.loads(stdout)
  assert payload == json.loads((tmp / "vs_numpy.json").read_text())
  assert payload["benchmark"] == "vs_numpy" and payload["device"] and payload["jax"]
  # Which NumPy sort the run had (AVX-512 or AVX2 dispatch) changes the rank metrics' ratios.
  simd = payload["numpy_simd"]
  assert isinstance(simd["avx512_skx_dispatched"], bool) and isinstance(simd["avx2_dispatched"], bool)
  assert simd["NPY_DISABLE_CPU_FEATURES"] == os.environ.get("NPY_DISABLE_CPU_FEATURES")
  assert "cpu_model" in payload
  kernels = {(r["kernel"], r["options"].get("binning")) for r in payload["rows"]}
  assert kernels == {("ece", "width"), ("ece", "mass"), ("bootstrap_sweep", None)}
  for row in payload["rows"]:
    assert "error" not in row, row
    assert row["check"]["ok"], row  # bootstrap_sweep: the kit's own resamples, redone in NumPy
    assert row["times"]["kit"]["min_s"] > 0 and row["ratio_kit_over_best"] > 0
    assert row["load_average_before"] is not None
  assert "resamples reproduced" in payload["rows"][-1]["check"]["note"]
  assert "kit ms" in stderr


@_SCRIPTS
def test_accelerator_stops_at_a_case_that_outlives_its_limit(script_runs):
  tmp, out = script_runs
  rc, _, stderr = out["accelerator_hang"]
  assert rc == 3, stderr[-3000:]
  payload = json.loads((tmp / "hang.json").read_text())
  assert payload["benchmark"] == "accelerator" and payload["rows"] == []
  assert [s["kernel"] for s in payload["skipped"]] == ["aurc"]
  assert "still running after 0 s" in payload["skipped"][0]["reason"]
  assert "the run stopped here" in stderr


@_SCRIPTS
def test_accelerator_quick_emits_valid_json(script_runs):
  tmp, out = script_runs
  rc, stdout, stderr = out["accelerator"]
  assert rc == 0, stderr[-3000:]
  payload = json.loads(stdout)
  assert payload == json.loads((tmp / "gpu.json").read_text())
  assert payload["benchmark"] == "accelerator" and payload["device_kind"] is not None
  assert payload["spec_memory_bandwidth_bytes_per_s"] is None  # a CPU is not in the table
  rows = payload["rows"]
  assert rows and all("error" not in r and r["check"]["ok"] for r in rows), rows
  aurc = [r for r in rows if r["kernel"] == "aurc"]
  assert aurc and all(r["ratio_kit_over_lax_sort"] > 0 for r in aurc)
  assert all(r["bytes_read"] == 5 * r["n"] for r in rows)
  assert "aurc_over_lax_sort" in payload["goals"]


def test_accelerator_bandwidth_table():
  import accelerator
  assert accelerator.spec_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
  assert accelerator.spec_bandwidth("NVIDIA H200") == 4.8e12
  assert accelerator.spec_bandwidth("NVIDIA GH200 480GB") == 4.0e12
  assert accelerator.spec_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12
  assert accelerator.spec_bandwidth("NVIDIA L40S") == 0.864e12
  assert accelerator.spec_bandwidth("cpu") is None


def test_bench_evaluate_runs_evaluate_and_compare_on_csv_and_parquet(tmp_path):
  pytest.importorskip("pyarrow")
  out = tmp_path / "evaluate.json"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_evaluate.py"),
                         "--rows", "2000", "--bootstrap", "200", "--out", str(out)],
                        capture_output=True, text=True, cwd=ROOT, timeout=300,
                        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  payload = json.loads(proc.stdout)
  assert payload == json.loads(out.read_text())
  assert [(r["command"], r["format"]) for r in payload["rows"]] == [
      ("evaluate", "csv"), ("compare", "csv"), ("evaluate", "parquet"), ("compare", "parquet")]
  assert {r["rows"] for r in payload["rows"]} == {2000}
  for row in payload["rows"]:
    assert row["exit"] == 0, row
    assert row["wall_s"] > 0 and row["peak_rss_mb"] > 50 and row["file_mb"] > 0


def test_bench_evaluate_cache_compare_runs_off_cold_and_warm(tmp_path):
  """``--cache-compare``: the cache off writes nothing; the cold run fills its folder and the warm
  run, reading it, adds no program to it."""
  out = tmp_path / "cache.json"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_evaluate.py"),
                         "--rows", "2000", "--formats", "csv", "--commands", "compare",
                         "--bootstrap", "200", "--cache-compare", "--out", str(out)],
                        capture_output=True, text=True, cwd=ROOT, timeout=300,
                        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(out.read_text())["rows"]
  assert [r["compilation_cache"] for r in rows] == ["off", "cold", "warm"]
  assert all(r["exit"] == 0 and r["wall_s"] > 0 for r in rows), rows
  off, cold, warm = (r["cache_files"] for r in rows)
  assert off == 0 and cold > 0 and warm == cold


def test_train_steps_summary_takes_the_true_median_of_even_rounds():
  import bench_train_steps  # noqa: PLC0415 (benchmarks/ is on the path above)
  rows = [{"variant": v, "steps_per_s": r} for v, r in
          [("old", 4.0), ("old", 5.0), ("default", 8.0), ("default", 11.0), ("devices=1", 6.0)]]
  summary = bench_train_steps.summarize(rows, ["old", "default", "devices=1"])
  assert summary["old"] == {"min": 4.0, "median": 4.5, "max": 5.0}
  assert summary["default"]["median"] == 9.5
  assert summary["default"]["median_vs_old"] == round(9.5 / 4.5, 3)
  assert summary["devices=1"]["median_vs_old"] == round(6.0 / 4.5, 3)
  without_old = bench_train_steps.summarize(rows[2:], ["default", "devices=1"])
  assert "median_vs_old" not in without_old["default"]


def test_accelerator_times_the_fused_counts_beside_small_sweeps():
  import accelerator
  import bench_vs_numpy
  d = bench_vs_numpy.Data(500, use_torch=False)
  t = bench_vs_numpy.thresholds(10)
  n_kept, n_correct = accelerator.fused_counts()(d.jc, d.jok, t)
  kept = d.c[:, None] >= t[None, :]
  np.testing.assert_array_equal(n_kept, kept.sum(0))
  np.testing.assert_array_equal(n_correct, (kept & d.ok[:, None]).sum(0))
  (case,) = [c for c in bench_vs_numpy.sweep_cases(d, False)
             if c.kernel == "sweep" and c.options == {"T": 10, "normalize": "retained"}]
  row = accelerator.run_case(case, d, repeats=1, check=False, rtol=1e-6, atol=1e-7, spec=None,
                             floor_bytes_per_s=None, sort_fn=None,
                             counts_fn=accelerator.fused_counts())
  assert "error" not in row, row
  assert set(row["times"]) == {"kit", "fused_compare_counts"}
  assert row["ratio_kit_over_fused_counts"] > 0


def test_suite_compile_time_records_and_sums_the_workers(tmp_path, monkeypatch, capsys):
  import suite_compile_time as sct  # noqa: PLC0415 (benchmarks/ is on the path above)
  monkeypatch.setattr(sct, "_EVENTS", sct.collections.defaultdict(lambda: [0.0, 0]))
  monkeypatch.setenv(sct._ENV, str(tmp_path / "stats"))
  monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
  sct._listener(sct.COMPILING[2], 1.5)
  sct._listener(sct.COMPILING[2], 0.5)
  sct.pytest_sessionfinish(None, 0)
  (path,) = (tmp_path / "stats").iterdir()
  record = json.loads(path.read_text())
  assert record["worker"] == "gw0" and record["cpu_s"] > 0
  assert record["events"][sct.COMPILING[2]] == {"seconds": 2.0, "count": 2}
  path.write_text(json.dumps(dict(record, cpu_s=8.0)))  # a file of that name is left alone
  sct.pytest_sessionfinish(None, 0)
  assert json.loads(path.read_text())["cpu_s"] == 8.0
  # The controller's CPU (its children are the workers) is not added to the workers'.
  (tmp_path / "stats" / "1.json").write_text(json.dumps(
      {"worker": None, "cpu_s": 100.0, "children_cpu_s": 50.0, "events": {}}))
  assert sct.main([str(tmp_path / "stats")]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary["processes"] == 1 and summary["cpu_s"] == 8.0
  assert summary["compiling_s"] == 2.0 and summary["compiling_share"] == 0.25
  assert sct.main([str(tmp_path / "empty")]) == 2
