"""Deployment threshold selection: the best threshold on a grid under a constraint."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _public
from cwsa_jax import _sweep
from cwsa_jax import _threshold_order
from cwsa_jax import _validation
from cwsa_jax._sweep import SCORE_FIELDS, default_thresholds

METRICS = SCORE_FIELDS
SLACK = 1e-6  # tolerance of the constraints for float32 rounding of coverage and risk

__all__ = ["METRICS", "SLACK", "ThresholdChoice", "default_thresholds", "select_threshold"]


class ThresholdChoice(NamedTuple):
  """The selected threshold and its operating point (Python floats)."""
  threshold: float
  coverage: float
  selective_risk: float
  value: float


@functools.lru_cache(maxsize=None)
def _default_grid() -> jax.Array:
  """:func:`default_thresholds` on the device, made once."""
  return jnp.asarray(default_thresholds())


def _check_fraction(x, name: str) -> float | None:
  if x is None:
    return None
  try:
    value = float(x)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number in [0, 1] or None, got {x!r}") from None
  if not 0.0 <= value <= 1.0:  # also rejects NaN
    raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
  return value


def select_threshold(confidences, correct, *, metric: str = "cwsa", min_coverage=None,
                     max_risk=None, thresholds=None) -> ThresholdChoice:
  """The threshold on a grid that maximises a metric subject to coverage/risk constraints.

  .. math::

    \\tau^\\star = \\arg\\max_{\\tau \\in \\mathcal{T}} m(\\tau) \\quad
    \\text{s.t.} \\quad |S_\\tau| \\ge 1, \\;
    \\mathrm{coverage}(\\tau) \\ge \\text{min\\_coverage}, \\;
    1 - \\mathrm{selective\\_accuracy}(\\tau) \\le \\text{max\\_risk},

  with m one of CWSA, CWSA+ or selective accuracy, all computed by one
  :func:`~cwsa_jax.sweep` over the grid. A threshold that retains no sample is
  never selected. Ties (equal float32 metric values) go to the smallest
  threshold, i.e. the largest coverage. The constraints are checked with a
  slack of 1e-6 (``SLACK``) for the float32 rounding of coverage and risk, so
  that a constraint met with equality (9 of 10 samples retained,
  min_coverage=0.9) holds. Runs on the host (not inside ``jit``).

  Args:
    confidences: [n] confidences in [0, 1] (validation data).
    correct: [n] bool or 0/1, or graded correctness kappa in [0, 1]
      (selective risk is then 1 - mean kappa over the retained set).
    metric: ``"cwsa"`` (default), ``"cwsa_plus"`` or ``"selective_accuracy"``.
    min_coverage: optional lower bound on coverage, in [0, 1].
    max_risk: optional upper bound on selective risk, in [0, 1].
    thresholds: optional [T] candidate thresholds in [0, 1); default
      0.50, 0.51, ..., 0.99.

  Returns:
    :class:`ThresholdChoice` ``(threshold, coverage, selective_risk, value)``,
    Python floats; ``threshold`` is the grid value the confidences were
    compared with. For float32 (and narrower) confidences it is the float32
    grid value (e.g. 0.6000000238418579 for 0.6). Concrete float64
    confidences are compared with the grid's float64 values
    (``_threshold_order``) and ``threshold`` is that float64 value (0.6 for
    0.6; the float32 value for a float32 grid; the default grid is float32):
    ``c >= threshold`` retains exactly the samples its coverage counts.
    Distinct float64 grid values that float32 merges retain the same samples
    (or the call raises), so they tie, and the smallest is reported.

  Raises:
    ValueError: when no threshold satisfies the constraints (the message gives
      the best coverage and risk the grid reaches), on an unknown metric,
      constraints outside [0, 1], or invalid inputs as in ``sweep``.
    TypeError: on traced inputs (inside ``jit``, ``vmap`` or ``grad``): the
      selection is a host-side argmax, neither traceable nor differentiable.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import select_threshold
    >>> c = jnp.array([0.95, 0.9, 0.8, 0.7, 0.6, 0.55]); ok = jnp.array([1, 1, 1, 0, 1, 0])
    >>> choice = select_threshold(c, ok, thresholds=jnp.array([0.5, 0.6, 0.75]))
    >>> print(round(choice.threshold, 4), round(choice.coverage, 4), round(choice.selective_risk, 4))
    0.75 0.5 0.0
    >>> choice = select_threshold(c, ok, min_coverage=0.8, thresholds=jnp.array([0.5, 0.6, 0.75]))
    >>> print(round(choice.threshold, 4), round(choice.coverage, 4))
    0.6 0.8333
  """
  grid64 = None
  c64 = _threshold_order.wide_floats(confidences)
  if c64 is not None:
    grid64 = _threshold_order.thresholds64(default_thresholds() if thresholds is None
                                           else thresholds)
  if grid64 is not None:  # compared in float64, by stand-ins for the float32 kernels
    grid64 = grid64.reshape(-1)
    stand_ins = _threshold_order.stand_ins(c64, grid64, name="thresholds")
    if isinstance(confidences, jax.Array):  # back where it was (device, sharding)
      stand_ins = jax.device_put(stand_ins, confidences.sharding)
    confidences = stand_ins
  choice = _select_on_entry(confidences, correct, metric=metric, min_coverage=min_coverage,
                            max_risk=max_risk, thresholds=thresholds)
  if grid64 is None:
    return choice
  # The float32 grid value chosen stands for the float64 ones that round to it: they retain
  # the same samples (the stand-ins exist), so they tie and the smallest wins.
  merged = grid64[grid64.astype(np.float32) == np.float32(choice.threshold)]
  return choice._replace(threshold=float(merged.min()))


@_public.entry
def _select_on_entry(confidences, correct, **options) -> ThresholdChoice:
  """:func:`_select_threshold` behind the kit's entry (x64 off, Explicit mesh axes Auto)."""
  return _select_threshold(confidences, correct, **options)


