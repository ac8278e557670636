"""AUMCC: area under the metric-coverage curve of a threshold sweep.

The paper (appendix, "Threshold Discretization") sweeps tau over a grid,
builds "metric-coverage curves" and reports their area by the trapezoidal
rule, but never says which axis the area is taken over, whether it is
normalised, or what happens where no sample is retained; its published code
does not compute it at all. This module fixes those choices:

* The curve has one point per threshold, ``(coverage(tau_t), M(tau_t))``, from
  the fused :func:`cwsa_jax._sweep.sweep`. Thresholds are sorted ascending
  internally, so coverage is non-increasing along the curve.
* ``axis="coverage"`` (default): trapezoid over the thresholds' coverage
  points. ``axis="threshold"``: trapezoid against tau itself.
* The area is **not normalised**: on the coverage axis it is at most
  ``(coverage(tau_1) - coverage(tau_T)) * max |M|``. Divide by that coverage
  span (or by ``tau_T - tau_1`` on the threshold axis) for a mean metric value.
* Thresholds that retain no sample are left out of the curve (a segment with an
  empty end contributes nothing). Selective accuracy is undefined (NaN) there
  and CWSA / CWSA+ are 0 only by convention, so no metric gets area from them.
  Since thresholds are sorted, the empty ones are the highest, and the curve
  simply ends at the last threshold that retains something. If no threshold
  retains a sample the result is NaN.

Float64 inputs keep their meaning: the curve's points are comparisons
``c >= tau_t``, so concrete float64 confidences are compared with the
thresholds in float64 (``_threshold_order``: float32 stand-ins at most one ulp
away, made before the kit's entry rounds 64-bit arrays; thresholds taken in
float64 too, a Python float keeps its value), as in :func:`cwsa_jax.sweep`.
Two distinct thresholds that float32 rounds to one value with a confidence
between them raise ``ValueError``. Inside ``jit`` the inputs are float32.

Real-valued scores are refused (eager ``ValueError``, NaN inside ``jit``): the
thresholds are on the confidence scale, ``tau`` in [0, 1), and CWSA's
``(c - tau) / (1 - tau)`` reads values, so the curve depends on more than the
order of the scores.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _threshold_order
from cwsa_jax import _validation
from cwsa_jax._sweep import SCORE_FIELDS, sweep

METRICS = SCORE_FIELDS
AXES = ("coverage", "threshold")


@functools.partial(jax.jit, static_argnames=("axis",))
def area(thresholds, coverage, values, *, axis):
  """AUMCC of computed sweep fields: ``coverage`` and ``values`` [..., T] at ``thresholds`` [T]
  (any order), the trapezoid over ``axis``; NaN where no threshold retains a sample.

  Internal surface: the command line's reports use it on sweeps they have computed.
  """
  order = jnp.argsort(thresholds)
  tau = thresholds[order]
  coverage = coverage[..., order]
  values = values[..., order]
  nonempty = coverage > 0
  segment = nonempty[..., :-1] & nonempty[..., 1:]
  if axis == "coverage":
    width = coverage[..., :-1] - coverage[..., 1:]  # >= 0: coverage falls as tau rises
  else:
    width = tau[1:] - tau[:-1]
  heights = values[..., :-1] + values[..., 1:]
  area = 0.5 * jnp.sum(jnp.where(segment, width * heights, 0.0), axis=-1)
  return jnp.where(jnp.any(nonempty, axis=-1), area, jnp.nan)


@_threshold_order.at("thresholds")
@_public.entry
def aumcc(confidences: Any, correct: Any, thresholds: Any, *, metric: str = "cwsa",
          axis: str = "coverage", normalize: str = "retained") -> jax.Array:
  r"""Area under the metric-coverage curve (trapezoid over a threshold grid).

  With the thresholds sorted, ``tau_1 < ... < tau_T``, coverage ``C_t`` and
  metric ``M_t`` at ``tau_t``, and ``V`` the set of ``t`` with ``C_t > 0``:

  .. math::
    \mathrm{AUMCC}_{\text{coverage}} = \sum_{t:\,t, t+1 \in V}
      (C_t - C_{t+1})\,\frac{M_t + M_{t+1}}{2},
    \qquad
    \mathrm{AUMCC}_{\text{threshold}} = \sum_{t:\,t, t+1 \in V}
      (\tau_{t+1} - \tau_t)\,\frac{M_t + M_{t+1}}{2}

  The coverage axis is the default: it is what "metric-coverage curve" says,
  and it weights each stretch of the curve by how many samples it concerns
  rather than by the spacing of an arbitrary grid. Not normalised (see the
  module docstring).

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
      Concrete float64 confidences are compared with the thresholds in float64
      (see the module docstring).
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    thresholds: [T] thresholds in [0, 1), any order, ``T >= 2``; e.g. the
      paper's ``jnp.linspace(0.5, 0.99, 50)``. Taken in float64 for float64
      confidences; the trapezoid's widths are float32.
    metric: ``"cwsa"`` (default), ``"cwsa_plus"`` or ``"selective_accuracy"``.
    axis: ``"coverage"`` (default) or ``"threshold"``.
    normalize: CWSA denominator passed to the sweep: ``"retained"`` (the
      paper's definition, default) or ``"all"`` (its published code).

  Returns:
    float32 of shape [...]; NaN if no threshold retains any sample, and
    (inside a user's ``jit`` / ``vmap``) for invalid inputs or any invalid
    threshold.

  Gradients: the coverage points are piecewise constant in the confidences
  and the metric values carry the sweep's exact almost-everywhere derivative
  (CWSA, CWSA+; selective accuracy: 0 in c), so autodiff of the trapezoid is
  exact almost everywhere.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import aumcc
    >>> c = jnp.array([0.95, 0.9, 0.8, 0.7, 0.6])
    >>> ok = jnp.array([True, True, False, True, False])
    >>> tau = jnp.array([0.5, 0.75, 0.85])
    >>> print(round(float(aumcc(c, ok, tau, metric="selective_accuracy")), 4))
    0.42
  """
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
  if axis not in AXES:
    raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
  tau = _validation.as_float_array(thresholds, "thresholds")
  if tau.ndim != 1 or tau.shape[0] < 2:
    raise ValueError(
        f"thresholds must be 1-D with at least 2 points to form a curve, got shape {tau.shape}")
  result = sweep(confidences, correct, tau, normalize=normalize)
  # The sweep keeps the input order of the thresholds (its own ``thresholds``
  # field gains the batch axes under vmap, so use the input).
  value = area(tau.astype(jnp.float32), result.coverage, getattr(result, metric), axis=axis)
  # Coverage is never NaN for valid inputs: NaN marks an invalid row or threshold
  # (under jit/vmap), which must not silently drop out of the curve.
  return _validation.poison(value, rows=jnp.any(jnp.isnan(result.coverage), axis=-1))
