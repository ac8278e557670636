"""Figures: they draw what they are given, are labelled, and save as non-blank PNGs."""

import io

import jax
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
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


def _half_empty_sweep():
  """A sweep whose retained set is empty at tau >= 0.7 (CWSA = CWSA+ = 0 there by convention)."""
  c = np.array([0.52, 0.55, 0.6, 0.65, 0.66], np.float32)
  ok = np.array([True, False, True, True, False])
  return sweep(c, ok, np.array([0.5, 0.6, 0.7, 0.8, 0.9], np.float32))


def test_threshold_curves_leave_empty_retained_sets_out_and_shade_them():
  result = _half_empty_sweep()
  assert np.all(np.asarray(result.cwsa)[2:] == 0)  # the convention the figure must not plot
  fig = plots.threshold_curves(result)
  ax = fig.axes[0]
  lines = _lines(ax)
  for label in ("CWSA", "CWSA+", "selective accuracy"):
    y = np.asarray(lines[label].get_ydata(), np.float64)
    assert np.all(np.isfinite(y[:2])) and np.all(np.isnan(y[2:])), label
  np.testing.assert_allclose(lines["CWSA"].get_ydata()[:2], np.asarray(result.cwsa)[:2])
  np.testing.assert_allclose(lines["coverage"].get_ydata(), np.asarray(result.coverage))  # a real 0
  spans = [p for p in ax.patches if "nothing retained" in p.get_label()]
  assert len(spans) == 1
  x = ax.transData.inverted().transform(spans[0].get_verts())[:, 0]
  assert 0.6 < x.min() < 0.7 and x.max() > 0.9
  assert any("nothing retained" in t.get_text() for t in ax.get_legend().get_texts())


def test_seed_means_skip_seeds_that_retain_nothing():
  # Seed 0 retains nothing at the second threshold (CWSA 0 by convention), seed 1 retains a sample.
  fields = dict(thresholds=np.array([0.5, 0.9]), coverage=np.array([[1.0, 0.0], [1.0, 0.5]]),
                selective_accuracy=np.array([[0.8, np.nan], [0.6, 1.0]]),
                cwsa=np.array([[0.2, 0.0], [0.4, 0.6]]), cwsa_plus=np.array([[0.3, 0.0], [0.5, 0.6]]))
  fig = plots.threshold_curves(fields)
  lines = _lines(fig.axes[0])
  np.testing.assert_allclose(lines["CWSA"].get_ydata(), [0.3, 0.6])
  np.testing.assert_allclose(lines["CWSA+"].get_ydata(), [0.4, 0.6])
  assert not [p for p in fig.axes[0].patches if "nothing retained" in p.get_label()]


def test_compare_models_mark_empty_retained_sets_instead_of_drawing_zero(sample):
  results = {"calibrated": sweep(sample.confidences, sample.correct, TAU), "sparse": _half_empty_sweep()}
  fig = plots.compare_models(results, metrics=("cwsa", "coverage"))
  ax_cwsa, ax_cov = [ax for ax in fig.axes if ax.get_visible()]
  y = np.asarray(_lines(ax_cwsa)["sparse"].get_ydata(), np.float64)
  assert np.all(np.isnan(y[2:])) and np.all(np.isfinite(y[:2]))
  marks = [ln for ln in ax_cwsa.get_lines() if ln.get_marker() == "x"]
  assert len(marks) == 1
  np.testing.assert_allclose(marks[0].get_xdata(), [0.7, 0.8, 0.9], rtol=1e-6)
  np.testing.assert_array_equal(marks[0].get_ydata(), [0, 0, 0])
  assert marks[0].get_color() == _lines(ax_cwsa)["sparse"].get_color()
  assert not [ln for ln in ax_cov.get_lines() if ln.get_marker() == "x"]  # coverage 0 is real
  assert any("nothing retained" in t.get_text() for t in fig.legends[0].get_texts())
  # Overlapping models stay distinguishable: distinct dash patterns and widths.
  a, b = (_lines(ax_cwsa)[m] for m in results)
  assert (a.get_linestyle(), a.get_linewidth()) != (b.get_linestyle(), b.get_linewidth())


