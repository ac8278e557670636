"""``cwsa-jax demo`` / ``evaluate`` / ``reproduce-paper`` end to end, and every bad input."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
import cwsa_jax as cw
from cwsa_jax import cli, synthetic

N = 300  # one sample size for every evaluate run: one compilation


# --------------------------------------------------------------------------
# Independent float64 references
# --------------------------------------------------------------------------


def ref_ece(c, ok, num_bins=15):
  c = np.asarray(c, np.float64)
  ok = np.asarray(ok, np.float64)
  index = np.minimum((c * num_bins).astype(int), num_bins - 1)  # last bin closed: 1.0 counts
  total = 0.0
  for b in range(num_bins):
    m = index == b
    if m.any():
      total += m.sum() / c.size * abs(c[m].mean() - ok[m].mean())
  return total


def ref_risks(c, ok):
  """Selective risks E_k / k and generalized risks E_k / n at k = 1..n (distinct confidences)."""
  order = np.argsort(-np.asarray(c, np.float64), kind="stable")
  errors = np.cumsum(~np.asarray(ok)[order])
  k = np.arange(1, len(order) + 1)
  return errors / k, errors / len(order)


def ref_aurc_step(c, ok):
  return ref_risks(c, ok)[0].mean()


def ref_eaurc_step(c, ok):
  ok = np.asarray(ok)
  n, wrong = ok.size, int((~ok).sum())
  k = np.arange(1, n + 1)
  oracle = (np.maximum(k - (n - wrong), 0) / k).mean()
  return ref_aurc_step(c, ok) - oracle


def ref_aumcc(sweep_rows, metric_col):
  coverage, values = sweep_rows[:, 0], sweep_rows[:, metric_col]
  total = 0.0
  for t in range(len(coverage) - 1):
    if coverage[t] > 0 and coverage[t + 1] > 0:
      total += (coverage[t] - coverage[t + 1]) * (values[t] + values[t + 1]) / 2
  return total


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
  s = synthetic.overconfident(jax.random.key(0), num_samples=N)
  return synthetic.SyntheticPredictions(*(np.asarray(x) for x in s))


def write_csv(path, header, rows):
  with open(path, "w") as f:
    f.write(header + "\n")
    for row in rows:
      f.write(",".join(str(x) for x in row) + "\n")
  return path


@pytest.fixture()
def csv_file(tmp_path, model):
  rows = zip(model.labels, model.predictions, [repr(float(c)) for c in model.confidences])
  return write_csv(tmp_path / "preds.csv", "y_true,y_pred,confidence", rows)


def run_ok(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return captured.out


def load(out_dir):
  with open(out_dir / "metrics.json") as f:
    return json.load(f)


def check_bad(tmp_path, capsys, argv, *fragments):
  """Exit 2, one line on stderr containing ``fragments``, no traceback, nothing written."""
  out = tmp_path / "out"
  before = sorted(p.name for p in tmp_path.iterdir())
  code = cli.main([str(a) for a in argv] + ["--out", str(out)])
  captured = capsys.readouterr()
  assert code == 2
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1, captured.err
  assert "Traceback" not in captured.err
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  assert not out.exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary directory left
  return lines[0]


# --------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------


def test_evaluate_csv_matches_references(tmp_path, capsys, csv_file, model):
  out = tmp_path / "eval"
  stdout = run_ok(["evaluate", csv_file, "--out", out], capsys)
  assert "ECE" in stdout and "CWSA" in stdout
  m = load(out)
  c, ok = model.confidences, model.correct
  assert m["n"] == N
  assert m["accuracy"] == pytest.approx(ok.mean(), abs=1e-6)
  assert m["ece"] == pytest.approx(ref_ece(c, ok), abs=2e-6)
  assert m["aurc"] == pytest.approx(ref_aurc_step(c, ok), abs=2e-6)
  assert m["augrc"] == pytest.approx(ref_risks(c, ok)[1].mean(), abs=2e-6)
  assert m["eaurc"] == pytest.approx(ref_eaurc_step(c, ok), abs=2e-6)
  tau = np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)
  np.testing.assert_allclose(m["sweep"]["thresholds"], tau, atol=1e-6)
  want = reference.sweep(c, ok, tau)
  got = np.array([m["sweep"][k] for k in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus")],
                 dtype=np.float64).T
  np.testing.assert_allclose(got, want, atol=2e-6)
  assert m["aumcc"]["cwsa"] == pytest.approx(ref_aumcc(want, 2), abs=1e-5)
  assert m["aumcc"]["selective_accuracy"] == pytest.approx(ref_aumcc(want, 1), abs=1e-5)
  assert m["settings"]["ece"] == {"num_bins": 15, "binning": "width", "norm": "l1"}
  assert m["settings"]["aurc_convention"] == "step"
  assert m["settings"]["cwsa_normalize"] == "retained"
  assert "brier" not in m
  for name in ("report.md", "threshold_curves.png", "reliability_diagram.png", "risk_coverage.png"):
    assert (out / name).is_file()
  report = (out / "report.md").read_text()
  assert "## Summary" in report and "](threshold_curves.png)" in report


@pytest.mark.slow
def test_evaluate_all_formats_agree(tmp_path, capsys, csv_file, model):
  probs = np.asarray(synthetic.to_probs(model))
  logits = np.log(probs) + 3.0
  np.savez(tmp_path / "probs.npz", probs=probs, labels=model.labels)
  np.savez(tmp_path / "logits.npz", logits=logits, labels=model.labels)
  np.savez(tmp_path / "conf.npz", confidences=model.confidences, correct=model.correct)
  np.save(tmp_path / "scores.npy", probs)
  np.save(tmp_path / "labels.npy", model.labels)
  write_csv(tmp_path / "cc.csv", "confidence,correct",
            zip([repr(float(c)) for c in model.confidences], model.correct.astype(int)))
  runs = {
      "csv": [csv_file],
      "csv_correct": [tmp_path / "cc.csv"],
      "probs": [tmp_path / "probs.npz"],
      "logits": [tmp_path / "logits.npz"],
      "conf": [tmp_path / "conf.npz"],
      "npy": [tmp_path / "scores.npy", "--labels", tmp_path / "labels.npy"],
  }
  results = {}
  for name, args in runs.items():
    out = tmp_path / f"out-{name}"
    run_ok(["evaluate", *args, "--out", out, "--no-figures"], capsys)
    results[name] = load(out)
    assert not list(out.glob("*.png"))
  base = results["csv"]
  for name, m in results.items():
    for key in ("accuracy", "ece", "aurc", "eaurc", "augrc"):
      assert m[key] == pytest.approx(base[key], abs=1e-5), (name, key)
    np.testing.assert_allclose(np.array(m["sweep"]["cwsa"], float),
                               np.array(base["sweep"]["cwsa"], float), atol=1e-5)
  # Full probability vectors also give the proper scoring rules.
  p_true = probs[np.arange(N), model.labels]
  assert results["probs"]["nll"] == pytest.approx(-np.log(p_true).mean(), rel=1e-5)
  assert results["probs"]["brier"] == pytest.approx(
      ((probs - np.eye(3)[model.labels]) ** 2).sum(1).mean(), rel=1e-5)
  assert results["logits"]["nll"] == pytest.approx(results["probs"]["nll"], rel=1e-4)


def test_evaluate_flags(tmp_path, capsys, csv_file, model):
  # Every run uses 20 thresholds and 10 bins: the same compiled functions; no intervals
  # (each option set compiles its own bootstrap; the interval flags are tested below).
  run_ok(["evaluate", csv_file, "--out", tmp_path / "a", "--no-figures", "--bootstrap", "0",
          "--normalize", "all", "--thresholds", "0.5:0.975:0.025", "--bins", "10",
          "--aurc", "trapezoid"], capsys)
  m = load(tmp_path / "a")
  tau = np.round(0.5 + 0.025 * np.arange(20), 3).astype(np.float32)
  np.testing.assert_allclose(m["sweep"]["thresholds"], tau, atol=1e-6)
  want = reference.sweep(model.confidences, model.correct, tau, "all")
  np.testing.assert_allclose(np.array(m["sweep"]["cwsa"], float), want[:, 2], atol=2e-6)
  assert m["ece"] == pytest.approx(ref_ece(model.confidences, model.correct, 10), abs=2e-6)
  assert m["settings"]["aurc_convention"] == "trapezoid"
  assert m["settings"]["cwsa_normalize"] == "all"

  run_ok(["evaluate", csv_file, "--out", tmp_path / "b", "--no-figures", "--bootstrap", "0",
          "--published-code"], capsys)
  m = load(tmp_path / "b")
  np.testing.assert_allclose(m["sweep"]["thresholds"], np.linspace(0.5, 0.99, 20), atol=1e-6)
  assert m["settings"]["ece"]["num_bins"] == 10
  assert m["settings"]["aurc_convention"] == "published_code"
  assert m["settings"]["cwsa_normalize"] == "all"
  # Published AURC: trapezoid over the points k = 1..n of E_k / k.
  risks = ref_risks(model.confidences, model.correct)[0]
  k = np.arange(1, N + 1) / N
  assert m["aurc"] == pytest.approx(np.sum((risks[1:] + risks[:-1]) / 2 * np.diff(k)), abs=2e-6)

  run_ok(["evaluate", csv_file, "--out", tmp_path / "c", "--no-figures", "--bootstrap", "0",
          "--published-code", "--normalize", "retained", "--thresholds", "linspace:0.4:0.9:20"],
         capsys)
  m = load(tmp_path / "c")
  assert m["settings"]["cwsa_normalize"] == "retained"  # explicit flags override the preset
  np.testing.assert_allclose(m["sweep"]["thresholds"], np.linspace(0.4, 0.9, 20), atol=1e-6)


def test_evaluate_refuses_an_existing_output_directory(tmp_path, capsys, csv_file):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("earlier results")
  code = cli.main(["evaluate", str(csv_file), "--out", str(out), "--no-figures"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert "already exists" in err and "--force" in err
  assert (out / "keep.txt").read_text() == "earlier results"
  # --force replaces only a folder of cwsa-jax's own: keep.txt is not (tests/test_output_safety.py).
  code = cli.main(["evaluate", str(csv_file), "--out", str(out), "--no-figures", "--force"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1 and "keep.txt" in err
  assert (out / "keep.txt").read_text() == "earlier results"
  (out / "keep.txt").unlink()
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures"], capsys)  # empty: no --force needed
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--force"], capsys)
  assert (out / "metrics.json").is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "preds.csv"]


def test_evaluate_default_output_directory_is_fresh(tmp_path, capsys, csv_file, monkeypatch):
  monkeypatch.chdir(tmp_path)
  run_ok(["evaluate", csv_file, "--no-figures"], capsys)
  out = run_ok(["evaluate", csv_file, "--no-figures"], capsys)
  assert (tmp_path / "cwsa-evaluate" / "metrics.json").is_file()
  assert (tmp_path / "cwsa-evaluate-2" / "metrics.json").is_file()
  assert "cwsa-evaluate-2" in out


# --------------------------------------------------------------------------
# Bad input: one line naming the file and the problem, exit 2, nothing written
# --------------------------------------------------------------------------


def test_missing_file(tmp_path, capsys):
  check_bad(tmp_path, capsys, ["evaluate", tmp_path / "nope.csv"], "nope.csv", "not found")


def test_unknown_extension(tmp_path, capsys):
  path = tmp_path / "preds.txt"
  path.write_text("y_true,y_pred,confidence\n0,0,0.9\n")
  check_bad(tmp_path, capsys, ["evaluate", path], "preds.txt", "unknown file type")


@pytest.mark.parametrize("header, rows, fragments", [
    ("y_true,confidence", [(0, 0.9)], ["missing column", "y_pred"]),
    ("a,b,c", [(0, 0, 0.9)], ["missing column", "y_true,y_pred,confidence"]),
    ("y_true,y_pred,confidence", [(0, 0, 0.9), (1, 2, "high")], ["line 3", "'high'", "not a number"]),
    ("y_true,y_pred,confidence", [(0, 0, 0.9), ("cat", 2, 0.5)], ["line 3", "y_true", "not a number"]),
    ("y_true,y_pred,confidence", [(0, 0, 0.9), (1, 1, 1.5)], ["line 3", "outside [0, 1]"]),
    ("y_true,y_pred,confidence", [(0, 0, -0.2)], ["line 2", "outside [0, 1]"]),
    ("y_true,y_pred,confidence", [(0, 0, "nan")], ["line 2", "not a finite number"]),
    ("y_true,y_pred,confidence", [(0, 0, 0.9), (1, 0.9)], ["line 3", "2 field(s)", "header has 3"]),
    ("y_true,y_pred,confidence", [(0, "", 0.9)], ["line 2", "empty y_pred"]),
    ("y_true,y_pred,confidence", [(0.5, 1, 0.9)], ["line 2", "not an integer"]),
    ("confidence,correct", [(0.9, "maybe")], ["line 2", "0/1 or true/false"]),
    ("y_true,y_pred,confidence", [], ["no data rows"]),
])
def test_bad_csv(tmp_path, capsys, header, rows, fragments):
  path = write_csv(tmp_path / "bad.csv", header, rows)
  check_bad(tmp_path, capsys, ["evaluate", path], "bad.csv", *fragments)


def test_empty_csv(tmp_path, capsys):
  path = tmp_path / "empty.csv"
  path.write_text("")
  check_bad(tmp_path, capsys, ["evaluate", path], "empty.csv", "empty file")


def test_binary_file_with_csv_extension(tmp_path, capsys):
  path = tmp_path / "bin.csv"
  path.write_bytes(b"\xff\xfe\x00\x81" * 10)
  check_bad(tmp_path, capsys, ["evaluate", path], "bin.csv")


@pytest.mark.parametrize("arrays, fragments", [
    (dict(probs=np.full((4, 2), 0.5), labels=np.zeros(3, int)), ["4 rows", "labels have 3"]),
    (dict(probs=np.full((4, 2), 0.5)), ["expected the keys", "found probs"]),
    (dict(probs=np.full((4, 2), 0.7), labels=np.zeros(4, int)), ["sum to 1", "--scores logits"]),
    (dict(probs=np.full((4, 2), 0.5), labels=np.array([0, 1, 2, 0])), ["labels", "[0, 2)"]),
    (dict(probs=np.full(4, 0.5), labels=np.zeros(4, int)), ["shape [n, num_classes]"]),
    (dict(logits=np.array([[0.0, np.nan]]), labels=np.zeros(1, int)), ["NaN"]),
    (dict(confidences=np.array([0.5, 1.2]), correct=np.array([1, 0])), ["outside [0, 1]"]),
    (dict(confidences=np.array([0.5, 0.7]), correct=np.array([1, 0, 1])), ["2 entries", "correct has 3"]),
])
def test_bad_npz(tmp_path, capsys, arrays, fragments):
  path = tmp_path / "bad.npz"
  np.savez(path, **arrays)
  check_bad(tmp_path, capsys, ["evaluate", path], "bad.npz", *fragments)


def test_corrupt_npz(tmp_path, capsys):
  path = tmp_path / "corrupt.npz"
  path.write_bytes(b"not a zip archive at all")
  check_bad(tmp_path, capsys, ["evaluate", path], "corrupt.npz")


def test_npy_needs_labels_and_matching_lengths(tmp_path, capsys):
  np.save(tmp_path / "s.npy", np.full((5, 2), 0.5))
  np.save(tmp_path / "l.npy", np.zeros(4, int))
  check_bad(tmp_path, capsys, ["evaluate", tmp_path / "s.npy"], "s.npy", "--labels")
  check_bad(tmp_path, capsys, ["evaluate", tmp_path / "s.npy", "--labels", tmp_path / "l.npy"],
            "s.npy", "5 rows", "labels have 4")
  check_bad(tmp_path, capsys, ["evaluate", tmp_path / "s.npy", "--labels", tmp_path / "x.npy"],
            "x.npy", "not found")


@pytest.mark.parametrize("flags, fragments", [
    (["--thresholds", "0.5:1.2:0.1"], ["--thresholds", "[0, 1)"]),
    (["--thresholds", "abc"], ["--thresholds", "expected"]),
    (["--bins", "0"], ["--bins"]),
])
def test_bad_flags(tmp_path, capsys, csv_file, flags, fragments):
  check_bad(tmp_path, capsys, ["evaluate", csv_file, *flags], *fragments)


def test_console_entry_point_prints_one_line_without_traceback(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "cwsa_jax.cli", "evaluate", str(tmp_path / "x.csv"),
                         "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                        timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"cwsa-jax evaluate: error: {tmp_path / 'x.csv'}: file not found"]
  assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------
# demo and reproduce-paper
# --------------------------------------------------------------------------


@pytest.mark.slow  # the whole demo
def test_demo_end_to_end(tmp_path, capsys):
  out = tmp_path / "demo"
  stdout = run_ok(["demo", "--out", out, "--seeds", "3", "--n", "400"], capsys)
  for model in synthetic.MODELS:
    assert model in stdout
  m = load(out)
  assert set(m["models"]) == set(synthetic.MODELS)
  assert m["config"] == {"seed": 0, "seeds": 3, "n": 400, "num_classes": 3}
  perfect, random, calibrated = (m["models"][k] for k in ("perfect", "random", "calibrated"))
  assert perfect["accuracy"]["mean"] == 1.0 and perfect["ece"]["mean"] == 0.0
  assert perfect["sweep"]["cwsa"]["mean"] == [1.0] * 50
  assert all(v < 0 for v in random["sweep"]["cwsa"]["mean"])
  assert 0.85 < calibrated["accuracy"]["mean"] < 1.0
  assert len(calibrated["sweep"]["cwsa"]["std"]) == 50
  noise = m["stress_tests"]["label_noise"]
  accuracy = [r["accuracy"]["mean"] for r in noise["results"]]
  assert noise["values"] == [0.0, 0.1, 0.2, 0.3, 0.4]
  assert all(a > b for a, b in zip(accuracy, accuracy[1:]))
  report = (out / "report.md").read_text()
  assert "## Summary" in report and "## Stress tests" in report
  figures = sorted(p.name for p in out.glob("*.png"))
  assert figures == sorted(["comparison.png", "reliability.png", "risk_coverage.png",
                            "stress_tests.png"] + [f"curves_{k}.png" for k in synthetic.MODELS])
  for name in figures:
    assert f"]({name})" in report
  # A second run into the same directory is refused, then allowed with --force.
  code = cli.main(["demo", "--out", str(out), "--seeds", "3", "--n", "400"])
  err = capsys.readouterr().err
  assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
  run_ok(["demo", "--out", out, "--seeds", "3", "--n", "400", "--force", "--no-figures"], capsys)
  assert not list(out.glob("*.png"))


def test_demo_default_output_directory(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  run_ok(["demo", "--seeds", "3", "--n", "400", "--no-figures"], capsys)
  stdout = run_ok(["demo", "--seeds", "3", "--n", "400", "--no-figures"], capsys)
  assert (tmp_path / "cwsa-demo" / "report.md").is_file()
  assert (tmp_path / "cwsa-demo-2" / "report.md").is_file()
  assert "cwsa-demo-2" in stdout


@pytest.mark.slow  # the whole reproduce-paper command
def test_reproduce_paper_end_to_end(tmp_path, capsys):
  out = tmp_path / "rep"
  stdout = run_ok(["reproduce-paper", "--out", out, "--seeds", "40"], capsys)
  assert "entries reproduced" in stdout
  m = load(out)
  assert set(m["tables"]) == {"calibrated", "overconfident", "random"}
  random_rows = m["tables"]["random"]["rows"]
  assert [r["grid_index"] for r in random_rows] == [0, 4, 6, 11, 15, 18, 19]
  assert random_rows[0]["cwsa"]["retained"]["published"] == -0.11
  # The published CWSA column is the code's coverage x CWSA: the "all" variant matches it ...
  assert sum(r["cwsa"]["all"]["reproduced"] for r in random_rows) >= 6
  # ... and the paper's own definition does not at the middle rows.
  assert not random_rows[3]["cwsa"]["retained"]["reproduced"]
  calibrated = m["tables"]["calibrated"]["rows"]
  assert calibrated[0]["cwsa"]["retained"]["reproduced"]  # tau = 0.50 matches
  assert not calibrated[1]["coverage"]["reproduced"]      # 0.882 is impossible
  assert calibrated[4]["selective_accuracy"]["mean"] == 1.0  # nothing wrong above 0.7
  claims = {(c["model"], c["claim"]): c for c in m["claims"]}
  assert claims[("calibrated", "ECE")]["reproduced"]
  assert not claims[("underconfident", "ECE")]["reproduced"]
  assert claims[("underconfident", "ECE")]["retained"]["mean"] == pytest.approx(0.433, abs=0.01)
  report = (out / "report.md").read_text()
  assert "cannot come from the published generator" in report
  assert "0.487 would need" in report
  assert sorted(p.name for p in out.glob("*.png")) == [
      "table_calibrated.png", "table_overconfident.png", "table_random.png"]


def test_reproduce_paper_bad_seeds(tmp_path, capsys):
  check_bad(tmp_path, capsys, ["reproduce-paper", "--seeds", "1"], "--seeds")


# --------------------------------------------------------------------------
# Issue 8: --group-by, per-class breakdown, deployment threshold, --worst
# --------------------------------------------------------------------------


def as_float(values):
  """JSON lists (null for NaN) as float64 arrays."""
  return np.array(values, dtype=object).astype(float)


def check_group_section(section, c, ok, ids, names, tau):
  """A metrics.json group section against sweep_by_group / group_gap called directly."""
  from cwsa_jax._groups import group_gap, sweep_by_group
  assert section["names"] == list(names)
  assert section["counts"] == np.bincount(ids, minlength=len(names)).tolist()
  direct = sweep_by_group(c, ok, ids, tau, num_groups=len(names))
  for field in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
    np.testing.assert_allclose(as_float(section["sweep"][field]),
                               np.asarray(getattr(direct, field), np.float64), atol=1e-6)
    np.testing.assert_allclose(as_float(section["gap"][field]),
                               np.asarray(group_gap(direct, field), np.float64), atol=1e-6)
  # And one group against the independent float64 reference of the plain sweep.
  want = reference.sweep(c[ids == 0], ok[ids == 0], tau)
  np.testing.assert_allclose(as_float(section["sweep"]["cwsa"])[0], want[:, 2], atol=2e-6)


def test_evaluate_group_by_classes_threshold_and_worst(tmp_path, capsys, model):
  from cwsa_jax._decompose import contributions, most_damaging
  from cwsa_jax._select import select_threshold
  c, ok = model.confidences, model.correct
  sites = np.array(["north", "south", "east"])[np.arange(N) % 3]
  rows = zip(model.labels, model.predictions, [repr(float(x)) for x in c], sites)
  path = write_csv(tmp_path / "g.csv", "y_true,y_pred,confidence,Site", rows)
  out = tmp_path / "eval"
  stdout = run_ok(["evaluate", path, "--out", out, "--group-by", "site", "--worst", "7"], capsys)
  assert "selected threshold" in stdout
  m = load(out)
  tau = np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)
  # --group-by: string labels mapped to ids in sorted order.
  names = ("east", "north", "south")
  ids = np.searchsorted(np.array(names), sites)
  assert m["groups"]["column"] == "site"
  check_group_section(m["groups"], c, ok, ids, names, tau)
  # Default per-class breakdown (true class from y_true).
  classes = np.unique(model.labels)
  check_group_section(m["classes"], c, ok, np.searchsorted(classes, model.labels),
                      tuple(str(k) for k in classes), tau)
  # Deployment threshold: select_threshold with the default constraint.
  want = select_threshold(c, ok, metric="cwsa", min_coverage=0.8, thresholds=tau)
  choice = m["threshold_choice"]
  assert choice["feasible"] is True and choice["metric"] == "cwsa" and choice["min_coverage"] == 0.8
  for key in ("threshold", "coverage", "selective_risk", "value"):
    assert choice[key] == pytest.approx(getattr(want, key), abs=1e-6), key
  assert choice["coverage"] >= 0.8 - 1e-6
  # --worst 7: most_damaging at the lowest grid threshold.
  result = contributions(c, ok, np.float32(0.5))
  index = np.asarray(most_damaging(result, k=7))
  worst = m["worst"]
  assert worst["k"] == 7 and worst["tau"] == pytest.approx(0.5)
  assert [s["index"] for s in worst["samples"]] == index.tolist() and index.size == 7
  for s in worst["samples"]:
    assert not ok[s["index"]]
    assert s["confidence"] == pytest.approx(float(c[s["index"]]), abs=1e-6)
    assert s["term"] == pytest.approx(-(float(c[s["index"]]) - 0.5) / 0.5, abs=2e-6)
  report = (out / "report.md").read_text()
  assert "## Per-class breakdown" in report and "## Per-group breakdown (column `site`)" in report
  assert "| north |" in report and "best − worst" in report
  assert f"τ = {want.threshold:.4g}" in report and "## Most damaging samples" in report
  assert f"| {index[0]} |" in report
  assert (out / "threshold_curves.png").is_file()


def test_evaluate_integer_groups_and_infeasible_threshold(tmp_path, capsys, model):
  c, ok = model.confidences, model.correct
  labels = np.array([10, 2, -1])[np.arange(N) % 3]
  rows = zip([repr(float(x)) for x in c], ok.astype(int), labels)
  path = write_csv(tmp_path / "g.csv", "confidence,correct,batch", rows)
  out = tmp_path / "eval"
  # Two thresholds near 1: no threshold keeps 80 % coverage; the report says so, no failure.
  run_ok(["evaluate", path, "--out", out, "--group-by", "batch", "--no-figures",
          "--thresholds", "0.97,0.99"], capsys)
  m = load(out)
  names = ("-1", "2", "10")  # numeric order
  ids = np.searchsorted(np.array([-1, 2, 10]), labels)
  check_group_section(m["groups"], c, ok, ids, names, np.array([0.97, 0.99], np.float32))
  assert "classes" not in m  # no true labels in a confidence,correct CSV
  assert "worst" not in m
  assert m["threshold_choice"]["feasible"] is False
  assert "no threshold" in m["threshold_choice"]["reason"]
  report = (out / "report.md").read_text()
  assert "**Deployment threshold**: none" in report and "infeasible" in report


def test_evaluate_npz_labels_give_the_class_breakdown(tmp_path, capsys, model):
  probs = np.asarray(synthetic.to_probs(model))
  np.savez(tmp_path / "probs.npz", probs=probs, labels=model.labels)
  out = tmp_path / "eval"
  run_ok(["evaluate", tmp_path / "probs.npz", "--out", out, "--no-figures"], capsys)
  m = load(out)
  conf = probs.max(axis=1).astype(np.float32)
  ok = probs.argmax(axis=1) == model.labels
  classes = np.unique(model.labels)
  check_group_section(m["classes"], conf, ok, np.searchsorted(classes, model.labels),
                      tuple(str(k) for k in classes),
                      np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32))


@pytest.mark.parametrize("flags, fragments", [
    (["--group-by", "site"], ["preds.csv", "--group-by column 'site' not found"]),
    (["--worst", "0"], ["--worst must be >= 1"]),
])
def test_bad_issue8_flags(tmp_path, capsys, csv_file, flags, fragments):
  check_bad(tmp_path, capsys, ["evaluate", csv_file, *flags], *fragments)


def test_group_by_needs_a_csv(tmp_path, capsys, model):
  np.savez(tmp_path / "c.npz", confidences=model.confidences, correct=model.correct)
  check_bad(tmp_path, capsys, ["evaluate", tmp_path / "c.npz", "--group-by", "site"],
            "--group-by needs a CSV")


def test_threshold_marker_on_the_curves(model):
  from cwsa_jax import plots
  from cwsa_jax._sweep import sweep
  tau = plots.default_thresholds()
  fig = plots.threshold_curves(sweep(model.confidences, model.correct, tau), marker=0.7,
                               marker_label="selected τ = 0.7")
  ax = fig.axes[0]
  texts = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "selected τ = 0.7" in texts
  line = [ln for ln in ax.get_lines() if ln.get_label() == "selected τ = 0.7"][0]
  assert list(line.get_xdata()) == [0.7, 0.7]


def test_demo_states_the_selected_threshold(tmp_path, capsys):
  from cwsa_jax.cli._demo import build_cases
  from cwsa_jax._select import select_threshold
  out = tmp_path / "demo"
  run_ok(["demo", "--out", out, "--seeds", "3", "--n", "400", "--no-figures"], capsys)
  m = load(out)
  cases, conf, ok = build_cases(0, 3, 400)
  tau = np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)
  report = (out / "report.md").read_text()
  assert "## Deployment threshold" in report
  feasible = 0
  for i, case in enumerate(cases):
    if case.group != "model":
      continue
    choice = m["models"][case.name]["threshold_choice"]
    pooled_c, pooled_ok = np.asarray(conf[i]).reshape(-1), np.asarray(ok[i]).reshape(-1)
    try:
      want = select_threshold(pooled_c, pooled_ok, metric="cwsa", min_coverage=0.8, thresholds=tau)
    except ValueError:
      assert choice["feasible"] is False
      continue
    feasible += 1
    assert choice["feasible"] is True
    assert choice["threshold"] == pytest.approx(want.threshold, abs=1e-6)
    assert choice["value"] == pytest.approx(want.value, abs=1e-6)
  assert feasible >= 1
  assert m["models"]["underconfident"]["threshold_choice"]["feasible"] is False  # coverage <= 0.6


# --------------------------------------------------------------------------
# bootstrap intervals (evaluate) and compare
# --------------------------------------------------------------------------


def test_evaluate_reports_bootstrap_intervals(tmp_path, capsys, csv_file, model):
  out = tmp_path / "eval"
  stdout = run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--bootstrap", "200",
                   "--thresholds", "0.5,0.9"], capsys)
  assert "95% percentile-bootstrap intervals (200 poisson resamples, seed 0)" in stdout
  m = load(out)
  iv = m["intervals"]
  assert iv["num_resamples"] == 200 and iv["level"] == 0.95 and iv["resampling"] == "poisson"
  for name in ("accuracy", "ece", "aurc", "augrc"):
    assert iv["low"][name] <= m[name] <= iv["high"][name], name
    assert iv["high"][name] - iv["low"][name] > 0, name
  for j in range(2):
    assert iv["low"]["cwsa"][j] <= m["sweep"]["cwsa"][j] <= iv["high"]["cwsa"][j]
  assert "bootstrap intervals" in (out / "report.md").read_text()
  # The accuracy interval is about +-1.96 sqrt(p(1-p)/n) wide.
  p = model.correct.mean()
  half = 1.96 * np.sqrt(p * (1 - p) / N)
  assert (iv["high"]["accuracy"] - iv["low"]["accuracy"]) / 2 == pytest.approx(half, rel=0.25)
  out2 = tmp_path / "eval0"
  run_ok(["evaluate", csv_file, "--out", out2, "--no-figures", "--bootstrap", "0"], capsys)
  assert "intervals" not in load(out2)


@pytest.mark.slow
def test_evaluate_resampling_schemes(tmp_path, capsys, csv_file, model):
  """--resampling multinomial gives bootstrap_ci's resamples; Poisson is refused where only
  the multinomial bootstrap applies, and is not the default there."""
  out = tmp_path / "multi"
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--bootstrap", "200",
          "--thresholds", "0.5,0.9", "--resampling", "multinomial"], capsys)
  iv = load(out)["intervals"]
  assert iv["resampling"] == "multinomial"
  want = cw.bootstrap_ci(lambda c, k: cw.risk_coverage_summary(c, k).aurc,
                         jnp.asarray(model.confidences), jnp.asarray(model.correct),
                         key=jax.random.key(0), num_resamples=200)
  assert iv["low"]["aurc"] == pytest.approx(float(want.low), abs=2e-6)
  assert iv["high"]["aurc"] == pytest.approx(float(want.high), abs=2e-6)
  out = tmp_path / "mass"
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--bootstrap", "200",
          "--binning", "mass"], capsys)
  assert load(out)["intervals"]["resampling"] == "multinomial"
  check_bad(tmp_path, capsys, ["evaluate", csv_file, "--binning", "mass", "--resampling",
                               "poisson"], "--resampling poisson", "--binning mass")


@pytest.fixture()
def pair(tmp_path, model):
  """Model A (overconfident) and B: the same predictions with a much better ranking."""
  c, ok = model.confidences, model.correct
  better = np.where(ok, 0.9, 0.6).astype(np.float32) + np.float32(0.05) * c
  np.savez(tmp_path / "a.npz", confidences=c, correct=ok)
  np.savez(tmp_path / "b.npz", confidences=better, correct=ok)
  return tmp_path / "a.npz", tmp_path / "b.npz", (c, ok), (better, ok)


def test_compare_paired_difference_interval_and_p_value(tmp_path, capsys, pair):
  a, b, (ca, oka), (cb, okb) = pair
  out = tmp_path / "cmp.json"
  stdout = run_ok(["compare", a, b, "--bootstrap", "300", "--out", out], capsys)
  assert "A - B" in stdout and "aurc" in stdout
  # Neither file has labels: compare says it cannot check that the test sets match.
  assert f"note: {a} and {b} hold no labels" in stdout and "cannot check" in stdout
  r = json.loads(out.read_text())
  assert r["labels_checked"] is False
  assert r["n"] == N and r["num_resamples"] == 300
  want = ref_aurc_step(ca, oka) - ref_aurc_step(cb, okb)
  assert r["difference"]["aurc"] == pytest.approx(want, abs=2e-6)
  assert r["low"]["aurc"] <= r["difference"]["aurc"] <= r["high"]["aurc"]
  assert r["low"]["aurc"] > 0 and r["p_value"]["aurc"] < 0.01  # B ranks far better
  assert r["difference"]["accuracy"] == 0 and r["p_value"]["accuracy"] == 1  # same correctness
  same = tmp_path / "same.json"
  run_ok(["compare", a, a, "--bootstrap", "300", "--out", same], capsys)
  s = json.loads(same.read_text())
  assert all(v == 0 for v in s["difference"]["cwsa"]) and s["p_value"]["aurc"] == 1


@pytest.mark.slow
def test_compare_resampling_schemes(tmp_path, capsys, pair):
  """Poisson row weights by default (as evaluate); --resampling multinomial gives
  paired_bootstrap's resamples, each model sorted once: its values to float32 rounding."""
  from cwsa_jax.cli import _intervals
  a, b, (ca, oka), (cb, okb) = pair
  out = tmp_path / "poisson.json"
  stdout = run_ok(["compare", a, b, "--bootstrap", "200", "--out", out], capsys)
  assert "200 poisson resamples" in stdout
  assert json.loads(out.read_text())["resampling"] == "poisson"
  out = tmp_path / "multi.json"
  run_ok(["compare", a, b, "--bootstrap", "200", "--resampling", "multinomial", "--out", out],
         capsys)
  r = json.loads(out.read_text())
  assert r["resampling"] == "multinomial"
  settings = _intervals.Settings(thresholds=(0.5, 0.9))
  want = cw.paired_bootstrap(_intervals.metric_fn(settings), jnp.asarray(ca), jnp.asarray(oka),
                             jnp.asarray(cb), jnp.asarray(okb), key=jax.random.key(0),
                             num_resamples=200)
  for part in ("difference", "low", "high"):
    for name in ("accuracy", "ece", "aurc", "eaurc", "augrc", "cwsa", "coverage"):
      np.testing.assert_allclose(r[part][name], np.asarray(getattr(getattr(want, part), name)),
                                 atol=2e-6, err_msg=f"{part} {name}")
  assert r["p_value"]["aurc"] == pytest.approx(float(want.p_value.aurc))


def test_compare_bad_input(tmp_path, capsys, pair, model):
  a, b, _, _ = pair
  np.savez(tmp_path / "short.npz", confidences=model.confidences[:10], correct=model.correct[:10])
  check_bad(tmp_path, capsys, ["compare", a, tmp_path / "short.npz"], "same test set")
  check_bad(tmp_path, capsys, ["compare", a, b, "--bootstrap", "0"], "--bootstrap must be >= 1")
  check_bad(tmp_path, capsys, ["compare", a, b, "--level", "1.5"], "--level")
  check_bad(tmp_path, capsys, ["compare", a, tmp_path / "missing.npz"], "missing.npz")
  probs = np.full((N, 3), 1 / 3)
  labels = np.arange(N) % 3
  np.savez(tmp_path / "p1.npz", probs=probs, labels=labels)
  np.savez(tmp_path / "p2.npz", probs=probs, labels=np.roll(labels, 1))
  check_bad(tmp_path, capsys, ["compare", tmp_path / "p1.npz", tmp_path / "p2.npz"],
            "different labels")
