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
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "METRIC_LABELS",
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
_METRIC_STYLE = {
    "selective_accuracy": dict(color="#1f77b4", linestyle="-", marker="o"),
    "cwsa": dict(color="#d62728", linestyle="-", marker="s"),
    "cwsa_plus": dict(color="#2ca02c", linestyle="-", marker="^"),
    "coverage": dict(color="#555555", linestyle="--", marker=None),
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
_SWEEP_FIELDS = ("selective_accuracy", "cwsa", "cwsa_plus", "coverage")


def default_thresholds() -> np.ndarray:
  """The paper's grid 0.50, 0.51, ..., 0.99 (float32, exact two-decimal values)."""
  return np.round(0.5 + 0.01 * np.arange(50), 2).astype(np.float32)


def save(fig: Figure, path: str | os.PathLike, *, dpi: int = 120) -> None:
  """Writes ``fig`` as a PNG (Agg renderer)."""
  fig.savefig(os.fspath(path), dpi=dpi, format="png")


def _new_figure(size: tuple[float, float]) -> Figure:
  return Figure(figsize=size, layout="constrained")


def _field(result: Any, name: str) -> np.ndarray:
  if isinstance(result, Mapping):
    value = result[name]
  else:
    value = getattr(result, name)
  return np.asarray(value, dtype=np.float64)


def _mean_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
  """Mean over a leading batch axis (ignoring NaN) and its std; no band for 1-D input."""
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
    std = np.where(count > 0, np.sqrt(sq / np.maximum(count, 1)), np.nan)
  return mean, std


def _thresholds(result: Any) -> np.ndarray:
  tau = _field(result, "thresholds")
  return tau.reshape(-1, tau.shape[-1])[0] if tau.ndim > 1 else tau


def _plot_metric(ax, tau, values, name, *, label=None, color=None, linestyle=None, band=True,
                 markevery=None):
  style = dict(_METRIC_STYLE.get(name, {}))
  if color is not None:
    style["color"] = color
  if linestyle is not None:
    style["linestyle"] = linestyle
  mean, std = _mean_band(values)
  order = np.argsort(tau)
  tau, mean = tau[order], mean[order]
  if markevery is None:
    markevery = max(1, len(tau) // 10)
  line, = ax.plot(tau, mean, label=label or METRIC_LABELS.get(name, name), markersize=4,
                  markevery=markevery, linewidth=1.8, **style)
  if std is not None and band:
    std = std[order]
    ax.fill_between(tau, mean - std, mean + std, color=line.get_color(), alpha=0.18, linewidth=0)
  return line


def _y_limits(ax, values: Sequence[np.ndarray]) -> None:
  finite = [v[np.isfinite(v)] for v in values]
  lowest = min((float(v.min()) for v in finite if v.size), default=0.0)
  ax.set_ylim(-1.03 if lowest < -0.5 else (-0.53 if lowest < 0 else -0.02), 1.03)
  if lowest < 0:
    ax.axhline(0.0, color="black", linewidth=0.7, alpha=0.6)


def threshold_curves(result: Any, *, title: str | None = None, ax: Any = None,
                     metrics: Sequence[str] = _SWEEP_FIELDS, band: bool = True,
                     labels: Mapping[str, str] | None = None, marker: float | None = None,
                     marker_label: str | None = None) -> Figure:
  """Selective accuracy, CWSA, CWSA+ and coverage against the threshold (the paper's figures).

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
  drawn = []
  for name in metrics:
    values = _field(result, name)
    _plot_metric(ax, tau, values, name, band=band, label=(labels or {}).get(name))
    drawn.append(_mean_band(values)[0])
  _y_limits(ax, drawn)
  if marker is not None:
    ax.axvline(float(marker), color="black", linestyle="-.", linewidth=1.2, alpha=0.8,
               label=marker_label or f"τ = {float(marker):.3g}")
  ax.set_xlabel("threshold τ")
  ax.set_ylabel("metric value")
  ax.set_title(title or "Selective metrics vs. threshold")
  ax.grid(True, alpha=0.3)
  ax.legend(loc="best", fontsize="small", framealpha=0.9)
  return fig


def compare_models(results: Mapping[str, Any], *, metrics: Sequence[str] = _SWEEP_FIELDS,
                   title: str | None = None, figure: Any = None, band: bool = True) -> Figure:
  """One panel per metric, one line per model, against the threshold.

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
  colors = [f"C{i % 10}" for i in range(len(results))]
  for ax, name in zip(axes, metrics):
    drawn = []
    for color, (model, result) in zip(colors, results.items()):
      values = _field(result, name)
      _plot_metric(ax, _thresholds(result), values, name, label=model, color=color,
                   linestyle="-", band=band)
      drawn.append(_mean_band(values)[0])
    _y_limits(ax, drawn)
    ax.set_title(METRIC_LABELS.get(name, name))
    ax.set_xlabel("threshold τ")
    ax.set_ylabel(METRIC_LABELS.get(name, name))
    ax.grid(True, alpha=0.3)
  for ax in axes[len(metrics):]:
    ax.set_visible(False)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6),
             fontsize="small", frameon=False)
  fig.suptitle(title or "Model comparison")
  return fig


