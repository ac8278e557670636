"""Report text and headline numbers: significant digits, caveats, --min-coverage, empty sets.

The numbers in report.md must say what metrics.json says: small values keep
their significant digits, AUMCC always comes with its caveat, the deployment
threshold states (and follows) ``--min-coverage``, and CWSA at an empty
retained set is marked as the convention it is.
"""

import json
import math
import re

import numpy as np
import pytest

from cwsa_jax import cli
from cwsa_jax._select import select_threshold
from cwsa_jax.cli import _format, _markdown, _metrics, _settings

GRID = np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)


def _significant_digits(text: str) -> int:
  digits = text.lstrip("-").replace(".", "").lstrip("0")
  return len(digits)


@pytest.mark.parametrize("value, text", [
    (0.000813, "0.000813"),     # 4 decimals would print 0.0008
    (0.9647, "0.9647"),
    (0.0024, "0.00240"),
    (-0.1696, "-0.1696"),
    (1.0, "1.0000"),
    (0.0, "0"),
    (float("nan"), "—"),
    (None, "—"),
])
def test_fmt_keeps_significant_digits(value, text):
  assert _format.fmt(value) == text


def test_fmt_is_close_at_every_magnitude():
  rng = np.random.default_rng(0)
  for v in rng.uniform(-1, 1, 200) * 10.0 ** rng.integers(-12, 3, 200):
    text = _format.fmt(v)
    assert abs(float(text) - v) <= 5e-3 * abs(v), (v, text)
    assert _significant_digits(text.split("e")[0]) >= 3, (v, text)


def test_fmt_pm_uses_the_means_decimals():
  assert _format.fmt_pm(0.0024, 0.0005) == "0.00240 ± 0.00050"
  assert _format.fmt_pm(0.933, 0.0083) == "0.9330 ± 0.0083"
  assert _format.fmt_pm(float("nan"), 0.1) == "—"


def test_sweep_rows_mark_cwsa_at_an_empty_retained_set():
  fields = _metrics.SweepFields(
      thresholds=np.array([0.5, 0.9]), coverage=np.array([0.4, 0.0]),
      selective_accuracy=np.array([0.75, np.nan]), cwsa=np.array([0.25, 0.0]),
      cwsa_plus=np.array([0.5, 0.0]))
  first, second = _markdown.sweep_rows(fields)
  assert first[3:] == ["0.2500", "0.5000"]
  assert second[2:] == ["—", "0 (S empty)", "0 (S empty)"]


def test_headline_aurc_keeps_three_significant_digits():
  # 990 right predictions above 10 wrong ones: AURC is about 5.5e-5, printed as 0.0001 before.
  c = np.concatenate([np.linspace(0.9, 1.0, 990), np.linspace(0.5, 0.6, 10)]).astype(np.float32)
  ok = np.arange(1000) < 990
  settings = _settings.Settings()
  metrics = _metrics.compute_metrics(c, ok, settings)
  rows = dict(_markdown.scalar_rows(metrics))
  aurc = float(metrics.aurc)
  assert 1e-5 < aurc < 1e-4
  assert _significant_digits(rows["AURC"]) >= 3
  assert float(rows["AURC"]) == pytest.approx(aurc, rel=5e-3)
  report = _metrics.ModelReport(metrics, _metrics.choose_threshold(c, ok, settings))
  text = _markdown.evaluation_report(title="t", source="s", report=report, settings=settings,
                                     figures=[], command="c")
  assert f"| AURC | {rows['AURC']} |" in text


# --------------------------------------------------------------------------
# evaluate: --min-coverage and the AUMCC caveat
# --------------------------------------------------------------------------


def _write_csv(path, c, ok):
  path.write_text("confidence,correct\n" + "".join(f"{float(x)!r},{int(k)}\n" for x, k in zip(c, ok)))
  return path


