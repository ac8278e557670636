"""A new user's findings (issue 43): each test failed before its fix."""

import re

import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax import cli
from cwsa_jax.cli import _demo, _io
from cwsa_jax.cli._format import fmt
from test_cli import check_bad, write_csv

N = 300


@pytest.fixture(scope="module")
def probs():
  rng = np.random.default_rng(0)
  return rng.dirichlet(np.full(10, 10.0), size=N), rng.integers(0, 10, N)  # rows below 0.5


@pytest.fixture()
def csv_file(tmp_path):
  rows = [(f"{c:.3f}", int(c > 0.6)) for c in np.linspace(0.3, 0.99, 20)]
  return write_csv(tmp_path / "cc.csv", "confidence,correct", rows)


# --------------------------------------------------------------------------
# 1. A .npy matrix in [0, 1] whose rows do not sum to 1 is not read as logits
# --------------------------------------------------------------------------


def test_npy_in_unit_interval_not_summing_to_one_is_refused_under_auto(tmp_path, capsys, probs):
  p, labels = probs
  np.save(tmp_path / "scaled.npy", 2 * p)  # every value still in [0, 1]: 10 classes
  np.save(tmp_path / "labels.npy", labels)
  assert (2 * p).max() <= 1.0
  line = check_bad(tmp_path, capsys, ["evaluate", tmp_path / "scaled.npy",
                                      "--labels", tmp_path / "labels.npy"],
                   "scaled.npy", "not probabilities", "sums to", "--scores logits")
  assert re.search(r"row \d+ sums to", line), line
  # As logits when the user says so (the reader only: no metrics to compile).
  loaded = _io.load_predictions(tmp_path / "scaled.npy", labels_path=tmp_path / "labels.npy",
                                scores="logits")
  assert loaded.from_logits and loaded.note is None


def test_npy_auto_states_what_it_read_on_stderr(tmp_path, capsys, probs):
  p, labels = probs
  np.save(tmp_path / "labels.npy", labels)
  np.save(tmp_path / "probs.npy", p)
  loaded = _io.load_predictions(tmp_path / "probs.npy", labels_path=tmp_path / "labels.npy")
  assert not loaded.from_logits
  assert loaded.note == ("probs.npy: scores read as probabilities (--scores auto: values in "
                         "[0, 1], rows sum to 1)")
  np.save(tmp_path / "logits.npy", np.log(p) + 3.0)
  code = cli.main([str(a) for a in ["evaluate", tmp_path / "logits.npy", "--labels",
                                    tmp_path / "labels.npy", "--out", tmp_path / "out",
                                    "--no-figures", "--bootstrap", "0", "--no-progress"]])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  assert captured.err.splitlines() == [
      "logits.npy: scores read as logits (--scores auto: values outside [0, 1])"]


# --------------------------------------------------------------------------
# 2. The demo's AUGRC panel shows AUGRC values
# --------------------------------------------------------------------------


def test_demo_risk_coverage_legends_show_each_panels_area():
  rng = np.random.default_rng(1)
  conf = rng.uniform(0.3, 1.0, (2, 50)).astype(np.float32)
  ok = rng.uniform(size=(2, 50)) < conf
  curves = cw.risk_coverage_curve(conf, ok)
  fig = _demo.risk_coverage_figure(["calibrated", "overconfident"], curves,
                                   np.array([0.125, 0.25]), np.array([0.0625, 0.0375]))
  ax_risk, ax_general = fig.axes
  assert "AUGRC" in ax_general.get_title() and "AURC" in ax_risk.get_title()
  risk = [t.get_text() for t in ax_risk.get_legend().get_texts()]
  general = [t.get_text() for t in ax_general.get_legend().get_texts()]
  assert risk == [f"calibrated (AURC {fmt(0.125)})", f"overconfident (AURC {fmt(0.25)})"]
  assert general == [f"calibrated (AUGRC {fmt(0.0625)})", f"overconfident (AUGRC {fmt(0.0375)})"]


# --------------------------------------------------------------------------
# 3. compare --help names only compare's options
# --------------------------------------------------------------------------


