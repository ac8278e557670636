"""Figures: they draw what they are given, are labelled, and save as non-blank PNGs."""

import io

import jax
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from PIL import Image

from cwsa_jax import plots, sweep, synthetic
from cwsa_jax._calibration import calibration_bins
from cwsa_jax._risk_coverage import risk_coverage_curve

TAU = plots.default_thresholds()


@pytest.fixture(scope="module")
def sample():
  return synthetic.calibrated(jax.random.key(0))


@pytest.fixture(scope="module")
def batch():
  keys = jax.random.split(jax.random.key(1), 4)
  return jax.vmap(lambda k: synthetic.random(k))(keys)


def _png(fig) -> Image.Image:
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=60)
  assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
  return Image.open(io.BytesIO(buffer.getvalue()))


def _not_blank(image: Image.Image) -> None:
  pixels = np.asarray(image.convert("L"), dtype=np.float64)
  assert pixels.std() > 5  # something besides a uniform background was drawn


def _lines(ax):
  return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_default_thresholds_are_the_papers_grid():
  assert TAU.shape == (50,)
  assert TAU[0] == np.float32(0.5) and TAU[-1] == np.float32(0.99)
  np.testing.assert_allclose(np.diff(TAU), 0.01, atol=1e-6)


def test_threshold_curves_plot_the_sweep(sample):
  result = sweep(sample.confidences, sample.correct, TAU)
  fig = plots.threshold_curves(result, title="calibrated")
  assert isinstance(fig, Figure)
  (ax,) = fig.axes
  assert ax.get_title() == "calibrated"
  assert ax.get_xlabel() == "threshold τ" and ax.get_ylabel()
  assert ax.get_legend() is not None
  lines = _lines(ax)
  assert {"selective accuracy", "CWSA", "CWSA+", "coverage"} <= set(lines)
  for label, field in [("CWSA", result.cwsa), ("coverage", result.coverage),
                       ("selective accuracy", result.selective_accuracy)]:
    np.testing.assert_allclose(lines[label].get_xdata(), TAU)
    np.testing.assert_allclose(lines[label].get_ydata(), np.asarray(field), equal_nan=True)
  assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no band for one run
  _not_blank(_png(fig))


def test_threshold_curves_of_a_batch_show_mean_and_band(batch):
  result = sweep(batch.confidences, batch.correct, TAU)
  fig = plots.threshold_curves(result, labels={"cwsa": "CWSA (mine)"})
  (ax,) = fig.axes
  lines = _lines(ax)
  np.testing.assert_allclose(lines["CWSA (mine)"].get_ydata(), np.asarray(result.cwsa).mean(0),
                             rtol=1e-6)
  assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 4
  assert ax.get_ylim()[0] < -0.4  # random model: negative CWSA is visible


def test_threshold_curves_ignore_nan_in_the_mean():
  # Selective accuracy is NaN where nothing is retained; the mean skips those seeds.
  fields = dict(thresholds=np.array([0.5, 0.9]), coverage=np.array([[1.0, 0.0], [1.0, 0.5]]),
                selective_accuracy=np.array([[0.8, np.nan], [0.6, 1.0]]),
                cwsa=np.zeros((2, 2)), cwsa_plus=np.zeros((2, 2)))
  fig = plots.threshold_curves(fields)
  y = _lines(fig.axes[0])["selective accuracy"].get_ydata()
  np.testing.assert_allclose(y, [0.7, 1.0])


def test_threshold_curves_draw_into_given_axes(sample):
  fig = Figure()
  ax = fig.add_subplot()
  out = plots.threshold_curves(sweep(sample.confidences, sample.correct, TAU), ax=ax)
  assert out is fig and len(ax.get_lines()) == 4


def test_compare_models(sample, batch):
  results = {"calibrated": sweep(sample.confidences, sample.correct, TAU),
             "random": sweep(batch.confidences, batch.correct, TAU)}
  fig = plots.compare_models(results, title="two models")
  visible = [ax for ax in fig.axes if ax.get_visible()]
  assert [ax.get_title() for ax in visible] == ["selective accuracy", "CWSA", "CWSA+", "coverage"]
  for ax in visible:
    assert set(_lines(ax)) == {"calibrated", "random"}
    assert ax.get_xlabel() == "threshold τ"
  assert fig.legends and fig.get_suptitle() == "two models"
  _not_blank(_png(fig))