@pytest.fixture(scope="module")
def separable(tmp_path_factory):
  """600 right predictions at U[0.95, 1], 400 wrong at U[0.5, 0.7]: CWSA is best once the wrong
  ones are gone (coverage 0.6), so the threshold depends on the coverage required."""
  rng = np.random.default_rng(1)
  c = np.concatenate([rng.uniform(0.95, 1.0, 600), rng.uniform(0.5, 0.7, 400)]).astype(np.float32)
  ok = np.arange(1000) < 600
  return _write_csv(tmp_path_factory.mktemp("csv") / "sep.csv", c, ok), c, ok


def _run(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _evaluate(path, out, capsys, *flags):
  code, stdout, err = _run(["evaluate", path, "--out", out, "--no-figures", "--bootstrap", "0",
                            *flags], capsys)
  assert code == 0, err
  return json.loads((out / "metrics.json").read_text()), (out / "report.md").read_text(), stdout


def test_min_coverage_changes_the_threshold_and_is_stated(tmp_path, capsys, separable):
  path, c, ok = separable
  chosen = {}
  for min_coverage in (None, 0.3):
    flags = [] if min_coverage is None else ["--min-coverage", min_coverage]
    out = tmp_path / f"eval-{min_coverage}"
    m, report, stdout = _evaluate(path, out, capsys, *flags)
    expected_bound = 0.8 if min_coverage is None else 0.3
    want = select_threshold(c, ok, metric="cwsa", min_coverage=expected_bound, thresholds=GRID)
    choice = m["threshold_choice"]
    assert choice["min_coverage"] == expected_bound
    assert m["settings"]["threshold_selection"] == {"metric": "cwsa", "min_coverage": expected_bound}
    assert choice["threshold"] == pytest.approx(float(want.threshold), abs=1e-6)
    assert choice["coverage"] >= expected_bound
    assert f"coverage ≥ {expected_bound:g} (`--min-coverage`)" in report
    assert f"τ = {float(want.threshold):.4g}" in report
    assert f"coverage >= {expected_bound:g}, --min-coverage" in stdout
    chosen[expected_bound] = choice["threshold"]
    # AUMCC: every row carries the mark, and the caveat with this model's span follows the table.
    aumcc_rows = [line for line in report.splitlines() if line.startswith("| AUMCC (")]
    assert len(aumcc_rows) == 3 and all(_markdown.AUMCC_MARK in row for row in aumcc_rows)
    note = next(line for line in report.splitlines() if line.startswith(f"{_markdown.AUMCC_MARK} AUMCC"))
    coverage = np.asarray(m["sweep"]["coverage"])
    span = coverage.max() - coverage[coverage > 0].min()
    shown = float(re.search(r"span ([0-9.]+)\)", note).group(1))
    assert shown == pytest.approx(span, abs=1e-4)
    mean_cwsa = float(re.search(r"÷ span: CWSA ([-0-9.]+)", note).group(1))
    assert mean_cwsa == pytest.approx(m["aumcc"]["cwsa"] / span, rel=1e-3)
    assert "not normalised" in note and "coverage span" in note
    assert f"{_markdown.AUMCC_MARK} AUMCC is the area" in stdout  # the terminal summary too
    assert "coverage span" in m["settings"]["aumcc"]["caveat"]  # and metrics.json
  assert chosen[0.3] > chosen[0.8]  # a looser coverage bound lets the threshold drop the errors


@pytest.mark.parametrize("command", ["evaluate", "demo"])
def test_min_coverage_outside_unit_interval_is_refused(tmp_path, capsys, separable, command):
  argv = [command] + ([separable[0]] if command == "evaluate" else ["--seeds", "1", "--n", "10"])
  out = tmp_path / "out"
  code, _, err = _run(argv + ["--min-coverage", "1.5", "--out", out], capsys)
  assert code == 2 and "--min-coverage must lie in [0, 1]" in err and "1.5" in err
  assert not out.exists()


# --------------------------------------------------------------------------
# demo: --min-coverage, AUMCC caveat, the ECE explanation, empty retained sets
# --------------------------------------------------------------------------


def _number_after(text: str, prefix: str) -> float:
  return float(re.search(re.escape(prefix) + r" ([-0-9.]+)", text).group(1))


def test_demo_report_numbers(tmp_path, capsys):
  from cwsa_jax.cli._demo import build_cases
  out = tmp_path / "demo"
  code, _, err = _run(["demo", "--out", out, "--seeds", "3", "--n", "400", "--no-figures",
                       "--min-coverage", "0.3"], capsys)
  assert code == 0, err
  m = json.loads((out / "metrics.json").read_text())
  report = (out / "report.md").read_text()
  models = m["models"]

  # --min-coverage: stated, recorded and used.
  assert m["settings"]["threshold_selection"]["min_coverage"] == 0.3
  assert "coverage ≥ 0.3 (`--min-coverage`)" in report
  cases, conf, ok = build_cases(0, 3, 400)
  i = [k for k, case in enumerate(cases) if case.name == "calibrated"][0]
  want = select_threshold(np.asarray(conf[i]).reshape(-1), np.asarray(ok[i]).reshape(-1),
                          metric="cwsa", min_coverage=0.3, thresholds=GRID)
  assert models["calibrated"]["threshold_choice"]["min_coverage"] == 0.3
  assert models["calibrated"]["threshold_choice"]["threshold"] == pytest.approx(float(want.threshold))
  assert models["underconfident"]["threshold_choice"]["feasible"] is True  # 0.8 was infeasible

  # AUMCC is not in the summary table but in its own, with the mark and the caveat.
  summary = report.split("## Summary")[1].split("What to look for")[0]
  assert "AUMCC" not in summary
  assert f"AUMCC(CWSA) {_markdown.AUMCC_MARK}" in report
  assert f"{_markdown.AUMCC_MARK} AUMCC is the area under the metric-vs-coverage curve" in report
  row = next(line for line in report.splitlines() if line.startswith("| calibrated | ") and "→" in line)
  assert row.split(" | ")[1].split(" ± ")[0] == _format.fmt(models["calibrated"]["aumcc"]["cwsa"]["mean"])

  # The ECE explanation is computed: the ratio and both ECEs come from the models' numbers, and
  # the two parts it names add up to the calibrated model's ECE.
  ece_cal = models["calibrated"]["ece"]["mean"]
  ece_over = models["overconfident"]["ece"]["mean"]
  line = next(t for t in report.splitlines() if t.startswith("- **Why \"calibrated\""))
  assert f"has {ece_cal / ece_over:.1f}× the ECE" in line
  assert f"({_format.fmt(ece_cal)} vs {_format.fmt(ece_over)}" in line
  parts = [float(x) for x in re.findall(r"adding ([0-9]+\.[0-9]+|0)", line)]
  assert len(parts) == 2 and sum(parts) == pytest.approx(ece_cal, abs=2e-3)
  assert f"E-AURC {_format.fmt(models['overconfident']['eaurc']['mean'])}" in line
  assert _number_after(line, "E-AURC") == pytest.approx(models["calibrated"]["eaurc"]["mean"], abs=1e-3)

  # Empty retained sets: the underconfident model keeps nothing at 0.9 (confidence <= 0.6).
  j = int(np.argmin(np.abs(GRID - 0.9)))
  assert models["underconfident"]["sweep"]["coverage"]["mean"][j] == 0
  under = next(t for t in summary.splitlines() if t.startswith("| underconfident |"))
  assert under.count("0 (S empty)") == 2  # CWSA@0.9 and CWSA+@0.9
  calibrated = next(t for t in summary.splitlines() if t.startswith("| calibrated |"))
  assert "S empty" not in calibrated
  assert math.isfinite(models["calibrated"]["sweep"]["cwsa"]["mean"][j])