def test_compare_resampling_help_names_no_evaluate_only_options():
  sub = [a for a in cli.build_parser()._actions if a.dest == "command"][0].choices
  helps = {name: [a.help for a in sub[name]._actions if "--resampling" in a.option_strings][0]
           for name in ("compare", "evaluate")}
  assert "--binning" not in helps["compare"] and "--aurc" not in helps["compare"]
  assert "poisson" in helps["compare"] and "multinomial" in helps["compare"]
  assert "--binning" in helps["evaluate"]  # evaluate has them: its text stays


# --------------------------------------------------------------------------
# 4. Threshold messages
# --------------------------------------------------------------------------


@pytest.mark.parametrize("tau, given", [(-0.1, "got -0.1"), (1.5, "got 1.5")])
def test_threshold_outside_unit_interval_names_the_range_and_value(tau, given):
  with pytest.raises(ValueError) as info:
    cw.cwsa(np.array([0.9, 0.6]), np.array([1, 0]), tau)
  message = str(info.value)
  assert message.startswith("tau must lie in [0, 1)") and given in message, message
  assert ("tau = 1" in message) == (tau >= 1), message  # the division by zero only at tau >= 1


def test_sweep_threshold_message_names_the_values_outside():
  with pytest.raises(ValueError, match=r"thresholds must lie in \[0, 1\), got -0\.2, 1 \(at tau"):
    cw.sweep(np.array([0.9, 0.6]), np.array([1, 0]), np.array([0.5, -0.2, 0.7, 1.0]))


@pytest.mark.parametrize("command", ["evaluate", "compare"])
def test_thresholds_with_stop_below_start_say_so(tmp_path, capsys, csv_file, command):
  files = [csv_file] if command == "evaluate" else [csv_file, csv_file]
  line = check_bad(tmp_path, capsys, [command, *files, "--thresholds", "0.9:0.5:0.1"],
                   "--thresholds '0.9:0.5:0.1'", "STOP 0.5 is below START 0.9")
  assert "-3 thresholds" not in line


def test_thresholds_outside_unit_interval_name_the_values(tmp_path, capsys, csv_file):
  check_bad(tmp_path, capsys, ["evaluate", csv_file, "--thresholds=-0.1,0.5"],
            "[0, 1)", "got -0.1")


# --------------------------------------------------------------------------
# 2 and 12. An estimate outside its own percentile interval is flagged and explained
# --------------------------------------------------------------------------


