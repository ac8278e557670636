"""Scores whose order or threshold comparisons float32 [0, 1] would lose, mapped once on the host.

A bootstrap resample only repeats and drops samples. It keeps their order, their ties and the
side of a fixed threshold each one lies on, so mapping the whole sample once, before resampling,
is exact for two kinds of metric:

* **Metrics of the scores' order alone** (:data:`ORDER_METRICS`: the risk-coverage areas, curve
  and working points, AUROC, FPR@TPR, average precision). Concrete scores that float32 [0, 1]
  would not order (real values outside [0, 1], 64-bit values finer than float32) become the
  float32 stand-ins of ``_order.stand_ins`` (bits ``2^23 + dense rank``): every resample of the
  stand-ins orders and ties like the same resample of the scores, so each resampled value (and
  the interval) is that of the scores themselves. The curve's thresholds are mapped back to the
  scores' float32 values inside the metric (``2^23 + r`` has value ``values[r]``).
* **Metrics that compare confidences with fixed thresholds** (cwsa, cwsa_plus and
  selective_accuracy at ``tau``; sweep and aumcc at ``thresholds``; ece and calibration_bins with
  equal-width bins). Concrete float64 confidences become the stand-ins of
  ``_threshold_order.stand_ins``, one confidence at a time (at most one float32 ulp away): the
  stand-ins of a resample are the resample of the stand-ins, and each keeps every float64
  comparison with the thresholds.

Which metric runs is known by identity alone, as the fast paths find theirs: ``fn`` must be the
public function itself or a keyword-only ``functools.partial`` of it. Anything else (a lambda, a
composition) is traced on float32 confidences in [0, 1] as it is: real-valued scores are refused
with a ``ValueError`` that says so (a metric of probabilities, or an unknown function, must not run
silently on stand-ins), and float64 confidences are rounded to float32, as inside ``jit``.
Equal-mass ECE bins are order statistics of each resample, not fixed thresholds: they are
rounded too. Traced scores are left as they are (inside ``jit``: float32 in [0, 1]).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _aumcc
from cwsa_jax import _calibration
from cwsa_jax import _order
from cwsa_jax import _ranking
from cwsa_jax import _risk_coverage
from cwsa_jax import _selective
from cwsa_jax import _sweep
from cwsa_jax import _threshold_order

# The public metrics whose value depends on the order of the scores alone (with any options).
ORDER_METRICS = (_risk_coverage.aurc, _risk_coverage.augrc, _risk_coverage.eaurc,
                 _risk_coverage.risk_coverage_summary, _risk_coverage.risk_at_coverage,
                 _risk_coverage.coverage_at_risk, _risk_coverage.risk_coverage_curve,
                 _ranking.auroc, _ranking.fpr_at_tpr, _ranking.average_precision)
# The metrics that compare confidences with thresholds, and the keyword that holds them.
_THRESHOLD_KEYWORDS = {_selective.cwsa: "tau", _selective.cwsa_plus: "tau",
                       _selective.selective_accuracy: "tau", _sweep.sweep: "thresholds",
                       _aumcc.aumcc: "thresholds"}
_BINNED = (_calibration.ece, _calibration.calibration_bins)
# A stand-in 2^23 + r is the float32 whose bits are that integer (``_order``'s layout).
_SMALLEST_NORMAL_BITS = 1 << 23


def _metric_of(fn: Any) -> tuple[Any, dict] | None:
  """``(metric, keywords)`` when ``fn`` is a function or a keyword-only ``functools.partial``
  of one; else None."""
  if isinstance(fn, functools.partial):
    return None if fn.args else (fn.func, dict(fn.keywords))
  return (fn, {}) if callable(fn) else None


def _name(fn: Any) -> str:
  metric = _metric_of(fn)
  return getattr(metric[0] if metric else fn, "__name__", type(fn).__name__)


def is_order_metric(fn: Any) -> bool:
  """Whether ``fn`` is one of :data:`ORDER_METRICS` or a keyword-only partial of one."""
  metric = _metric_of(fn)
  return metric is not None and any(metric[0] is m for m in ORDER_METRICS)


def _thresholds_of(fn: Any) -> tuple[np.ndarray, str] | None:
  """``(float64 thresholds, their name)`` that ``fn`` compares confidences with (for the
  threshold metrics, see the module); else None (also for options the metric refuses)."""
  metric = _metric_of(fn)
  if metric is None:
    return None
  metric, keywords = metric
  for known, name in _THRESHOLD_KEYWORDS.items():
    if metric is known:
      t = _threshold_order.thresholds64(keywords.get(name))
      return None if t is None else (t.reshape(-1), name)
  if any(metric is m for m in _BINNED):
    num_bins, binning = keywords.get("num_bins", 15), keywords.get("binning", "width")
    if (binning != "width" or isinstance(num_bins, bool)
        or not isinstance(num_bins, (int, np.integer)) or num_bins <= 1):
      return None
    return _threshold_order.width_edges(int(num_bins)), "bin edges"
  return None


def _back_where_it_was(new: np.ndarray, old: Any) -> Any:
  """Host stand-ins ``new`` on the device (and sharding) of a JAX array ``old``."""
  return jax.device_put(new, old.sharding) if isinstance(old, jax.Array) else new


def _kept(confidences: Any, thresholds: np.ndarray, name: str) -> Any:
  """Threshold stand-ins of concrete float64 confidences in [0, 1]; anything else as it is."""
  c64 = _threshold_order.wide_floats(confidences)
  if c64 is None:
    return confidences
  return _back_where_it_was(_threshold_order.stand_ins(c64, thresholds, name=name), confidences)


def _curve_of(values: np.ndarray) -> Callable:
  """``risk_coverage_curve`` of stand-ins, its thresholds mapped to the scores' float32
  ``values`` [m] (the value of stand-in ``2^23 + r`` is ``values[r]``). A new function per
  call (compiled per call): the values are constants of its program."""
  table = jnp.asarray(values)

  def curve(confidences, correct):
    result = _risk_coverage.risk_coverage_curve(confidences, correct)
    rank = lax.bitcast_convert_type(result.thresholds, jnp.int32) - _SMALLEST_NORMAL_BITS
    return result._replace(thresholds=table[jnp.clip(rank, 0, table.shape[0] - 1)])

  return curve


def _is_curve(fn: Any) -> bool:
  metric = _metric_of(fn)
  return metric is not None and metric[0] is _risk_coverage.risk_coverage_curve


def for_metric(fn: Any, confidences: Any) -> tuple[Any, Any]:
  """``(confidences, fn)`` to bootstrap in place of the arguments (see the module): order
  stand-ins for an order metric, threshold stand-ins of float64 confidences for a threshold
  metric, the inputs as they are otherwise."""
  if is_order_metric(fn):
    stand_in, values = _order.stand_ins(confidences, with_values=_is_curve(fn))
    if stand_in is confidences:
      return confidences, fn
    return (_back_where_it_was(stand_in, confidences),
            fn if values is None else _curve_of(values))
  thresholds = _thresholds_of(fn)
  if thresholds is None:
    return confidences, fn
  return _kept(confidences, *thresholds), fn


def _numeric_1d(x: Any) -> np.ndarray | None:
  """Concrete 1-D numeric (not boolean) ``x`` as a NumPy array; else None."""
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    v = np.asarray(x)
  except (TypeError, ValueError):
    return None
  return v if v.ndim == 1 and v.dtype.kind in "fiu" else None


def for_pair(fn: Any, confidences_a: Any, confidences_b: Any) -> tuple[Any, Any, Any]:
  """``(confidences_a, confidences_b, fn)`` for a paired bootstrap: as :func:`for_metric` for
  each model, but an order metric maps the two models' scores jointly (the dense ranks of
  both), so that one table of values serves the curve of either."""
  if not is_order_metric(fn):
    (a, fn_a), (b, _) = for_metric(fn, confidences_a), for_metric(fn, confidences_b)
    return a, b, fn_a
  a, b = (_order.stand_ins(x)[0] for x in (confidences_a, confidences_b))
  if a is confidences_a and b is confidences_b:
    return confidences_a, confidences_b, fn
  # One model traced or invalid (the checks name it): no joint table for the curve.
  apart = (confidences_a, confidences_b, fn) if _is_curve(fn) else (a, b, fn)
  x_a, x_b = _numeric_1d(confidences_a), _numeric_1d(confidences_b)
  if x_a is None or x_b is None:
    return apart
  joined = np.concatenate([x_a, x_b])
  both, values = _order.stand_ins(joined, with_values=_is_curve(fn))
  if both is joined:
    return apart
  return (_back_where_it_was(both[:x_a.size], confidences_a),
          _back_where_it_was(both[x_a.size:], confidences_b),
          fn if values is None else _curve_of(values))


def for_thresholds(confidences: Any, thresholds: Any) -> Any:
  """Threshold stand-ins of concrete float64 ``confidences`` for ``thresholds`` (:func:`~cwsa_jax.
  bootstrap_sweep`); anything else as it is."""
  t = _threshold_order.thresholds64(thresholds)
  return confidences if t is None else _kept(confidences, t.reshape(-1), "thresholds")


def refusal(fn: Any, confidences: jax.Array) -> str:
  """What to add to the range error of concrete ``confidences`` that are finite real-valued
  scores outside [0, 1] (empty for anything else): ``fn`` is not a metric of their order."""
  if isinstance(confidences, jax.core.Tracer):
    return ""
  v = np.asarray(confidences)
  if not v.size or not np.all(np.isfinite(v)) or (v.min() >= 0 and v.max() <= 1):
    return ""
  names = ", ".join(m.__name__ for m in ORDER_METRICS)
  return (f": {_name(fn)} is not a metric of the scores' order alone, and a metric of "
          f"probabilities needs them in [0, 1]. Real-valued scores are taken only by {names} "
          "(fn itself or a keyword-only functools.partial of one)")


def mapped(api: Callable) -> Callable:
  """A public bootstrap ``api`` with its scores mapped first (:func:`for_metric`,
  :func:`for_pair`, :func:`for_thresholds`, by the names of its arguments), outside the kit's
  entry (``_public.entry``), which rounds 64-bit JAX arrays to 32 bits."""
  signature = inspect.signature(api)

  @functools.wraps(api)
  def wrapper(*args, **kwargs):
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError:  # api names the problem
      return api(*args, **kwargs)
    arguments = bound.arguments
    if "confidences_a" in arguments:
      arguments["confidences_a"], arguments["confidences_b"], arguments["fn"] = for_pair(
          arguments["fn"], arguments["confidences_a"], arguments["confidences_b"])
    elif "fn" in arguments:
      arguments["confidences"], arguments["fn"] = for_metric(arguments["fn"],
                                                             arguments["confidences"])
    else:
      arguments["confidences"] = for_thresholds(arguments["confidences"],
                                                arguments["thresholds"])
    return api(*bound.args, **bound.kwargs)

  return wrapper
