"""``evaluate --select-on FILE``: the deployment threshold chosen on held-out predictions.

The threshold is checked against an independent float64 NumPy reference of the
rule (largest CWSA divided by |S| on the default grid among the thresholds that
keep coverage >= 0.8, ties to the smallest threshold), and the evaluated file's
operating point at that threshold against a NumPy computation on its data.
"""

import json

import numpy as np
import pytest

from cwsa_jax import cli

N = 600
GRID = np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)  # evaluate's default grid
MIN_COVERAGE = 0.8
SLACK = 1e-6
IN_SAMPLE = "evaluated data (in-sample, optimistic)"


def make_data(seed, low, high):
  """Confidences uniform in [low, high] (float32 values), correct with probability c ** 2."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(low, high, N).astype(np.float32)
  ok = rng.uniform(size=N) < c.astype(np.float64) ** 2
  return c, ok


def write_csv(path, c, ok):
  rows = "".join(f"{float(x)!r},{int(k)}\n" for x, k in zip(c, ok))
  path.write_text("confidence,correct\n" + rows)
  return path


def ref_point(c, ok, tau):
  """Float64 (coverage, selective accuracy, CWSA divided by |S|) at ``tau``."""
  c = np.asarray(c, np.float32).astype(np.float64)
  tau = float(np.float32(tau))
  kept = c >= tau
  if not kept.any():
    return 0.0, float("nan"), 0.0
  phi = (c[kept] - tau) / (1.0 - tau)
  sign = np.where(ok[kept], 1.0, -1.0)
  return kept.mean(), ok[kept].mean(), float(np.sum(phi * sign) / kept.sum())


def ref_choice(c, ok):
  """The grid threshold with the largest CWSA among those keeping coverage >= MIN_COVERAGE."""
  best = None
  for tau in GRID:  # ascending: a tie keeps the smaller threshold
    coverage, _, value = ref_point(c, ok, tau)
    if coverage > 0 and coverage >= MIN_COVERAGE - SLACK and (best is None or value > best[1]):
      best = (float(tau), value)
  assert best is not None, "the test data must admit a feasible threshold"
  return best[0]


@pytest.fixture(scope="module")
def datasets():
  """(selection, evaluated): differently spread confidences, so the two choices differ."""
  return make_data(11, 0.45, 1.0), make_data(12, 0.55, 1.0)


def run(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def evaluate(test_file, out, capsys, *extra):
  code, stdout, err = run(["evaluate", test_file, "--out", out, "--no-figures", "--bootstrap",
                           "0", *extra], capsys)
  assert code == 0, err
  metrics = json.loads((out / "metrics.json").read_text())
  return metrics["threshold_choice"], (out / "report.md").read_text(), stdout


def test_held_out_threshold_matches_the_reference_and_is_applied(tmp_path, capsys, datasets):
  (sel_c, sel_ok), (c, ok) = datasets
  sel = write_csv(tmp_path / "val.csv", sel_c, sel_ok)
  test = write_csv(tmp_path / "test.csv", c, ok)
  tau = ref_choice(sel_c, sel_ok)
  assert tau != ref_choice(c, ok)  # the held-out choice is not the in-sample one
  choice, report, stdout = evaluate(test, tmp_path / "out", capsys, "--select-on", sel)
  # (a) the threshold choose_threshold picks on the selection file, and its point there.
  assert choice["feasible"] is True and choice["metric"] == "cwsa"
  assert choice["threshold"] == pytest.approx(tau, abs=1e-6)
  coverage, accuracy, value = ref_point(sel_c, sel_ok, tau)
  assert choice["coverage"] == pytest.approx(coverage, abs=1e-6)
  assert choice["selective_risk"] == pytest.approx(1.0 - accuracy, abs=1e-6)
  assert choice["value"] == pytest.approx(value, abs=1e-5)
  # (b) the evaluated file's operating point at that threshold, on its own data.
  coverage, accuracy, value = ref_point(c, ok, tau)
  applied = choice["evaluated"]
  assert applied["threshold"] == pytest.approx(tau, abs=1e-6)
  assert applied["coverage"] == pytest.approx(coverage, abs=1e-6)
  assert applied["selective_accuracy"] == pytest.approx(accuracy, abs=1e-6)
  assert applied["selective_risk"] == pytest.approx(1.0 - accuracy, abs=1e-6)
  assert applied["cwsa"] == pytest.approx(value, abs=1e-5)
  # (c) the held-out label in JSON, report.md and the terminal summary.
  assert choice["selected_on"] == {"file": str(sel), "held_out": True}
  assert f"chosen on `{sel}` (held out)" in report and f"τ = {tau:.4g}" in report
  assert "Applied to the evaluated data" in report and "in-sample" not in report
  assert f"chosen on {sel} (held out)" in stdout
  assert f"on the evaluated data: coverage {coverage:.4f}" in stdout


def test_without_select_on_the_threshold_is_labelled_in_sample(tmp_path, capsys, datasets):
  _, (c, ok) = datasets
  test = write_csv(tmp_path / "test.csv", c, ok)
  choice, report, stdout = evaluate(test, tmp_path / "out", capsys)
  assert choice["threshold"] == pytest.approx(ref_choice(c, ok), abs=1e-6)
  assert choice["selected_on"] == IN_SAMPLE and "evaluated" not in choice
  assert "chosen on the evaluated data itself (in-sample)" in report
  assert "optimistic" in report and "--select-on FILE" in report
  assert "chosen on the evaluated data itself (in-sample)" in stdout
  assert "optimistic" in stdout and "--select-on FILE" in stdout


def test_select_on_the_evaluated_file_itself_is_in_sample(tmp_path, capsys, datasets):
  _, (c, ok) = datasets
  test = write_csv(tmp_path / "test.csv", c, ok)
  choice, report, _ = evaluate(test, tmp_path / "out", capsys, "--select-on", test)
  assert choice["selected_on"] == IN_SAMPLE and "evaluated" not in choice
  assert choice["threshold"] == pytest.approx(ref_choice(c, ok), abs=1e-6)
  assert "(in-sample)" in report and "held out" not in report


def test_select_on_reads_npz_and_states_an_infeasible_choice(tmp_path, capsys, datasets):
  (sel_c, sel_ok), (c, ok) = datasets
  sel = tmp_path / "val.npz"
  np.savez(sel, confidences=sel_c, correct=sel_ok)
  test = write_csv(tmp_path / "test.csv", c, ok)
  choice, _, _ = evaluate(test, tmp_path / "out", capsys, "--select-on", sel)
  assert choice["threshold"] == pytest.approx(ref_choice(sel_c, sel_ok), abs=1e-6)
  # No threshold of this grid keeps 80 % of the selection file: no choice, no evaluated point.
  choice, report, stdout = evaluate(test, tmp_path / "out2", capsys, "--select-on", sel,
                                    "--thresholds", "0.97,0.99")
  assert choice["feasible"] is False and "no threshold" in choice["reason"]
  assert choice["selected_on"] == {"file": str(sel), "held_out": True}
  assert "evaluated" not in choice
  assert f"infeasible on `{sel}` (held out)" in report
  assert f"on {sel} (held out)" in stdout


@pytest.mark.parametrize("name, content", [("missing.csv", None), ("bad.csv", "a,b\n1,2\n"),
                                           ("scores.npy", b"")])
def test_bad_select_on_file_exits_2_with_one_line_naming_it(tmp_path, capsys, datasets,
                                                            name, content):
  _, (c, ok) = datasets
  test = write_csv(tmp_path / "test.csv", c, ok)
  sel = tmp_path / name
  if isinstance(content, str):
    sel.write_text(content)
  elif content is not None:
    np.save(sel, np.full((4, 2), 0.5))
  out = tmp_path / "out"
  code, _, err = run(["evaluate", test, "--out", out, "--no-figures", "--bootstrap", "0",
                      "--select-on", sel], capsys)
  lines = err.strip().splitlines()
  assert code == 2, err
  assert len(lines) == 1 and "Traceback" not in err, err
  assert "--select-on" in lines[0] and str(sel) in lines[0], lines[0]
  assert not out.exists()


def test_select_on_inside_out_is_refused_like_other_inputs(tmp_path, capsys, datasets):
  (sel_c, sel_ok), (c, ok) = datasets
  test = write_csv(tmp_path / "test.csv", c, ok)
  out = tmp_path / "res"
  out.mkdir()
  sel = write_csv(out / "val.csv", sel_c, sel_ok)
  before = sel.read_bytes()
  for force in ([], ["--force"]):
    code, _, err = run(["evaluate", test, "--out", out, "--no-figures", "--bootstrap", "0",
                        "--select-on", sel, *force], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "holds the input" in lines[0] and "val.csv" in lines[0], lines[0]
  assert sorted(p.name for p in out.iterdir()) == ["val.csv"]
  assert sel.read_bytes() == before


def test_select_on_one_of_several_evaluated_files_is_in_sample(tmp_path, capsys, datasets):
  (sel_c, sel_ok), (c, ok) = datasets
  first = write_csv(tmp_path / "a.csv", sel_c, sel_ok)
  second = write_csv(tmp_path / "b.csv", c, ok)
  out = tmp_path / "out"
  code, _, err = run(["evaluate", first, second, "--out", out, "--no-figures", "--bootstrap", "0",
                      "--select-on", first], capsys)
  assert code == 0, err
  choice = json.loads((out / "metrics.json").read_text())["threshold_choice"]
  report = (out / "report.md").read_text()
  assert choice["selected_on"] == IN_SAMPLE and "evaluated" not in choice
  both = (np.concatenate([sel_c, c]), np.concatenate([sel_ok, ok]))
  assert choice["threshold"] == pytest.approx(ref_choice(*both), abs=1e-6)
  assert "(in-sample)" in report