def _select_threshold(confidences, correct, *, metric: str = "cwsa", min_coverage=None,
                      max_risk=None, thresholds=None,
                      kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> ThresholdChoice:
  """:func:`select_threshold` with these ``kernels`` (the internal entry point)."""
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
  if not _validation.is_concrete(confidences, correct, thresholds, min_coverage, max_risk):
    raise TypeError("select_threshold runs on the host and returns Python floats: call it on "
                    "concrete arrays, outside jit/vmap/grad (inside them, use sweep())")
  min_coverage = _check_fraction(min_coverage, "min_coverage")
  max_risk = _check_fraction(max_risk, "max_risk")
  confidences = _validation.as_float_array(confidences, "confidences")
  if confidences.ndim != 1:
    raise ValueError(f"confidences must be 1-D [n], got shape {confidences.shape}")
  if thresholds is None:
    thresholds = _default_grid()
  # one transfer
  result = jax.device_get(_sweep._sweep(confidences, correct, thresholds, kernels=kernels))
  return select_from_sweep(result, metric=metric, min_coverage=min_coverage, max_risk=max_risk)


def select_from_sweep(result, *, metric: str, min_coverage: float | None,
                      max_risk: float | None) -> ThresholdChoice:
  """:func:`select_threshold`'s choice on a computed sweep (``normalize="retained"``).

  ``result`` is the :class:`~cwsa_jax.SweepResult` of the validation data on the
  candidate grid (e.g. a streamed ``SweepState``'s ``compute()``), ``metric``
  checked and the constraints checked fractions or None.
  """
  tau = np.asarray(result.thresholds, np.float32)
  cov = np.asarray(result.coverage, np.float64)
  risk = 1.0 - np.asarray(result.selective_accuracy, np.float64)
  value = np.asarray(getattr(result, metric), np.float64)
  feasible = cov > 0
  if min_coverage is not None:
    feasible &= cov >= min_coverage - SLACK
  if max_risk is not None:
    feasible &= risk <= max_risk + SLACK  # NaN risk (nothing retained) is infeasible
  if not feasible.any():
    nonempty = cov > 0
    best_cov = float(cov.max()) if nonempty.any() else 0.0
    best_risk = float(np.nanmin(risk[nonempty])) if nonempty.any() else float("nan")
    raise ValueError(
        f"no threshold in the grid [{float(tau.min()):.4g}, {float(tau.max()):.4g}] "
        f"({tau.size} values) satisfies min_coverage={min_coverage} and max_risk={max_risk}: "
        f"the grid reaches at most coverage {best_cov:.4g} and at least selective risk "
        f"{best_risk:.4g} (not necessarily at the same threshold)")
  candidates = np.flatnonzero(feasible)
  best = np.float32(value[candidates].max())
  winners = candidates[np.asarray(value[candidates], np.float32) == best]
  j = winners[np.argmin(tau[winners])]
  return ThresholdChoice(threshold=float(tau[j]), coverage=float(cov[j]),
                         selective_risk=float(risk[j]), value=float(value[j]))
