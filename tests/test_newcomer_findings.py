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