def test_reliability_diagram_shows_accuracy_and_counts(sample):
  bins = calibration_bins(sample.confidences, sample.correct, num_bins=10)
  fig = plots.reliability_diagram(bins, title="rel", ece=0.1234)
  ax, ax_count = fig.axes
  assert ax.get_title() == "rel" and ax.get_ylabel() == "accuracy"
  assert ax_count.get_xlabel() == "confidence" and ax_count.get_ylabel() == "samples"
  count = np.asarray(bins.count)
  heights = [p.get_height() for p in ax_count.patches]
  np.testing.assert_array_equal(heights, count)
  nonempty = count > 0
  accuracy_bars, gap_bars = ax.containers[:2]
  np.testing.assert_allclose([p.get_height() for p in accuracy_bars],
                             np.asarray(bins.accuracy)[nonempty], rtol=1e-6)
  gap = np.abs(np.asarray(bins.mean_confidence) - np.asarray(bins.accuracy))[nonempty]
  np.testing.assert_allclose([p.get_height() for p in gap_bars], gap, rtol=1e-5)
  legend_text = [t.get_text() for t in ax.get_legend().get_texts()]
  assert any("ECE = 0.1234" in t for t in legend_text)
  _not_blank(_png(fig))


def test_reliability_diagram_without_legend_and_batched_input_refused(sample):
  bins = calibration_bins(sample.confidences, sample.correct)
  fig = plots.reliability_diagram(bins, legend=False)
  assert fig.axes[0].get_legend() is None
  two = calibration_bins(np.stack([sample.confidences] * 2), np.stack([sample.correct] * 2))
  with pytest.raises(ValueError, match="one model"):
    plots.reliability_diagram(two)


def test_risk_coverage_draws_the_step_curves():
  c = np.array([0.9, 0.8, 0.8, 0.4], np.float32)
  ok = np.array([True, False, True, False])
  curve = risk_coverage_curve(c, ok)
  fig = plots.risk_coverage({"m": curve}, labels={"m": "model m"}, title="rc")
  ax_risk, ax_general = fig.axes
  assert ax_risk.get_xlabel() == "coverage" and "risk" in ax_risk.get_ylabel()
  assert fig.get_suptitle() == "rc"
  line = _lines(ax_risk)["model m"]
  # Points at coverage 0 (first group's risk), 1/4, 3/4, 1.
  np.testing.assert_allclose(line.get_xdata(), [0, 0.25, 0.75, 1.0])
  np.testing.assert_allclose(line.get_ydata(), [0, 0, 1 / 3, 0.5])
  np.testing.assert_allclose(_lines(ax_general)["model m"].get_ydata(), [0, 0, 0.25, 0.5])
  assert line.get_drawstyle() == "steps-pre"
  _not_blank(_png(fig))


def test_stress_test_plot(batch):
  grid = [0.0, 0.1, 0.2]
  values = np.array([[0.9, 0.8, 0.7], [0.92, 0.78, 0.69]])  # [seeds, P]
  fig = plots.stress_test(grid, {"accuracy": values, "ECE": np.array([0.1, 0.2, 0.3])},
                          xlabel="noise", title="noise test")
  ax = fig.axes[0]
  assert ax.get_xlabel() == "noise" and ax.get_title() == "noise test"
  np.testing.assert_allclose(_lines(ax)["accuracy"].get_ydata(), values.mean(0))
  np.testing.assert_allclose(_lines(ax)["ECE"].get_ydata(), [0.1, 0.2, 0.3])


def test_save_writes_a_png(tmp_path, sample):
  fig = plots.threshold_curves(sweep(sample.confidences, sample.correct, TAU))
  path = tmp_path / "curves.png"
  plots.save(fig, path)
  image = Image.open(path)
  assert image.format == "PNG" and image.size[0] > 500 and image.size[1] > 300
  _not_blank(image)