def _run_cli(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return captured.out


def _metrics_json(out):
  import json
  return json.loads((out / "metrics.json").read_text())


def _confidence_csv(path, confidences, correct, groups=None):
  """A confidence,correct CSV (with a ``site`` column when ``groups`` is given)."""
  header = "confidence,correct" + (",site" if groups is not None else "")
  rows = [(repr(float(c)), int(k)) + ((g,) if groups is not None else ())
          for c, k, g in zip(confidences, correct,
                             groups if groups is not None else [None] * len(confidences))]
  return write_csv(path, header, rows)


@pytest.fixture()
def all_wrong(tmp_path):
  """Every prediction wrong: resampled tie groups shift AUGRC's bootstrap distribution."""
  c = np.random.default_rng(0).uniform(0.3, 1.0, N)
  return _confidence_csv(tmp_path / "wrong.csv", c, np.zeros(N, bool)), c


def test_estimate_outside_its_interval_is_flagged_with_one_note(tmp_path, capsys, all_wrong):
  from cwsa_jax.cli import _intervals
  path, _ = all_wrong
  out = tmp_path / "eval"
  stdout = _run_cli(["evaluate", path, "--out", out, "--no-figures", "--bootstrap", "200",
                     "--thresholds", "0.5,0.9", "--no-progress"], capsys)
  m = _metrics_json(out)
  iv = m["intervals"]
  assert not iv["low"]["augrc"] <= m["augrc"] <= iv["high"]["augrc"]  # the finding itself
  flags = iv["estimate_outside_interval"]
  assert flags["augrc"] is True and flags["accuracy"] is False and flags["aurc"] is False
  assert flags["cwsa"] == [False, False] and "estimate_outside_note" in iv
  assert "resampl" in iv["estimate_outside_note"]
  mark = _intervals.OUTSIDE_MARK
  augrc_row = next(line for line in stdout.splitlines() if line.startswith("augrc "))
  assert mark in augrc_row
  assert stdout.count(f"{mark} Marked values") == 1 and "tie groups" in stdout
  report = (out / "report.md").read_text()
  assert f"| augrc | {m['augrc']:.5f} {mark} |" in report
  assert report.count(_intervals.OUTSIDE_NOTE) == 1
  # The interval itself is the bootstrap's, unchanged.
  assert iv["low"]["augrc"] > m["augrc"]


def test_no_outside_note_when_every_estimate_lies_inside(tmp_path, capsys):
  from cwsa_jax import synthetic
  import jax
  from cwsa_jax.cli import _intervals
  s = synthetic.overconfident(jax.random.key(0), num_samples=N)
  path = _confidence_csv(tmp_path / "normal.csv", np.asarray(s.confidences), np.asarray(s.correct))
  out = tmp_path / "eval"
  stdout = _run_cli(["evaluate", path, "--out", out, "--no-figures", "--bootstrap", "200",
                     "--thresholds", "0.5,0.9", "--no-progress"], capsys)
  iv = _metrics_json(out)["intervals"]
  assert not any(np.any(v) for v in iv["estimate_outside_interval"].values())
  assert "estimate_outside_note" not in iv
  assert _intervals.OUTSIDE_MARK not in stdout
  assert _intervals.OUTSIDE_MARK not in (out / "report.md").read_text()


def test_compare_flags_a_difference_outside_its_interval(tmp_path, capsys, all_wrong):
  from cwsa_jax.cli import _intervals
  path, c = all_wrong
  right = _confidence_csv(tmp_path / "right.csv", c, np.ones(N, bool))  # AUGRC 0 every resample
  out = tmp_path / "cmp.json"
  stdout = _run_cli(["compare", path, right, "--bootstrap", "200", "--out", out,
                     "--no-progress"], capsys)
  import json
  r = json.loads(out.read_text())
  assert r["estimate_outside_interval"]["augrc"] is True
  assert not r["low"]["augrc"] <= r["difference"]["augrc"] <= r["high"]["augrc"]
  assert r["estimate_outside_interval"]["accuracy"] is False
  assert stdout.count(f"{_intervals.OUTSIDE_MARK} Marked values") == 1


# --------------------------------------------------------------------------
# 9. The deployment threshold says which CWSA it maximises
# --------------------------------------------------------------------------


def test_selection_names_the_cwsa_it_maximises_under_normalize_all(tmp_path, capsys):
  from cwsa_jax.cli import _figures, _metrics
  from cwsa_jax.cli._settings import Settings
  rng = np.random.default_rng(3)
  c = rng.uniform(0.5, 1.0, N)
  ok = rng.uniform(size=N) < c
  path = _confidence_csv(tmp_path / "cal.csv", c, ok)
  out = tmp_path / "eval"
  stdout = _run_cli(["evaluate", path, "--out", out, "--no-figures", "--bootstrap", "0",
                     "--normalize", "all", "--no-progress"], capsys)
  line = next(x for x in stdout.splitlines() if x.startswith("selected threshold"))
  assert "best CWSA (divided by |S|, the paper's) with coverage >= 0.8" in line, line
  report = (out / "report.md").read_text()
  assert "maximising CWSA (divided by |S|, the paper's)" in report
  assert "largest CWSA (divided by \\|S\\|, the paper's) on the grid" in report  # table cell
  deployment = _metrics.choose_threshold(c, ok, Settings(normalize="all"))
  assert "CWSA ÷ |S|" in _figures.threshold_marker(deployment)["marker_label"]
  sub = [a for a in cli.build_parser()._actions if a.dest == "command"][0].choices
  help_text = [a.help for a in sub["evaluate"]._actions if "--min-coverage" in a.option_strings][0]
  assert "divided by |S|" in help_text


# --------------------------------------------------------------------------
# 10. compare prints every requested threshold
# --------------------------------------------------------------------------


def test_compare_prints_every_requested_threshold(tmp_path, capsys, all_wrong):
  path, _ = all_wrong
  stdout = _run_cli(["compare", path, path, "--bootstrap", "200", "--thresholds",
                     "0.5,0.99999", "--no-progress"], capsys)
  rows = [line.split()[0] for line in stdout.splitlines() if line.strip()]
  for f in ("cwsa", "cwsa_plus", "selective_accuracy", "coverage"):
    assert f"{f}@0.5" in rows and f"{f}@0.99999" in rows, f
  assert "not shown" not in stdout


def test_compare_says_which_thresholds_a_long_list_leaves_out():
  from cwsa_jax.cli import _intervals
  taus = tuple(float(t) for t in np.round(np.arange(0.5, 0.95, 0.05), 2))
  shown, line = _intervals.compared_thresholds(taus)
  assert shown == list(range(_intervals.MAX_COMPARE_THRESHOLDS))
  assert line is not None and f"first {len(shown)} of {len(taus)}" in line
  assert all(f"{t:g}" in line for t in taus[len(shown):])
  assert _intervals.compared_thresholds((0.5, 0.99999)) == ([0, 1], None)


# --------------------------------------------------------------------------
# 11. --group-by: a group that retains nothing is left out of every gap
# --------------------------------------------------------------------------


def test_group_that_retains_nothing_shows_dash_and_is_left_out_of_every_gap(tmp_path, capsys):
  rng = np.random.default_rng(4)
  sites = np.array(["a", "b", "low"])[np.arange(N) % 3]
  c = np.where(sites == "low", rng.uniform(0.5, 0.85, N), rng.uniform(0.5, 1.0, N))
  ok = rng.uniform(size=N) < 0.9
  path = _confidence_csv(tmp_path / "g.csv", c, ok, sites)
  out = tmp_path / "eval"
  _run_cli(["evaluate", path, "--out", out, "--no-figures", "--bootstrap", "0",
            "--group-by", "site", "--thresholds", "0.5,0.9", "--no-progress"], capsys)
  groups = _metrics_json(out)["groups"]
  assert groups["names"] == ["a", "b", "low"]
  assert groups["sweep"]["coverage"][2][1] == 0  # "low" retains nothing at 0.9
  for field in ("cwsa", "cwsa_plus"):
    kept = [groups["sweep"][field][g][1] for g in (0, 1)]
    assert groups["gap"][field][1] == pytest.approx(max(kept) - min(kept), abs=1e-6), field
  accuracy = [groups["sweep"]["selective_accuracy"][g][1] for g in (0, 1)]
  assert groups["gap"]["selective_accuracy"][1] == pytest.approx(max(accuracy) - min(accuracy),
                                                                 abs=1e-6)
  low_row = next(line for line in (out / "report.md").read_text().splitlines()
                 if line.startswith("| low |"))
  cells = [x.strip() for x in low_row.strip("|").split("|")]
  assert cells[-3:] == ["0", "—", "—"]  # coverage, sel. accuracy, CWSA at 0.9


# --------------------------------------------------------------------------
# 13. reproduce-paper: the calibrated coverage note holds for the rows it names
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_reproduce_calibrated_coverage_note_holds_for_the_rows_it_names(tmp_path, capsys):
  out = tmp_path / "rep"
  _run_cli(["reproduce-paper", "--out", out, "--seeds", "20", "--no-progress"], capsys)
  rows = {f"{r['paper_tau']:.2f}": r for r in _metrics_json(out)["tables"]["calibrated"]["rows"]}
  note = next(line for line in (out / "report.md").read_text().splitlines()
              if line.startswith("- Every correct prediction of the calibrated generator"))
  number = r"(\d\.\d+)"
  named = re.findall(rf"row (0\.\d\d) \(τ = {number}\) (≥|≈) {number}, published {number}",
                     note)
  failing = {label for label, r in rows.items() if not r["coverage"]["reproduced"]}
  assert failing and failing <= {label for label, *_ in named}, (failing, note)
  for label, tau, kind, value, published in named:
    row = rows[label]
    assert float(tau) == pytest.approx(row["grid_tau"], abs=1e-4)
    mean, std = row["coverage"]["mean"], row["coverage"]["std"]
    if kind == "≥":  # every correct prediction retained: only at tau <= 0.8
      assert float(tau) <= 0.8 and mean >= float(value) - 1e-3, (label, mean)
    else:
      assert abs(mean - float(value)) <= 3 * std + 1e-3, (label, mean, value)
    assert float(published) == row["coverage"]["published"] < float(value)


# --------------------------------------------------------------------------
# Hostile pass, 4. An --out that cannot be written is refused before the work
# --------------------------------------------------------------------------


def _refused_before_the_metrics(argv, capsys, monkeypatch, *fragments):
  """Exit 2 with one line holding ``fragments`` and no temporary's name, and neither
  evaluate's metrics nor compare's bootstrap ran."""
  from cwsa_jax.cli import _evaluate, _intervals

  def too_late(*args, **kwargs):
    raise AssertionError("the work ran before the output path was checked")

  monkeypatch.setattr(_evaluate, "model_report", too_late)
  monkeypatch.setattr(_intervals, "comparison", too_late)
  code = cli.main([str(a) for a in argv])
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
  assert ".cwsa-tmp-" not in lines[0], lines[0]
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  return lines[0]


def test_out_name_too_long_for_its_temporary_is_refused_before_the_metrics(
    tmp_path, capsys, csv_file, monkeypatch):
  out = tmp_path / ("a" * 250)  # a legal name (<= 255 bytes); its hidden temporary is not
  before = sorted(p.name for p in tmp_path.iterdir())
  _refused_before_the_metrics(["evaluate", csv_file, "--out", out, "--no-figures"], capsys,
                              monkeypatch, str(out), "250 bytes", "choose a shorter --out")
  report = tmp_path / ("b" * 245 + ".json")
  _refused_before_the_metrics(["compare", csv_file, csv_file, "--out", report], capsys,
                              monkeypatch, str(report), "choose a shorter --out")
  assert sorted(p.name for p in tmp_path.iterdir()) == before
  # A name that leaves room for the temporary is written.
  monkeypatch.undo()
  from test_cli import run_ok
  out = tmp_path / ("a" * 200)
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--bootstrap", "0"], capsys)
  assert (out / "metrics.json").is_file()


@pytest.mark.parametrize("where", ["proc", "read-only"])
def test_out_where_nothing_can_be_created_is_refused_before_the_metrics(
    tmp_path, capsys, csv_file, monkeypatch, where):
  import os
  if where == "read-only" and os.geteuid() == 0:
    pytest.skip("root writes into a chmod 555 folder; the /proc case covers root")
  if where == "proc":  # nobody, root included, can create a folder in /proc
    out, fragments = "/proc/cwsa-x", ("/proc/cwsa-x", "cannot create a folder in /proc")
  else:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out, fragments = ro / "res", (str(ro / "res"), "not writable")
  try:
    _refused_before_the_metrics(["evaluate", csv_file, "--out", out, "--no-figures"], capsys,
                                monkeypatch, *fragments)
    _refused_before_the_metrics(["compare", csv_file, csv_file, "--out", f"{out}.json"],
                                capsys, monkeypatch, f"{out}.json")
  finally:
    if where != "proc":
      ro.chmod(0o755)
  assert not os.path.lexists(out)


# --------------------------------------------------------------------------
# Hostile pass, 6. --bins has a documented upper bound
# --------------------------------------------------------------------------


def test_bins_above_the_documented_maximum_are_refused_in_one_line(tmp_path, capsys, csv_file):
  from cwsa_jax.cli._evaluate import MAX_BINS
  assert MAX_BINS == 10_000
  check_bad(tmp_path, capsys, ["evaluate", csv_file, "--bins", MAX_BINS + 1],
            "--bins", "10,000", f"got {MAX_BINS + 1}")
  check_bad(tmp_path, capsys, ["evaluate", csv_file, "--bins", "0"], "--bins", "got 0")
  sub = [a for a in cli.build_parser()._actions if a.dest == "command"][0].choices
  bins_help = [a.help for a in sub["evaluate"]._actions if "--bins" in a.option_strings][0]
  assert "at most 10,000" in bins_help


# --------------------------------------------------------------------------
# Hostile pass, 7. Class names that are not UTF-8 (a Latin-1 file) are refused
# --------------------------------------------------------------------------


@pytest.mark.parametrize("quote", [b"", b'"'])  # NumPy's path, and the csv module's for quotes
def test_latin1_class_names_are_refused_naming_the_line_and_byte(tmp_path, capsys, quote):
  path = tmp_path / "latin1.csv"
  rows = [b"the,the,0.9", quote + b"caf\xe9" + quote + b",the,0.8", b"the,caf\xe9,0.7"]
  data = b"y_true,y_pred,confidence\n" + b"\n".join(rows) + b"\n"
  path.write_bytes(data)
  check_bad(tmp_path, capsys, ["evaluate", path], "latin1.csv", "line 3", "y_true",
            "not UTF-8", "0xe9", "save it as UTF-8")
  # The same names in UTF-8 are read, and shown as they are.
  path.write_bytes(data.replace(b"\xe9", b"\xc3\xa9"))
  assert "café" in _io.load_predictions(path).class_names


# --------------------------------------------------------------------------
# Hostile pass, 8. metrics.json writes float32 values as their shortest repr
# --------------------------------------------------------------------------


def test_json_writes_float32_values_as_their_shortest_repr():
  import json
  from cwsa_jax.cli import _json
  assert _json.plain(np.float32(0.9808)) == 0.9808  # not 0.98079997
  assert _json.plain(np.float32(0.9808), digits=None) == 0.9808
  values = _json.plain(np.array([[0.51, np.nan], [np.inf, 1e-3]], np.float32))
  assert json.dumps(values) == "[[0.51, null], [null, 0.001]]"
  assert _json.plain(np.float64(0.98079997301101685)) == 0.98079997  # float64: as before


def test_metrics_json_sweep_thresholds_are_short(tmp_path, capsys, csv_file):
  from test_cli import run_ok
  out = tmp_path / "eval"
  run_ok(["evaluate", csv_file, "--out", out, "--no-figures", "--bootstrap", "0",
          "--thresholds", "0.51,0.9"], capsys)
  text = (out / "metrics.json").read_text()
  assert "0.50999999" not in text and "0.89999998" not in text
  metrics = _metrics_json(out)  # valid JSON
  assert metrics["sweep"]["thresholds"] == [0.51, 0.9]


def test_demo_prints_why_calibrated_has_the_larger_ece(tmp_path, capsys):
  from test_cli import run_ok
  out = tmp_path / "demo"
  stdout = run_ok(["demo", "--out", out, "--seeds", "3", "--n", "400", "--no-figures"], capsys)
  report = (out / "report.md").read_text()
  assert _demo._ECE_REASON in report
  after_table = " ".join(stdout.split("\nrandom", 1)[1].split())
  assert 'Why "calibrated" has' in after_table and _demo._ECE_REASON in after_table
  assert "by E-AURC" in after_table and "report.md" in after_table


# --------------------------------------------------------------------------
# Hostile pass. compare's help offers no .npy, and compare refuses one in one line
# --------------------------------------------------------------------------


def test_compare_does_not_offer_npy_and_refuses_it_in_one_line(tmp_path, capsys, probs):
  sub = [a for a in cli.build_parser()._actions if a.dest == "command"][0].choices
  a_help = [a.help for a in sub["compare"]._actions if a.dest == "a"][0]
  assert ".npz" in a_help and "or .npy" not in a_help
  p, _ = probs
  np.save(tmp_path / "a.npy", p)
  line = check_bad(tmp_path, capsys, ["compare", tmp_path / "a.npy", tmp_path / "a.npy"],
                   "a.npy", "compare cannot read a .npy", ".npz")
  assert "pass the labels with --labels" not in line
