"""Figures for selective prediction: metric-vs-threshold curves, reliability, risk-coverage.

Every function returns a :class:`matplotlib.figure.Figure` built without
``pyplot`` (no global state, nothing shown on screen; in a notebook the figure
displays as the cell's value), or draws into the ``ax`` / ``figure`` it is
given. :func:`save` writes a PNG with the Agg renderer.

Inputs are the library's result types: :class:`cwsa_jax.SweepResult` (or any
object with ``thresholds``, ``coverage``, ``selective_accuracy``, ``cwsa`` and
``cwsa_plus`` fields), ``CalibrationBins`` and ``RiskCoverageCurve``. Sweep
fields may carry one leading batch axis (e.g. seeds from ``jax.vmap``): the
curves then show the mean and a +-1 standard deviation band.

Examples:
  >>> import jax
  >>> from cwsa_jax import sweep, synthetic, plots
  >>> s = synthetic.calibrated(jax.random.key(0))
  >>> fig = plots.threshold_curves(sweep(s.confidences, s.correct, plots.default_thresholds()))
  >>> print(fig.axes[0].get_xlabel())
  threshold τ
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from cwsa_jax._sweep import default_thresholds  # re-exported: the grid the plots are drawn on

# matplotlib (the [plots] extra) is imported where a figure is drawn: the labels and the
# default grid serve the command line's text reports on the core install too.
if TYPE_CHECKING:
  from matplotlib.figure import Figure

__all__ = [
    "DISPLAY_COLUMNS",
    "METRIC_LABELS",
    "RELIABILITY_MIN_COUNT",
    "compare_models",
    "default_thresholds",
    "reliability_diagram",
    "risk_coverage",
    "save",
    "stress_test",
    "threshold_curves",
]

METRIC_LABELS = {
    "selective_accuracy": "selective accuracy",
    "cwsa": "CWSA",
    "cwsa_plus": "CWSA+",
    "coverage": "coverage",
    "accuracy": "accuracy",
    "ece": "ECE",
    "aurc": "AURC",
    "eaurc": "E-AURC",
    "augrc": "AUGRC",
}
# Lines drawn first are wider, so a later line lying on top of an earlier one (e.g. CWSA+ = CWSA
# where every retained prediction is right, or all four at 1.0 for a perfect model) leaves the
# earlier one visible on both sides; dash patterns and staggered markers tell them apart.
_METRIC_STYLE = {
    "selective_accuracy": dict(color="#1f77b4", linestyle="-", marker="o", linewidth=3.4),
    "cwsa": dict(color="#d62728", linestyle="-", marker="s", linewidth=2.2),
    "cwsa_plus": dict(color="#2ca02c", linestyle=(0, (5, 2.5)), marker="^", linewidth=1.6),
    "coverage": dict(color="#555555", linestyle=(0, (1, 1.5)), marker=None, linewidth=2.0),
}
_PALETTE = (
    dict(color="#1f77b4", linestyle="-", marker="o"),
    dict(color="#8c564b", linestyle="-", marker="D"),
    dict(color="#e377c2", linestyle="-", marker="v"),
    dict(color="#d62728", linestyle="-", marker="s"),
    dict(color="#d62728", linestyle=":", marker="s"),
    dict(color="#2ca02c", linestyle="-", marker="^"),
    dict(color="#2ca02c", linestyle=":", marker="^"),
    dict(color="#555555", linestyle="--", marker=None),
)
# One style per model in comparisons (colour, dash pattern and marker all differ).
_MODEL_STYLES = (
    dict(color="#1f77b4", linestyle="-", marker="o"),
    dict(color="#ff7f0e", linestyle=(0, (7, 2)), marker="s"),
    dict(color="#2ca02c", linestyle=(0, (4, 1.5, 1, 1.5)), marker="^"),
    dict(color="#d62728", linestyle=(0, (2, 2)), marker="D"),
    dict(color="#9467bd", linestyle=(0, (1, 1)), marker="v"),
    dict(color="#8c564b", linestyle="-", marker="P"),
    dict(color="#e377c2", linestyle=(0, (7, 2)), marker="X"),
    dict(color="#7f7f7f", linestyle=(0, (4, 1.5, 1, 1.5)), marker="<"),
    dict(color="#bcbd22", linestyle=(0, (2, 2)), marker=">"),
    dict(color="#17becf", linestyle=(0, (1, 1)), marker="*"),
)
# CWSA and CWSA+ are 0 by convention where nothing is retained: not a measured value.
_ZERO_WHEN_EMPTY = ("cwsa", "cwsa_plus")
_EMPTY_TEXT = "nothing retained: CWSA, CWSA+ are 0 by convention, not drawn"
_EMPTY_MARK = dict(marker="x", linestyle="none", markersize=5, markeredgewidth=1.4, zorder=5)
# Reliability-diagram bins with fewer samples are greyed out (their accuracy is too noisy).
RELIABILITY_MIN_COUNT = 10
_ACCURACY_COLOR = "#1f77b4"
_OVER_COLOR = "#d62728"
_UNDER_COLOR = "#ff9f1c"
_SPARSE_COLOR = "#d9d9d9"
_SWEEP_FIELDS = ("selective_accuracy", "cwsa", "cwsa_plus", "coverage")


def save(fig: Figure, path: str | os.PathLike, *, dpi: int = 120) -> None:
  """Writes ``fig`` as a PNG (Agg renderer)."""
  fig.savefig(os.fspath(path), dpi=dpi, format="png")


def _new_figure(size: tuple[float, float]) -> Figure:
  from matplotlib.figure import Figure  # noqa: PLC0415
  return Figure(figsize=size, layout="constrained")


def _field(result: Any, name: str) -> np.ndarray:
  if isinstance(result, Mapping):
    value = result[name]
  else:
    value = getattr(result, name)
  return np.asarray(value, dtype=np.float64)


def _mean_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
  """Mean over a leading batch axis (ignoring NaN) and its sample std; no band for 1-D input."""
  if values.ndim == 1:
    return values, None
  if values.ndim != 2:
    raise ValueError(f"expected [T] or [batch, T] values, got shape {values.shape}")
  with np.errstate(invalid="ignore"):
    finite = np.isfinite(values)
    count = finite.sum(axis=0)
    total = np.where(finite, values, 0.0).sum(axis=0)
    mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    sq = np.where(finite, (values - mean) ** 2, 0.0).sum(axis=0)
    std = np.where(count > 0, np.sqrt(sq / np.maximum(count - 1, 1)), np.nan)
  return mean, std


def _thresholds(result: Any) -> np.ndarray:
  tau = _field(result, "thresholds")
  return tau.reshape(-1, tau.shape[-1])[0] if tau.ndim > 1 else tau


def _empty(result: Any) -> np.ndarray | None:
  """True where the retained set is empty (coverage 0), [T] or [S, T]; None without coverage."""
  try:
    coverage = _field(result, "coverage")
  except (KeyError, AttributeError):
    return None
  return coverage == 0


def _defined(values: np.ndarray, name: str, empty: np.ndarray | None) -> np.ndarray:
  """``values`` with NaN where CWSA / CWSA+ only hold their empty-set convention 0."""
  if empty is None or name not in _ZERO_WHEN_EMPTY:
    return values
  return np.where(empty, np.nan, values)


def _all_empty(empty: np.ndarray | None, size: int) -> np.ndarray:
  """[T] True where every row of ``empty`` is empty."""
  if empty is None:
    return np.zeros(size, bool)
  return empty.reshape(-1, size).all(axis=0)


def _plot_metric(ax, x, values, *, style, label, band=True, markevery=None):
  """Mean line (NaN = gap) and +-1 std band of [P] or [S, P] values against ``x``."""
  style = dict(style)
  style.setdefault("linewidth", 1.8)
  mean, std = _mean_band(values)
  order = np.argsort(x)
  x, mean = x[order], mean[order]
  line, = ax.plot(x, mean, label=label, markersize=4.5, markevery=markevery, **style)
  if std is not None and band:
    std = std[order]
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, linewidth=0)
  return line, mean


def _markevery(size: int, slot: int, slots: int) -> tuple[int, int]:
  """Every ``size // 10``-th point, starting at a different offset per line (no stacked markers)."""
  step = max(1, size // 10)
  return (int(slot * step // max(slots, 1)) % step, step)


def _y_limits(ax, values: Sequence[np.ndarray]) -> None:
  finite = [v[np.isfinite(v)] for v in values]
  lowest = min((float(v.min()) for v in finite if v.size), default=0.0)
  ax.set_ylim(-1.03 if lowest < -0.5 else (-0.53 if lowest < 0 else -0.03), 1.05)
  if lowest < 0:
    ax.axhline(0.0, color="black", linewidth=0.7, alpha=0.6)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
  """(first, last) index of each run of True in a 1-D mask."""
  runs, start = [], None
  for i, m in enumerate(mask):
    if m and start is None:
      start = i
    if not m and start is not None:
      runs.append((start, i - 1))
      start = None
  if start is not None:
    runs.append((start, len(mask) - 1))
  return runs


def threshold_curves(result: Any, *, title: str | None = None, ax: Any = None,
                     metrics: Sequence[str] = _SWEEP_FIELDS, band: bool = True,
                     labels: Mapping[str, str] | None = None, marker: float | None = None,
                     marker_label: str | None = None) -> Figure:
  """Selective accuracy, CWSA, CWSA+ and coverage against the threshold (the paper's figures).

  Where the retained set S is empty (coverage 0) selective accuracy is
  undefined and CWSA, CWSA+ are 0 only by convention: those points are left out
  of the lines (a gap; with seeds, the mean is over the seeds that retain
  something) and thresholds where no seed retains anything are shaded.

  Args:
    result: a :class:`cwsa_jax.SweepResult` (or mapping with the same fields);
      fields [T], or [S, T] for S seeds (mean and a +-1 std band).
    title: the axes title (default "Selective metrics vs. threshold").
    ax: optional matplotlib Axes to draw into.
    metrics: which fields to draw.
    band: draw the std band for batched results.
    labels: optional legend text per field (default: "selective accuracy", "CWSA", ...).
    marker: optional threshold to mark with a vertical line (e.g. the one
      chosen by :func:`~cwsa_jax.select_threshold`).
    marker_label: legend text of the marker (default "τ = <marker>").

  Returns:
    The figure holding the axes.
  """
  fig = ax.figure if ax is not None else _new_figure((7.0, 4.5))
  ax = ax if ax is not None else fig.add_subplot()
  tau = _thresholds(result)
  empty = _empty(result)
  drawn = []
  for slot, name in enumerate(metrics):
    values = _defined(_field(result, name), name, empty)
    label = (labels or {}).get(name) or METRIC_LABELS.get(name, name)
    style = _METRIC_STYLE.get(name, _PALETTE[slot % len(_PALETTE)])
    _, mean = _plot_metric(ax, tau, values, style=style, label=label, band=band,
                           markevery=_markevery(tau.size, slot, len(metrics)))
    drawn.append(mean)
  _y_limits(ax, drawn)
  all_empty = _all_empty(empty, tau.size)
  if all_empty.any():
    order = np.argsort(tau)
    ordered = tau[order]
    half = 0.5 * (float(np.min(np.diff(ordered))) if ordered.size > 1 else 0.01)
    for k, (first, last) in enumerate(_runs(all_empty[order])):
      ax.axvspan(ordered[first] - half, ordered[last] + half, color="#bbbbbb", alpha=0.35,
                 linewidth=0, zorder=0, label=_EMPTY_TEXT if k == 0 else None)
  if marker is not None:
    ax.axvline(float(marker), color="black", linestyle="-.", linewidth=1.2, alpha=0.8,
               label=marker_label or f"τ = {float(marker):.3g}")
  ax.set_xlabel("threshold τ")
  ax.set_ylabel("metric value")
  ax.set_title(title or "Selective metrics vs. threshold")
  ax.grid(True, alpha=0.3)
  ax.legend(loc="best", fontsize="small", framealpha=0.9)
  return fig


def _model_style(i: int, count: int) -> dict[str, Any]:
  """Model ``i`` of ``count``: its own colour, dashes and marker; earlier models drawn wider."""
  return dict(_MODEL_STYLES[i % len(_MODEL_STYLES)],
              linewidth=min(3.4, 1.5 + 0.5 * (count - 1 - i)))


def compare_models(results: Mapping[str, Any], *, metrics: Sequence[str] = _SWEEP_FIELDS,
                   title: str | None = None, figure: Any = None, band: bool = True) -> Figure:
  """One panel per metric, one line per model, against the threshold.

  Each model has its own colour, dash pattern and marker, and models drawn
  first are drawn wider, so lines lying on top of each other stay visible.
  CWSA and CWSA+ where a model retains nothing (0 by convention) are left out
  of its line and marked with an x at 0.

  Args:
    results: model name -> sweep result (fields [T] or [S, T]).
    metrics: the panels, in order (a 2-column grid).
    title: the figure title (default "Model comparison").
    figure: optional Figure or SubFigure to draw into.
    band: draw +-1 std bands for batched results.

  Returns:
    The figure.
  """
  fig = figure if figure is not None else _new_figure((11.0, 3.6 * ((len(metrics) + 1) // 2)))
  columns = 2 if len(metrics) > 1 else 1
  rows = (len(metrics) + columns - 1) // columns
  axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).reshape(-1)
  any_empty = False
  for ax, name in zip(axes, metrics):
    drawn = []
    for i, (model, result) in enumerate(results.items()):
      tau = _thresholds(result)
      empty = _empty(result)
      style = _model_style(i, len(results))
      _, mean = _plot_metric(ax, tau, _defined(_field(result, name), name, empty), style=style,
                             label=model, band=band,
                             markevery=_markevery(tau.size, i, len(results)))
      drawn.append(mean)
      all_empty = _all_empty(empty, tau.size)
      if name in _ZERO_WHEN_EMPTY and all_empty.any():
        any_empty = True
        ax.plot(tau[all_empty], np.zeros(int(all_empty.sum())), color=style["color"],
                label="_nolegend_", **_EMPTY_MARK)
        drawn.append(np.zeros(1))
    _y_limits(ax, drawn)
    ax.set_title(METRIC_LABELS.get(name, name))
    ax.set_xlabel("threshold τ")
    ax.set_ylabel(METRIC_LABELS.get(name, name))
    ax.grid(True, alpha=0.3)
  for ax in axes[len(metrics):]:
    ax.set_visible(False)
  handles, labels = axes[0].get_legend_handles_labels()
  if any_empty:
    from matplotlib.lines import Line2D  # noqa: PLC0415
    handles.append(Line2D([], [], color="black", **_EMPTY_MARK))
    labels.append(_EMPTY_TEXT)
  fig.legend(handles, labels, loc="outside lower center",
             ncols=len(labels) if len(labels) <= 5 else (len(labels) + 1) // 2,
             fontsize="small", frameon=False, handlelength=3.5)
  fig.suptitle(title or "Model comparison")
  return fig


def _compact(n: int) -> str:
  """A sample count in at most four characters: 7, 812, 9999, 12k, 3.1M."""
  if n < 10_000:
    return str(n)
  for unit, scale in (("k", 1e3), ("M", 1e6), ("G", 1e9)):
    value = n / scale
    if value < 9.95:
      return f"{value:.1f}{unit}"
    if value < 999.5:
      return f"{value:.0f}{unit}"
  return f"{n:.0e}"


def reliability_diagram(bins: Any, *, title: str | None = None, ece: float | None = None,
                        figure: Any = None, legend: bool = True,
                        min_count: int = RELIABILITY_MIN_COUNT) -> Figure:
  """Reliability diagram: per-bin accuracy against confidence, with the bin counts below.

  Each bin with at least ``min_count`` samples is a blue bar up to its
  accuracy; its gap to the bin's mean confidence (black tick) is a hatched box
  between the two: red, filled, above the bar where confidence exceeds
  accuracy (overconfident); orange hatching without fill inside the bar where
  accuracy exceeds confidence (underconfident), so the bar's top always reads
  as the accuracy. A bin with fewer than ``min_count`` samples gets no bar
  and no gap box (its accuracy is too noisy to read): its column is shaded
  grey and its accuracy is a small grey diamond; the legend says so. The lower
  panel shows every bin's count on a log axis that starts at 0.5 (so a single
  sample is a visible bar), with the count printed above it and ``min_count``
  as a dashed line.

  Args:
    bins: ``CalibrationBins`` (``edges`` [B + 1], ``count``, ``mean_confidence``,
      ``accuracy`` [B]) from ``calibration_bins``; 1-D only.
    title: the title (default "Reliability diagram").
    ece: optional ECE value to print in the legend.
    figure: optional Figure or SubFigure to draw into (two stacked axes).
    legend: draw the legend below the axes (turn off for small panels and add a shared one).
    min_count: bins with fewer samples are shaded, not drawn as bars (>= 1).

  Returns:
    The figure.
  """
  if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
    raise ValueError(f"min_count must be an int >= 1, got {min_count!r}")
  edges = _field(bins, "edges")
  count = np.asarray(_field(bins, "count"))
  conf = _field(bins, "mean_confidence")
  acc = _field(bins, "accuracy")
  if edges.ndim != 1:
    raise ValueError(f"reliability_diagram needs one model's bins (1-D edges), got shape {edges.shape}")
  from matplotlib.colors import to_rgba  # noqa: PLC0415
  fig = figure if figure is not None else _new_figure((5.5, 6.6))
  ax, ax_count = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=(3, 1)))
  left, width = edges[:-1], np.diff(edges)
  nonempty = count > 0
  reliable = count >= min_count
  sparse = nonempty & ~reliable
  over = reliable & (conf > acc)
  under = reliable & (acc > conf)

  def bars(mask, height, label, **style):
    if mask.any():  # an empty bar container would still add a (wrongly coloured) legend entry
      ax.bar(left[mask], height[mask], width=width[mask], align="edge", label=label, **style)

  bars(reliable, acc, "accuracy in bin", color=_ACCURACY_COLOR, edgecolor="white", linewidth=0.6)
  bars(over, conf - acc, "gap: confidence > accuracy", bottom=acc[over],
       facecolor=to_rgba(_OVER_COLOR, 0.3), edgecolor=_OVER_COLOR, hatch="//", linewidth=0)
  bars(under, acc - conf, "gap: accuracy > confidence", bottom=conf[under],
       facecolor="none", edgecolor=_UNDER_COLOR, hatch="\\\\", linewidth=0)
  if sparse.any():
    bars(sparse, np.full(acc.shape, 1.02), f"< {min_count} samples: no bar (accuracy ◆ too noisy)",
         facecolor=to_rgba(_SPARSE_COLOR, 0.6), edgecolor="none", linewidth=0)
    ax.plot(left[sparse] + width[sparse] / 2, acc[sparse], linestyle="none", marker="D",
            markersize=3.5, color="#7f7f7f", label="_nolegend_")
  ax.plot(conf[nonempty], conf[nonempty], linestyle="none", marker="_", color="black",
          markersize=8, markeredgewidth=1.6, label="mean confidence in bin")
  ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect calibration")
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1.02)
  ax.set_ylabel("accuracy")
  ax.set_title(title or "Reliability diagram")
  ax.grid(True, alpha=0.3)
  colors = [_SPARSE_COLOR if s else "#7f7f7f" for s in sparse]
  ax_count.bar(left, count, width=width, align="edge", color=colors, edgecolor="white",
               linewidth=0.6)
  if nonempty.any():
    ax_count.set_yscale("log")
    # The tallest bar fills about half of the log range; the rest holds the printed counts.
    ax_count.set_ylim(0.5, 0.5 * (count.max() / 0.5) ** 1.8)
    for x, w, n in zip(left[nonempty], width[nonempty], count[nonempty]):
      ax_count.annotate(_compact(int(n)), (x + w / 2, n), xytext=(0, 1.5),
                        textcoords="offset points", rotation=90, ha="center", va="bottom",
                        fontsize=6, color="#333333")
    ax_count.axhline(min_count, color=_OVER_COLOR, linestyle="--", linewidth=0.8, alpha=0.7,
                     label=f"minimum count for a bar ({min_count})")
  ax_count.set_xlabel("confidence")
  ax_count.set_ylabel("samples")
  ax_count.grid(True, alpha=0.3)
  if legend:
    handles, labels = ax.get_legend_handles_labels()
    more = ax_count.get_legend_handles_labels()
    handles, labels = handles + more[0], labels + more[1]
    if ece is not None:
      from matplotlib.lines import Line2D  # noqa: PLC0415
      handles.append(Line2D([], [], linestyle="none"))
      labels.append(f"ECE = {float(ece):.3g}")
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="x-small",
               frameon=False)
  return fig


def _curve_points(curve: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  m = int(np.asarray(curve.num_points))
  coverage = np.asarray(curve.coverage, dtype=np.float64)
  if coverage.ndim != 1:
    raise ValueError(f"risk_coverage needs 1-D curves, got shape {coverage.shape}")
  return (coverage[:m], np.asarray(curve.risk, np.float64)[:m],
          np.asarray(curve.generalized_risk, np.float64)[:m])


# Risk-coverage curves of more than 4 * DISPLAY_COLUMNS points are thinned for drawing to
# the first, last, lowest and highest points of each 1 / DISPLAY_COLUMNS of coverage.
DISPLAY_COLUMNS = 2048


def _display_steps(coverage: np.ndarray, *values: np.ndarray,
                   columns: int = DISPLAY_COLUMNS) -> tuple[np.ndarray, ...]:
  """The points of a step curve worth drawing, over ascending ``coverage``.

  All of them when there are at most ``4 columns``. Otherwise, in each column
  of coverage width 1 / ``columns``: its first and last point and, for each of
  ``values``, the first point where it is lowest and where it is highest. The
  drawn curve then has the full curve's vertical extent in every column and
  is off by at most one column (a fraction of a pixel at the figures' sizes)
  horizontally, while a curve of 5M tie groups (5M distinct float32
  confidences) no longer makes matplotlib build paths of millions of vertices.
  """
  n = coverage.shape[0]
  if n <= 4 * columns or np.any(np.diff(coverage) < 0):
    return (coverage, *values)
  col = np.minimum((coverage * columns).astype(np.int64), columns - 1)
  starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
  counts = np.diff(np.r_[starts, n])
  keep = [starts, starts + counts - 1]
  for v in values:
    for extreme in (np.minimum, np.maximum):
      hits = np.flatnonzero(v == np.repeat(extreme.reduceat(v, starts), counts))
      keep.append(hits[np.r_[True, col[hits[1:]] != col[hits[:-1]]]])  # the first per column
  index = np.unique(np.concatenate(keep))
  return (coverage[index], *(v[index] for v in values))


def risk_coverage(curves: Any, *, title: str | None = None, figure: Any = None,
                  labels: Mapping[str, str] | None = None,
                  general_labels: Mapping[str, str] | None = None) -> Figure:
  """Selective risk and generalized risk against coverage, side by side.

  Each curve is drawn as the exact step function whose area is the "step"
  AURC / AUGRC: the risk of a tie group holds over its coverage interval.
  Curves of more than ``4 * DISPLAY_COLUMNS`` points are thinned for drawing
  to the first, last, lowest and highest points of each 1 / DISPLAY_COLUMNS
  of coverage (within a fraction of a pixel of the full curve).
  Several models get distinct colours, earlier ones drawn wider, so curves that
  coincide (e.g. two at zero risk) stay visible.

  Args:
    curves: a ``RiskCoverageCurve`` (from ``risk_coverage_curve``) or a mapping
      name -> curve for several models.
    title: the figure title (default "Risk-coverage curves").
    figure: optional Figure or SubFigure to draw into.
    labels: optional legend text per name (e.g. with the AURC value).
    general_labels: optional legend text per name on the generalized-risk panel
      (e.g. with the AUGRC value; default ``labels``).

  Returns:
    The figure.
  """
  if not isinstance(curves, Mapping):
    curves = {"model": curves}
  fig = figure if figure is not None else _new_figure((11.0, 4.3))
  ax_risk, ax_general = fig.subplots(1, 2)
  for i, (name, curve) in enumerate(curves.items()):
    coverage, risk, general = _display_steps(*_curve_points(curve))
    x = np.concatenate([[0.0], coverage])
    label = (labels or {}).get(name, name)
    general_label = (general_labels or {}).get(name, label)
    style = _model_style(i, len(curves))
    del style["marker"]
    style["linestyle"] = "-"
    ax_risk.plot(x, np.concatenate([[risk[0]], risk]), drawstyle="steps-pre", label=label, **style)
    ax_general.plot(x, np.concatenate([[0.0], general]), drawstyle="steps-pre",
                    label=general_label, **style)
  ax_risk.set_title("Selective risk (AURC = area)")
  ax_risk.set_ylabel("selective risk (error rate among accepted)")
  ax_general.set_title("Generalized risk (AUGRC = area)")
  ax_general.set_ylabel("generalized risk (errors accepted / n)")
  for ax in (ax_risk, ax_general):
    ax.set_xlabel("coverage")
    ax.set_xlim(0, 1.0)
    ax.set_ylim(bottom=-0.02 * ax.get_ylim()[1])  # a curve at zero risk stays visible
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", framealpha=0.9, handlelength=3.5)
  fig.suptitle(title or "Risk-coverage curves")
  return fig


def stress_test(parameter_values: Any, metrics: Mapping[str, Any], *, xlabel: str,
                title: str | None = None, ax: Any = None,
                empty: Mapping[str, Any] | None = None, legend: bool = True) -> Figure:
  """Scalar metrics against a stress parameter (label noise rate, class share, shift).

  Args:
    parameter_values: [P] the parameter grid.
    metrics: metric name -> values [P], or [S, P] for S seeds (mean and +-1 std band).
    xlabel: the x-axis label.
    title: the title (default "Stress test").
    ax: optional Axes to draw into.
    empty: optional metric name -> bool [P] or [S, P], True where the metric's
      retained set is empty (e.g. CWSA at a threshold nothing reaches): those
      values are left out of the mean, and points empty for every seed are
      drawn as an x at 0 instead of a line.
    legend: draw the legend (turn off for panels sharing one).

  Returns:
    The figure.
  """
  fig = ax.figure if ax is not None else _new_figure((6.0, 4.2))
  ax = ax if ax is not None else fig.add_subplot()
  x = np.asarray(parameter_values, dtype=np.float64)
  drawn = []
  marked = False
  for i, (name, values) in enumerate(metrics.items()):
    values = np.asarray(values, dtype=np.float64)
    mask = None if empty is None or name not in empty else np.asarray(empty[name], bool)
    if mask is not None:
      values = np.where(mask, np.nan, values)
    style = dict(_METRIC_STYLE.get(name, _PALETTE[i % len(_PALETTE)]))
    line, mean = _plot_metric(ax, x, values, style=style, label=METRIC_LABELS.get(name, name))
    drawn.append(mean)
    all_empty = _all_empty(mask, x.size)
    if all_empty.any():
      ax.plot(x[all_empty], np.zeros(int(all_empty.sum())), color=line.get_color(),
              label=None if marked else "x: nothing retained (CWSA := 0, not drawn)",
              **_EMPTY_MARK)
      marked = True
      drawn.append(np.zeros(1))
  _y_limits(ax, drawn)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("metric value")
  ax.set_title(title or "Stress test")
  ax.grid(True, alpha=0.3)
  if legend:
    ax.legend(loc="best", fontsize="x-small", framealpha=0.9)
  return fig