def test_stress_test_marks_empty_points():
  values = np.array([[0.0, 0.5, 0.9], [0.0, 0.0, 0.8]])  # [seeds, P]
  empty = np.array([[True, False, False], [True, True, False]])
  fig = plots.stress_test([0.0, 0.1, 0.2], {"CWSA@0.9": values}, xlabel="shift",
                          empty={"CWSA@0.9": empty})
  ax = fig.axes[0]
  y = _lines(ax)["CWSA@0.9"].get_ydata()
  assert np.isnan(y[0])
  np.testing.assert_allclose(y[1:], [0.5, 0.85])  # the empty seed is left out of the mean
  (mark,) = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
  np.testing.assert_array_equal(mark.get_xdata(), [0.0])
  assert any("nothing retained" in t.get_text() for t in ax.get_legend().get_texts())


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


def _containers(ax):
  return {c.get_label(): c for c in ax.containers}


def _rgba(color):
  return np.asarray(to_rgba(color))


def _crafted_bins(min_count=10):
  """Five equal-width bins: [0, .2) one right sample at 0.1 (sparse, accuracy 1 > 0.1);
  [.4, .6) 20 samples at 0.5, 19 right (accuracy 0.95 > 0.5); [.8, 1] 30 samples at 0.9,
  12 right (accuracy 0.4 < 0.9); the other two bins empty."""
  c = np.array([0.1] + [0.5] * 20 + [0.9] * 30, np.float32)
  ok = np.array([True] + [True] * 19 + [False] + [True] * 12 + [False] * 18)
  return calibration_bins(c, ok, num_bins=5)


def test_reliability_diagram_bars_match_the_bins_in_both_gap_directions():
  bins = _crafted_bins()
  fig = plots.reliability_diagram(bins, title="rel", ece=0.1234)
  ax, ax_count = fig.axes
  assert ax.get_title() == "rel" and ax.get_ylabel() == "accuracy"
  assert ax_count.get_xlabel() == "confidence" and ax_count.get_ylabel() == "samples"
  bars = _containers(ax)
  accuracy = bars["accuracy in bin"].patches
  # Bins with >= 10 samples get an opaque blue bar from 0 to their accuracy.
  assert [round(p.get_x(), 6) for p in accuracy] == [0.4, 0.8]
  np.testing.assert_allclose([p.get_height() for p in accuracy], [0.95, 0.4], rtol=1e-6)
  np.testing.assert_allclose([p.get_y() for p in accuracy], [0, 0])
  for p in accuracy:
    np.testing.assert_allclose(p.get_facecolor(), _rgba("#1f77b4"))
  # Confidence > accuracy (bin [.8, 1]): a red, filled box from the accuracy up to the confidence.
  (over,) = bars["gap: confidence > accuracy"].patches
  assert over.get_x() == pytest.approx(0.8)
  assert over.get_y() == pytest.approx(0.4, abs=1e-6)
  assert over.get_y() + over.get_height() == pytest.approx(0.9, abs=1e-6)
  assert over.get_facecolor()[3] > 0 and over.get_facecolor()[0] > 0.5  # filled, reddish
  # Accuracy > confidence (bin [.4, .6)): a box from the confidence up to the accuracy, without
  # fill (the blue bar shows through, so the bar still reads 0.95) and hatched in another colour.
  (under,) = bars["gap: accuracy > confidence"].patches
  assert under.get_x() == pytest.approx(0.4)
  assert under.get_y() == pytest.approx(0.5, abs=1e-6)
  assert under.get_y() + under.get_height() == pytest.approx(0.95, abs=1e-6)
  assert under.get_facecolor()[3] == 0 and under.get_hatch()
  assert not np.allclose(under.get_edgecolor(), over.get_edgecolor())
  assert ax.patches.index(accuracy[0]) < ax.patches.index(under)  # drawn over the blue bar
  # The one-sample bin: no accuracy bar and no gap box, a shaded column instead, and the legend
  # states the minimum count.
  (shade,) = next(c for label, c in bars.items() if label.startswith("< 10 samples")).patches
  assert shade.get_x() == pytest.approx(0.0) and shade.get_height() >= 1.0
  assert shade.get_facecolor()[3] < 1
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert any(t.startswith("< 10 samples") for t in legend)
  assert "ECE = 0.123" in legend
  # Mean-confidence ticks at every non-empty bin.
  ticks = [ln for ln in ax.get_lines() if ln.get_label() == "mean confidence in bin"][0]
  np.testing.assert_allclose(ticks.get_ydata(), [0.1, 0.5, 0.9], rtol=1e-6)
  # Counts: every bin's bar, the sparse one lighter; a single sample stays visible above the
  # log axis' lower limit, and every non-empty bin's count is printed.
  heights = [p.get_height() for p in ax_count.patches]
  np.testing.assert_array_equal(heights, [1, 0, 20, 0, 30])
  assert ax_count.get_yscale() == "log" and ax_count.get_ylim()[0] < 1
  colors = [p.get_facecolor() for p in ax_count.patches]
  assert not np.allclose(colors[0], colors[2]) and np.allclose(colors[2], colors[4])
  assert sorted(t.get_text() for t in ax_count.texts) == ["1", "20", "30"]
  (limit,) = [ln for ln in ax_count.get_lines() if "minimum count" in ln.get_label()]
  assert list(limit.get_ydata()) == [10, 10]
  _not_blank(_png(fig))


