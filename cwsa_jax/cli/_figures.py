"""The reports' PNG figures, drawn with :mod:`cwsa_jax.plots` (matplotlib, the [plots] extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import cwsa_jax as cw
from cwsa_jax import plots
from cwsa_jax.cli._format import fmt
from cwsa_jax.cli._metrics import Deployment, Metrics
from cwsa_jax.cli._settings import Settings

# The CWSA the deployment threshold maximises, in a legend entry (beside a "CWSA ÷ n" curve
# under --normalize all).
SELECTION_CWSA_SHORT = "CWSA ÷ |S|"


def reliability_caption(settings: Settings) -> str:
  """Caption of a reliability diagram: bins, gap colours and the minimum count."""
  kind = "equal-width" if settings.binning == "width" else "equal-mass"
  return (f"Reliability diagram, {settings.num_bins} {kind} bins: accuracy per bin (blue) against "
          "its mean confidence (black tick); red boxes: confidence above accuracy, orange "
          f"hatching: accuracy above confidence; bins with fewer than {plots.RELIABILITY_MIN_COUNT} "
          "samples in grey without a gap box. Below: the sample count per bin (log axis).")


def threshold_marker(deployment: Deployment | None) -> dict[str, Any]:
  """``marker`` and ``marker_label`` of :func:`cwsa_jax.plots.threshold_curves`: the selected
  threshold, or none when there is no feasible one."""
  if deployment is None or deployment.choice is None:
    return {"marker": None, "marker_label": None}
  where = (f"chosen on {Path(deployment.selected_on).name}, coverage there ≥ "
           if deployment.held_out else "in-sample, coverage ≥ ")
  return {"marker": deployment.choice.threshold,
          "marker_label": f"selected τ = {deployment.choice.threshold:.3g} "
                          f"(best {SELECTION_CWSA_SHORT}, {where}{deployment.min_coverage:g})"}


def legend_below(fig: Any, axes: Iterable[Any], *, max_columns: int | None = None) -> None:
  """One legend below ``fig`` with every distinct label of ``axes``, in one row of at most
  ``max_columns`` entries (then more rows)."""
  legend: dict[str, Any] = {}
  for ax in axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(label, handle)
  fig.legend(list(legend.values()), list(legend), loc="outside lower center",
             ncols=min(len(legend), max_columns or len(legend)), frameon=False, fontsize="small")


def model_figures(out_dir: Path, confidences: Any, correct: Any, metrics: Metrics,
                  settings: Settings, *, name: str,
                  deployment: Deployment | None = None) -> list[tuple[str, str]]:
  """threshold_curves.png, reliability_diagram.png, risk_coverage.png; returns (file, caption).

  A feasible ``deployment`` threshold is marked on the curves.
  """
  bins = cw.calibration_bins(confidences, correct, num_bins=settings.num_bins,
                             binning=settings.binning)
  return draw_model_figures(out_dir, metrics, settings, bins=bins,
                            curve=cw.risk_coverage_curve(confidences, correct), name=name,
                            deployment=deployment)


RISK_COVERAGE_CAPTION = "Selective risk and generalized risk vs. coverage."


def draw_model_figures(out_dir: Path, metrics: Metrics, settings: Settings, *,
                       bins: cw.CalibrationBins, curve: cw.RiskCoverageCurve, name: str,
                       deployment: Deployment | None = None,
                       curve_caption: str = RISK_COVERAGE_CAPTION) -> list[tuple[str, str]]:
  """:func:`model_figures` from the reliability ``bins`` and the risk-coverage ``curve``
  (computed from the rows, or from streamed states)."""
  figures = []
  cwsa_label = "CWSA" if settings.normalize == "retained" else "CWSA ÷ n (published code)"
  fig = plots.threshold_curves(metrics.sweep, title=f"{name}: selective metrics vs. threshold",
                               labels={"cwsa": cwsa_label}, **threshold_marker(deployment))
  plots.save(fig, out_dir / "threshold_curves.png")
  figures.append(("threshold_curves.png", "Selective accuracy, CWSA, CWSA+ and coverage vs. threshold "
                  "(thresholds that retain nothing are shaded and left out of the lines)."))
  fig = plots.reliability_diagram(bins, title=f"{name}: reliability diagram",
                                  ece=float(metrics.ece))
  plots.save(fig, out_dir / "reliability_diagram.png")
  figures.append(("reliability_diagram.png", reliability_caption(settings)))
  label = f"{name} (AURC {fmt(metrics.aurc)}, AUGRC {fmt(metrics.augrc)})"
  fig = plots.risk_coverage({name: curve}, title=f"{name}: risk-coverage curves",
                            labels={name: label})
  plots.save(fig, out_dir / "risk_coverage.png")
  figures.append(("risk_coverage.png", curve_caption))
  return figures
