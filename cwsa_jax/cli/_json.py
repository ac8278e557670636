"""The reports' typed results as the plain JSON of ``metrics.json``.

A NamedTuple becomes an object with its fields in order, an array a list, a
float is rounded to 8 digits and NaN becomes ``null``. The bootstrap results
(``intervals``, ``compare``) are written unrounded, as the bootstrap gave them.
A float32 value is written as the shortest decimal that reads back as the same
float32 (``0.9808``, not its float64 expansion ``0.98079997``); float64 values
are written as they are.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cwsa_jax.cli._intervals import Comparison, Intervals, unresampled_note
from cwsa_jax.cli._metrics import (IN_SAMPLE, Deployment, GroupBreakdown, Metrics, ModelReport,
                                   PeerMetrics)
from cwsa_jax.cli._settings import SELECTION_METRIC, Settings, aumcc_caveat


def _is_record(x: Any) -> bool:
  return isinstance(x, tuple) and hasattr(x, "_fields")


def _tolist(x: Any) -> Any:
  """``np.asarray(x).tolist()``, with each float32 (or float16) value as the shortest decimal
  that reads back as the same value (``str`` of a NumPy float32 is that decimal)."""
  array = np.asarray(x)
  if not (array.dtype.kind == "f" and array.dtype.itemsize < 8):
    return array.tolist()
  short = [float(str(value)) for value in array.ravel()]
  return np.array(short, dtype=np.float64).reshape(array.shape).tolist()


def plain(x: Any, *, digits: int | None = 8) -> Any:
  """``x`` as JSON values: records as objects, arrays as lists, floats rounded to ``digits``
  (NaN and infinities as None); with ``digits=None`` numbers are kept as they are."""
  if _is_record(x):
    return {name: plain(value, digits=digits) for name, value in zip(x._fields, x)}
  if isinstance(x, (list, tuple)) and x and _is_record(x[0]):
    return [plain(value, digits=digits) for value in x]
  if digits is None:
    return _tolist(x) if hasattr(x, "__array__") else x
  array = np.asarray(x)
  if array.ndim:
    return [plain(value, digits=digits) for value in array]
  value = _tolist(array)
  if isinstance(value, float):
    return round(value, digits) if math.isfinite(value) else None
  return value


def settings_json(settings: Settings) -> dict[str, Any]:
  """The conventions behind the numbers (``settings`` in every metrics.json)."""
  return {
      "thresholds": [round(t, 6) for t in settings.thresholds],
      "ece": {"num_bins": settings.num_bins, "binning": settings.binning,
              "norm": settings.ece_norm},
      "aurc_convention": settings.aurc_convention,
      "cwsa_normalize": settings.normalize,
      "aumcc": {"axis": settings.aumcc_axis, "rule": "trapezoid", "normalized": False,
                "caveat": aumcc_caveat(settings.aumcc_axis)},
      "threshold_selection": {"metric": SELECTION_METRIC, "min_coverage": settings.min_coverage},
  }


def metrics_json(metrics: Metrics) -> dict[str, Any]:
  """``n``, the scalar metrics, ``aumcc`` and ``sweep`` (each value a ``{"mean", "std"}`` object
  in the summaries over seeds)."""
  return plain(metrics)


def selected_on_json(deployment: Deployment) -> str | dict[str, Any]:
  """Where the threshold was chosen: ``{"file": ..., "held_out": true}`` (``--select-on``) or
  :data:`~cwsa_jax.cli._metrics.IN_SAMPLE`."""
  if deployment.held_out:
    return {"file": deployment.selected_on, "held_out": True}
  return IN_SAMPLE


def deployment_json(deployment: Deployment) -> dict[str, Any]:
  """``metric``, ``min_coverage``, ``feasible``, then the threshold and its operating point on
  the data it was chosen on or, when infeasible, the ``reason``; then ``selected_on`` and, for a
  held-out choice, the ``evaluated`` data's operating point at that threshold."""
  out = {"metric": deployment.metric, "min_coverage": deployment.min_coverage,
         "feasible": deployment.feasible}
  if deployment.choice is None:
    out["reason"] = deployment.reason
  else:
    out.update(deployment.choice._asdict())
  out = {key: plain(value) for key, value in out.items()}
  out["selected_on"] = selected_on_json(deployment)
  if deployment.evaluated is not None:
    out["evaluated"] = plain(deployment.evaluated)
  return out


def groups_json(groups: GroupBreakdown) -> dict[str, Any]:
  """A per-class or per-group breakdown; ``column`` only for ``--group-by``."""
  out = plain(groups)
  if groups.column is None:
    del out["column"]
  return out


def report_json(report: ModelReport) -> dict[str, Any]:
  """``evaluate``'s metrics.json body: the metrics, then what it adds about the model."""
  out = metrics_json(report.metrics)
  if report.scoring is not None:
    out.update(plain(report.scoring))
  if report.peers is not None:
    out.update(peers_json(report.peers))
  out["threshold_choice"] = deployment_json(report.threshold_choice)
  for name in ("classes", "groups"):
    if getattr(report, name) is not None:
      out[name] = groups_json(getattr(report, name))
  if report.worst is not None:
    out["worst"] = plain(report.worst)
  return out


def peers_json(peers: PeerMetrics) -> dict[str, Any]:
  """The peer metrics that apply (``smooth_ece`` not for real-valued scores, ``classwise_ece``
  only with per-class probabilities: a metric that does not apply is left out, as Brier and
  NLL are)."""
  return {name: plain(value) for name, value in peers._asdict().items() if value is not None}


def _per_metric(values: Any, peers: PeerMetrics | None = None,
                only: frozenset[str] | None = None) -> dict[str, Any]:
  # By metric name in alphabetical order, as the bootstrap's dictionaries came out before;
  # the peer metrics that apply join them in that order; ``only``: the metrics reported.
  items = dict(values._asdict())
  if peers is not None:
    items.update((k, v) for k, v in peers._asdict().items() if v is not None)
  return {name: _tolist(value) for name, value in sorted(items.items())
          if only is None or name in only}


def intervals_json(intervals: Intervals, only: frozenset[str] | None = None) -> dict[str, Any]:
  """``method``, ``resampling``, ``level``, ``num_resamples``, ``seed`` and the ``low`` /
  ``high`` ends (the peer metrics' too, from the same resamples; ``only``: of these metrics)."""
  peers = intervals.peers
  ends = {}
  for end in ("low", "high"):
    values = _per_metric(getattr(intervals, end), None if peers is None else getattr(peers, end),
                         only)
    # Metrics reported without an interval (--stream's peer metrics): null ends, in order.
    values.update((name, None) for name in intervals.unresampled)
    ends[end] = dict(sorted(values.items()))
  out = {"method": "percentile bootstrap", "resampling": intervals.resampling,
         "level": intervals.level,
         "num_resamples": intervals.num_resamples, "seed": intervals.seed, **ends}
  if intervals.unresampled:
    out["note"] = unresampled_note(intervals.unresampled)
  return out


def comparison_json(comparison: Comparison) -> dict[str, Any]:
  """The paired bootstrap: A, B, A - B, its interval and p-value of every metric."""
  peers = comparison.peers
  return {"method": "paired percentile bootstrap", "resampling": comparison.resampling,
          "level": comparison.level,
          "num_resamples": comparison.num_resamples, "seed": comparison.seed,
          **{name: _per_metric(getattr(comparison, name),
                               None if peers is None else getattr(peers, name))
             for name in ("estimate_a", "estimate_b", "difference", "low", "high", "p_value")}}