def test_reliability_diagram_min_count_is_a_choice():
  fig = plots.reliability_diagram(_crafted_bins(), min_count=1)
  ax = fig.axes[0]
  bars = _containers(ax)
  assert not any(label.startswith("<") for label in bars)  # nothing shaded
  np.testing.assert_allclose([p.get_height() for p in bars["accuracy in bin"].patches],
                             [1.0, 0.95, 0.4], rtol=1e-6)
  under = bars["gap: accuracy > confidence"].patches
  np.testing.assert_allclose([p.get_y() for p in under], [0.1, 0.5], rtol=1e-6)
  fig = plots.reliability_diagram(_crafted_bins(), min_count=40)
  bars = _containers(fig.axes[0])
  assert "accuracy in bin" not in bars and "gap: confidence > accuracy" not in bars
  assert len(next(c for label, c in bars.items() if label.startswith("< 40")).patches) == 3
  for bad in (0, 2.5, True):
    with pytest.raises(ValueError, match="min_count"):
      plots.reliability_diagram(_crafted_bins(), min_count=bad)


def test_reliability_diagram_without_legend_and_batched_input_refused(sample):
  bins = calibration_bins(sample.confidences, sample.correct)
  fig = plots.reliability_diagram(bins, legend=False)
  assert fig.axes[0].get_legend() is None and not fig.legends
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


def test_display_steps_keep_every_column_extremes_and_ends():
  rng = np.random.default_rng(0)
  columns = 64
  n = 10 * 4 * columns
  coverage = np.sort(rng.random(n)) ** 2  # unevenly spread, some columns empty
  coverage[-1] = 1.0
  values = [np.cumsum(rng.normal(size=n)), rng.random(n)]
  thin = plots._display_steps(coverage, *values, columns=columns)
  x = thin[0]
  assert 4 * columns // 2 < x.size <= 6 * columns < n
  index = np.searchsorted(coverage, x)  # the kept points, in order, are points of the curve
  assert np.all(np.diff(index) > 0) and index[0] == 0 and index[-1] == n - 1
  col, kept_col = (np.minimum((c * columns).astype(int), columns - 1) for c in (coverage, x))
  for v, kept in zip(values, thin[1:]):
    np.testing.assert_array_equal(kept, v[index])
    for j in np.unique(col):  # the full curve's extent in every column
      assert kept[kept_col == j].min() == v[col == j].min()
      assert kept[kept_col == j].max() == v[col == j].max()


def test_display_steps_leave_short_or_unsorted_curves_alone():
  x = np.linspace(0, 1, 64)
  y = np.sin(x)
  for args, columns in (((x, y), 16), ((x[::-1].copy(), y), 8)):  # 4 per column; descending
    out = plots._display_steps(*args, columns=columns)
    assert all(a is b for a, b in zip(out, args))


def test_risk_coverage_of_many_distinct_confidences_draws_a_thinned_curve():
  rng = np.random.default_rng(1)
  n = 200_000
  c = rng.random(n).astype(np.float32)
  curve = risk_coverage_curve(c, rng.random(n) < c)
  fig = plots.risk_coverage(curve)
  m = int(curve.num_points)
  assert m > 4 * plots.DISPLAY_COLUMNS
  for ax in fig.axes:
    line = _lines(ax)["model"]
    assert len(line.get_xdata()) <= 6 * plots.DISPLAY_COLUMNS + 1
    assert line.get_xdata()[-1] == 1.0
  ys = _lines(fig.axes[0])["model"].get_ydata()
  risk = np.asarray(curve.risk)[:m]
  assert ys[1:].max() == risk.max() and ys[1:].min() == risk.min()


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