def reliability_diagram(bins: Any, *, title: str | None = None, ece: float | None = None,
                        figure: Any = None, legend: bool = True) -> Figure:
  """Reliability diagram: per-bin accuracy against confidence, with the bin counts below.

  Args:
    bins: ``CalibrationBins`` (``edges`` [B + 1], ``count``, ``mean_confidence``,
      ``accuracy`` [B]) from ``calibration_bins``; 1-D only.
    title: the title (default "Reliability diagram").
    ece: optional ECE value to print in the legend.
    figure: optional Figure or SubFigure to draw into (two stacked axes).
    legend: draw the legend (turn off for small panels and add a shared one).

  Returns:
    The figure.
  """
  edges = _field(bins, "edges")
  count = np.asarray(_field(bins, "count"))
  conf = _field(bins, "mean_confidence")
  acc = _field(bins, "accuracy")
  if edges.ndim != 1:
    raise ValueError(f"reliability_diagram needs one model's bins (1-D edges), got shape {edges.shape}")
  fig = figure if figure is not None else _new_figure((5.5, 5.5))
  ax, ax_count = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=(3, 1)))
  left, width = edges[:-1], np.diff(edges)
  nonempty = count > 0
  ax.bar(left[nonempty], acc[nonempty], width=width[nonempty], align="edge", color="#1f77b4",
         edgecolor="white", linewidth=0.6, label="accuracy in bin")
  gap_low = np.minimum(acc, conf)[nonempty]
  ax.bar(left[nonempty], np.abs(conf - acc)[nonempty], bottom=gap_low, width=width[nonempty],
         align="edge", color="#d62728", alpha=0.35, hatch="//", edgecolor="#d62728", linewidth=0,
         label="gap to mean confidence")
  ax.plot(conf[nonempty], conf[nonempty], linestyle="none", marker="_", color="black",
          markersize=8, label="mean confidence in bin")
  ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect calibration")
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1.02)
  ax.set_ylabel("accuracy")
  ax.set_title(title or "Reliability diagram")
  ax.grid(True, alpha=0.3)
  handles, labels = ax.get_legend_handles_labels()
  if ece is not None:
    labels = [f"{labels[0]} (ECE = {float(ece):.4f})"] + labels[1:]
  if legend:
    ax.legend(handles, labels, loc="upper left", fontsize="x-small", framealpha=0.9)
  ax_count.bar(left, count, width=width, align="edge", color="#7f7f7f", edgecolor="white",
               linewidth=0.6)
  ax_count.set_yscale("log" if count.max(initial=0) > 0 else "linear")
  if count.max(initial=0) > 0:
    ax_count.set_ylim(0.8, count.max() * 3)
  ax_count.set_xlabel("confidence")
  ax_count.set_ylabel("samples")
  ax_count.grid(True, alpha=0.3)
  return fig


def _curve_points(curve: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  m = int(np.asarray(curve.num_points))
  coverage = np.asarray(curve.coverage, dtype=np.float64)
  if coverage.ndim != 1:
    raise ValueError(f"risk_coverage needs 1-D curves, got shape {coverage.shape}")
  return (coverage[:m], np.asarray(curve.risk, np.float64)[:m],
          np.asarray(curve.generalized_risk, np.float64)[:m])


def risk_coverage(curves: Any, *, title: str | None = None, figure: Any = None,
                  labels: Mapping[str, str] | None = None) -> Figure:
  """Selective risk and generalized risk against coverage, side by side.

  Each curve is drawn as the exact step function whose area is the "step"
  AURC / AUGRC: the risk of a tie group holds over its coverage interval.

  Args:
    curves: a ``RiskCoverageCurve`` (from ``risk_coverage_curve``) or a mapping
      name -> curve for several models.
    title: the figure title (default "Risk-coverage curves").
    figure: optional Figure or SubFigure to draw into.
    labels: optional legend text per name (e.g. with the AURC value).

  Returns:
    The figure.
  """
  if not isinstance(curves, Mapping):
    curves = {"model": curves}
  fig = figure if figure is not None else _new_figure((11.0, 4.3))
  ax_risk, ax_general = fig.subplots(1, 2)
  for i, (name, curve) in enumerate(curves.items()):
    coverage, risk, general = _curve_points(curve)
    x = np.concatenate([[0.0], coverage])
    label = (labels or {}).get(name, name)
    ax_risk.plot(x, np.concatenate([[risk[0]], risk]), drawstyle="steps-pre", color=f"C{i % 10}",
                 linewidth=1.6, label=label)
    ax_general.plot(x, np.concatenate([[0.0], general]), drawstyle="steps-pre",
                    color=f"C{i % 10}", linewidth=1.6, label=label)
  ax_risk.set_title("Selective risk (AURC = area)")
  ax_risk.set_ylabel("selective risk (error rate among accepted)")
  ax_general.set_title("Generalized risk (AUGRC = area)")
  ax_general.set_ylabel("generalized risk (errors accepted / n)")
  for ax in (ax_risk, ax_general):
    ax.set_xlabel("coverage")
    ax.set_xlim(0, 1.0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", framealpha=0.9)
  fig.suptitle(title or "Risk-coverage curves")
  return fig


def stress_test(parameter_values: Any, metrics: Mapping[str, Any], *, xlabel: str,
                title: str | None = None, ax: Any = None) -> Figure:
  """Scalar metrics against a stress parameter (label noise rate, class share, shift).

  Args:
    parameter_values: [P] the parameter grid.
    metrics: metric name -> values [P], or [S, P] for S seeds (mean and +-1 std band).
    xlabel: the x-axis label.
    title: the title (default "Stress test").
    ax: optional Axes to draw into.

  Returns:
    The figure.
  """
  fig = ax.figure if ax is not None else _new_figure((6.0, 4.2))
  ax = ax if ax is not None else fig.add_subplot()
  x = np.asarray(parameter_values, dtype=np.float64)
  drawn = []
  for i, (name, values) in enumerate(metrics.items()):
    values = np.asarray(values, dtype=np.float64)
    mean, std = _mean_band(values)
    style = dict(_METRIC_STYLE.get(name, _PALETTE[i % len(_PALETTE)]))
    line, = ax.plot(x, mean, label=METRIC_LABELS.get(name, name), markersize=4, linewidth=1.8,
                    **style)
    if std is not None:
      ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, linewidth=0)
    drawn.append(mean)
  _y_limits(ax, drawn)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("metric value")
  ax.set_title(title or "Stress test")
  ax.grid(True, alpha=0.3)
  ax.legend(loc="best", fontsize="x-small", framealpha=0.9)
  return fig
