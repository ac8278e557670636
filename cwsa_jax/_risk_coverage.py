"""Risk-coverage curve, AURC, AUGRC, E-AURC and working points, every convention named.

A selective classifier accepts the samples whose confidence is at least a
threshold. Sweeping the threshold from high to low traces the *risk-coverage
curve*: coverage (accepted fraction) against selective risk (error rate among
the accepted). Samples with equal confidence are accepted or rejected together,
so the curve has one point per *distinct* confidence ("tie groups") and no
result here depends on the order of the input (except the "published_code"
convention, which reproduces code that ignores ties).

Notation used in the docstrings: sort the ``n`` samples by decreasing
confidence; ``E_k`` is the number of errors (or the summed loss, for graded
correctness) among the first ``k``; the tie groups end at positions
``k_1 < k_2 < ... < k_G = n`` with ``k_0 = 0``. At a group end the coverage is
``k_j / n``, the selective risk ``R_j = E_{k_j} / k_j`` and the generalized risk
(Traub et al., 2024) ``G_j = E_{k_j} / n``.

Conventions (keyword ``convention=``):

* ``"step"`` (default): the exact area under the empirical step curve,
  ``sum_j (k_j - k_{j-1})/n * R_j``. Without ties this is the mean of
  ``E_k / k`` over ``k = 1..n``.
* ``"trapezoid"``: the tie-group points joined by straight lines, starting at
  coverage 0 with the first point's risk (AURC) or at ``(0, 0)`` (AUGRC).
* ``"published_code"``: what the paper's published code computes: the samples
  sorted by decreasing confidence with no tie grouping (ties keep their input
  order here; the published code's unstable sort leaves it arbitrary), risks
  ``E_k / k`` integrated by the trapezoid rule over coverage ``1/n .. 1``.

Speed: the exact metrics need one sort and one pass. For boolean correctness
the confidence bit pattern (for non-negative float32 the int32 bit pattern
orders like the value) and the error bit are packed into one int32 key, so a
single-operand integer sort does all the work ("published_code" adds the input
position in an int64 key, graded correctness sorts keys with positions and
gathers the losses). The sort is ``np.sort`` through a callback on CPU and
``lax.sort`` elsewhere (``_sort``); then one scan over the sorted samples
(sequential over cache-sized chunks on CPU, parallel prefix scans elsewhere)
feeds every result (the curve of boolean correctness: one pass of two running
counts). On CUDA GPUs, ``aurc``, ``augrc``, ``eaurc`` and
``risk_coverage_summary`` of boolean correctness ("step", "trapezoid") read
one byte per sorted sample in one Pallas kernel and a few XLA reductions
instead of the scans (``_group_areas``). The sort is most of the time on CPU, so the
speed against NumPy and torch follows NumPy's sort (``benchmarks/bench_vs_numpy.py``,
docs/performance.md). Binary losses are summed in integers (exact);
graded ones with compensated float32 sums. The sort, the scan and the kernels
are in ``_risk_coverage_kernels``, the area and E-AURC formulas in ``_areas``;
this module checks the inputs and batches the rows.

Scores: only their order counts. Concrete scores may be any finite real values
(a logit, an energy) and 64-bit scores keep their own order: where float32
[0, 1] keys would lose it (values outside [0, 1], or a 64-bit dtype whose
distinct values float32 could merge), the scores are replaced by stand-ins
that order and tie exactly like them (``_order``: dense ranks on the host), and
``risk_coverage_curve`` maps its thresholds back to the scores' values. Inside
a user's ``jit`` / ``vmap`` the same holds for float32 (and integer) scores:
the program makes the same stand-ins (one sort of order keys per row) and maps
the curve's thresholds back, in a branch taken at run time only where some
finite score lies outside [0, 1] (``lax.cond``), so [0, 1] scores run the
program they always did and give the same bits; under ``vmap`` the ``cond``
becomes a ``select`` (both branches run, each model takes its own). Every
result equals the same call on the scores' dense ranks mapped into [0, 1].
Traced 64-bit scores are ordered as float32 (the kit's entry rounds them).

Invalid values (scores NaN or infinite; correctness other than 0/1 or outside
[0, 1], targets out of range) raise
``ValueError`` on concrete inputs and give NaN inside a user's ``jax.jit`` /
``jax.vmap`` (for the invalid row, or target; ``num_points`` -1).

Gradients: every result here depends on the confidences only through their
order, so it is piecewise constant in them and its gradient in c is 0,
exact almost everywhere (``soft_cwsa`` gives a relaxed, informative one).
``risk_coverage_curve``'s ``thresholds`` field is the confidence of each
point and moves with it (derivative 1, through a custom JVP). With graded
correctness, AURC, AUGRC, the
curve's risks and ``risk_at_coverage`` are linear in kappa and autodiff
returns that derivative exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _order
from cwsa_jax import _public
from cwsa_jax import _validation
# The kernels (sort, tie-group scan, areas, curve, working points) and the result types.
from cwsa_jax._risk_coverage_kernels import RiskCoverageCurve
from cwsa_jax._risk_coverage_kernels import RiskCoverageSummary
from cwsa_jax._risk_coverage_kernels import _coverage_at_risk_impl
from cwsa_jax._risk_coverage_kernels import _curve_impl
from cwsa_jax._risk_coverage_kernels import _risk_at_coverage_impl
from cwsa_jax._risk_coverage_kernels import _summary_impl

CONVENTIONS = ("step", "trapezoid", "published_code")


# --------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------


def _check_convention(convention: str) -> None:
  if convention not in CONVENTIONS:
    raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def _prepare(confidences: Any, correct: Any, *, binary: bool = False):
  """Checked float32 scores and bool (or float32 graded) correctness [..., n], and the row flag."""
  c, k, invalid = _validation.samples(confidences, correct, scores=True, graded=not binary)
  if k.dtype != jnp.bool_:
    if _validation.is_concrete(k):
      v = np.asarray(k)
      if np.all((v == 0.0) | (v == 1.0)):
        k = jnp.asarray(v == 1.0)  # binary floats take the fast packed-sort path
    elif binary:
      k = k == 1.0  # checked to be 0/1 (flagged otherwise)
  return c, k, invalid


def _batched(fn, ndim: int, num_shared: int = 0):
  """vmaps ``fn(c, correct, *shared)`` over the leading axes of [..., n] inputs."""
  in_axes = (0, 0) + (None,) * num_shared
  for _ in range(ndim - 1):
    fn = jax.vmap(fn, in_axes=in_axes)
  return fn


# --------------------------------------------------------------------------
# Public metrics
# --------------------------------------------------------------------------


@_order.stood_in
@_public.entry
def aurc(confidences: Any, correct: Any, *, convention: str = "step") -> jax.Array:
  r"""Area under the (selective) risk-coverage curve.

  .. math::
    \text{step:}\quad \mathrm{AURC} = \sum_{j=1}^{G} \frac{k_j - k_{j-1}}{n}\,
      \frac{E_{k_j}}{k_j}
    \qquad
    \text{trapezoid:}\quad \sum_{j=1}^{G} \frac{k_j - k_{j-1}}{n}\,
      \frac{R_{j-1} + R_j}{2},\; R_0 := R_1
    \qquad
    \text{published\_code:}\quad \frac{1}{n}\sum_{k=1}^{n-1}
      \frac{E_k/k + E_{k+1}/(k+1)}{2}

  with ``k_j`` the tie-group ends of the samples sorted by decreasing confidence
  and ``E_k`` the errors among the first ``k`` (see the module docstring).

  Args:
    confidences: [..., n] scores; higher means more confident. Any finite real values
      (only their order counts; eager, and inside ``jit`` / ``vmap``: see the module
      docstring).
      Leading axes are batch axes (the functions are also ``jax.vmap``-able).
    correct: [..., n] boolean / 0-1 correctness, or graded correctness in [0, 1]
      (the loss is ``1 - correct``).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...] (a scalar for 1-D inputs) in [0, 1]; lower is better.

  Examples:
    >>> from cwsa_jax import aurc
    >>> c, ok = [0.7, 0.6, 0.8], [True, False, True]
    >>> print(round(float(aurc(c, ok)), 4), round(float(aurc(c, ok, convention="trapezoid")), 4))
    0.1111 0.0556

  References:
    Geifman & El-Yaniv, "Selective classification for deep neural networks", 2017.
  """
  return _summary(confidences, correct, convention, with_eaurc=False).aurc


@_order.stood_in
@_public.entry
def augrc(confidences: Any, correct: Any, *, convention: str = "step") -> jax.Array:
  r"""Area under the generalized risk-coverage curve (Traub et al., 2024).

  The generalized risk counts errors among the accepted samples over *all*
  samples, ``G = E_k / n``, so it stays bounded as coverage goes to 0.

  .. math::
    \text{step:}\quad \sum_{j} \frac{k_j - k_{j-1}}{n}\,\frac{E_{k_j}}{n}
    \qquad
    \text{trapezoid:}\quad \sum_{j} \frac{k_j - k_{j-1}}{n}\,
      \frac{E_{k_{j-1}} + E_{k_j}}{2n},\; E_{k_0} := 0

  ``"published_code"`` applies the published code's AURC recipe to ``G``
  (trapezoid over coverage 1/n .. 1, no tie grouping); the paper never
  computed AUGRC, so this is only for like-for-like comparisons.

  The trapezoid value satisfies
  ``AUGRC = (1 - AUROC_f) * acc * (1 - acc) + 0.5 * (1 - acc)^2`` exactly, with
  ``AUROC_f`` the AUROC of the confidence for separating correct from wrong
  (ties counted 1/2); a perfect ranking gives ``0.5 * error_rate^2``.

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...] in [0, 1]; lower is better.

  Examples:
    >>> from cwsa_jax import augrc
    >>> print(round(float(augrc([0.7, 0.6, 0.8], [True, False, True], convention="trapezoid")), 4))
    0.0556

  References:
    Traub et al., "Overcoming common flaws in the evaluation of selective
    classification systems", NeurIPS 2024.
  """
  return _summary(confidences, correct, convention, with_eaurc=False).augrc


@_order.stood_in
@_public.entry
def eaurc(confidences: Any, correct: Any, *, convention: str = "step") -> jax.Array:
  r"""Excess AURC: AURC minus the smallest AURC any scoring of the same outcomes reaches.

  .. math::
    \mathrm{E\text{-}AURC} = \mathrm{AURC}(c) - \min_{c'} \mathrm{AURC}(c')

  under the *same* convention (not the continuous formula
  ``err + (1 - err) log(1 - err)``), so it is >= 0 and exactly 0 for an optimal
  scoring:

  * ``"step"`` and ``"published_code"``: the minimum is a strict order with
    every correct sample first (ties among the errors cost area, so an
    optimal scoring must not tie them).
  * ``"trapezoid"``: the minimum is the two-level scoring (all correct tied
    above all errors tied), whose curve is the straight line from
    ``(acc, 0)`` to ``(1, err)`` that no achievable curve undercuts; its area
    is ``0.5 * err^2`` (1 when every sample is wrong).

  It is summed from the integer differences ``E_k - E*_k >= 0`` to the optimal order's
  errors (for "step" without ties ``(1/n) sum_k (E_k - E*_k) / k``; ``_areas``), every term
  nonnegative: no two nearly equal areas cancel, so a nearly optimal scoring keeps its
  small E-AURC to float32 rounding (relative), and an optimal one gives exactly 0.

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean or 0/1 correctness (graded values are rejected: the
      optimum above assumes binary losses; inside jit/vmap they give NaN).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...], >= 0.

  Examples:
    >>> from cwsa_jax import eaurc
    >>> print(round(float(eaurc([0.9, 0.8, 0.7], [True, False, True])), 4))
    0.1667
  """
  return _summary(confidences, correct, convention, binary=True).eaurc


@_order.stood_in
@_public.entry
def risk_coverage_summary(confidences: Any, correct: Any, *,
                          convention: str = "step") -> RiskCoverageSummary:
  """AURC, AUGRC and E-AURC from a single sort.

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean / 0-1 correctness, or graded correctness in [0, 1]
      (then ``eaurc`` is NaN: its optimum is defined for binary losses only).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    ``RiskCoverageSummary(aurc, augrc, eaurc)``, each float32 [...], equal to
    the separate functions.

  Examples:
    >>> from cwsa_jax import risk_coverage_summary
    >>> s = risk_coverage_summary([0.7, 0.6, 0.8], [True, False, True])
    >>> print(round(float(s.aurc), 4), round(float(s.augrc), 4), round(float(s.eaurc), 4))
    0.1111 0.1111 0.0
  """
  return _summary(confidences, correct, convention)


def risk_coverage_curve(confidences: Any, correct: Any) -> RiskCoverageCurve:
  r"""The tie-grouped risk-coverage curve (one point per distinct confidence).

  .. math::
    \left(t_j,\ \frac{k_j}{n},\ \frac{E_{k_j}}{k_j},\ \frac{E_{k_j}}{n}\right),
    \quad j = 1..G

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].

  Returns:
    ``RiskCoverageCurve`` of [..., n] arrays (``num_points`` [...]) padded with the last point (coverage 1);
    ``num_points`` says how many are distinct. Slice ``[:num_points]`` outside jit.
    ``thresholds`` are the scores' own values (as float32), eager and inside ``jit`` alike,
    also where stand-ins ordered them (real-valued or 64-bit scores).

  Examples:
    >>> from cwsa_jax import risk_coverage_curve
    >>> curve = risk_coverage_curve([0.9, 0.5, 0.9, 0.2], [True, False, False, True])
    >>> m = int(curve.num_points)
    >>> print(m, [round(float(x), 2) for x in curve.coverage[:m]], [round(float(x), 3) for x in curve.risk[:m]])
    3 [0.5, 0.75, 1.0] [0.5, 0.667, 0.5]
  """
  traced = _order.traced_stand_ins(confidences, with_values=True)
  if traced is not None:  # in the program: mapped back where the stand-ins were taken
    curve = _curve_entry(traced.scores, correct)
    return curve._replace(thresholds=_order.traced_values_of(curve.thresholds, traced))
  stand_in, values = _order.stand_ins(confidences, with_values=True)
  curve = _curve_entry(stand_in, correct)
  if values is None:
    return curve
  # The thresholds of stood-in scores are stand-ins: their scores' values (in the program
  # where traced correctness made the curve traced).
  if not _validation.is_concrete(curve.thresholds):
    known = _order.TracedStandIns(jnp.asarray(stand_in), jnp.asarray(values), jnp.bool_(True))
    return curve._replace(thresholds=_order.traced_values_of(curve.thresholds, known))
  return curve._replace(thresholds=jnp.asarray(_order.values_of(np.asarray(curve.thresholds),
                                                                values)))


@_public.entry
def _curve_entry(confidences: Any, correct: Any) -> RiskCoverageCurve:
  return _curve(confidences, correct)


def _summary(confidences: Any, correct: Any, convention: str, *, binary: bool = False,
             with_eaurc: bool = True,
             kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> RiskCoverageSummary:
  """The checked summary of [..., n] inputs (E-AURC NaN without ``with_eaurc``), invalid rows
  NaN: every area metric's body, with the kernels it runs."""
  _check_convention(convention)
  c, k, invalid = _prepare(confidences, correct, binary=binary)
  fn = functools.partial(_summary_impl, convention=convention, with_eaurc=with_eaurc,
                         kernels=kernels)
  return _validation.poison(_batched(fn, c.ndim)(c, k), rows=invalid)


def _curve(confidences: Any, correct: Any, *,
           kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> RiskCoverageCurve:
  """:func:`risk_coverage_curve` with the kernels it runs."""
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_curve_impl, kernels=kernels)
  return _validation.poison(_batched(fn, c.ndim)(c, k), rows=invalid)


def _at_targets(impl, confidences: Any, correct: Any, targets: Any, name: str, *,
               low_open: bool, kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """``impl(c, correct, targets)`` over the leading axes of the scores, for any shape of
  targets in [0, 1] (``(0, 1]`` with ``low_open``); invalid rows and targets give NaN."""
  c, k, invalid = _prepare(confidences, correct)
  t = _validation.as_float_array(targets, name).astype(jnp.float32)
  target_flag = _validation.check_range(t, name, low_open=low_open)
  result = _batched(functools.partial(impl, kernels=kernels), c.ndim, 1)(c, k, t)
  return _validation.poison(result, rows=invalid, items=target_flag)


@_order.stood_in
@_public.entry
def risk_at_coverage(confidences: Any, correct: Any, coverage: Any) -> jax.Array:
  r"""Selective risk at the smallest achievable coverage that is >= ``coverage``.

  .. math::
    \mathrm{risk@cov}(q) = \frac{E_{k_j}}{k_j},\quad
    j = \min\{j : k_j / n \ge q\}

  Achievable coverages are the tie-group ends, so no interpolation and no
  random tie-breaking is involved: the threshold retains at least ``q``.
  ``k_j / n >= q`` is tested with a slack of 2**-22 so that a decimal target
  such as 0.3 (not representable in float32) matches ``k_j / n = 0.3``.

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    coverage: target coverage(s) in (0, 1], scalar or any shape.

  Returns:
    float32 array of shape ``[...] + coverage.shape``.

  Examples:
    >>> from cwsa_jax import risk_at_coverage
    >>> c, ok = [0.9, 0.8, 0.7, 0.6], [True, True, False, True]
    >>> print([round(float(r), 4) for r in risk_at_coverage(c, ok, [0.5, 0.75, 1.0])])
    [0.0, 0.3333, 0.25]
  """
  return _at_targets(_risk_at_coverage_impl, confidences, correct, coverage, "coverage",
                     low_open=True)


@_order.stood_in
@_public.entry
def coverage_at_risk(confidences: Any, correct: Any, risk: Any) -> jax.Array:
  r"""Largest achievable coverage whose selective risk is <= ``risk``.

  .. math::
    \mathrm{cov@risk}(r) = \max\{k_j / n : E_{k_j} / k_j \le r\}
    \quad(0 \text{ if no tie group qualifies})

  The risk-coverage curve is not monotone, so this is the best working point,
  not the first crossing. ``E_{k_j} / k_j <= r`` is tested with a slack of
  2**-22 so that a decimal target such as 0.1 matches a risk of exactly 1/10.

  Args:
    confidences: [..., n] scores: any finite real values (also inside ``jit``).
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    risk: target selective risk(s) in [0, 1], scalar or any shape.

  Returns:
    float32 array of shape ``[...] + risk.shape``.

  Examples:
    >>> from cwsa_jax import coverage_at_risk
    >>> c, ok = [0.9, 0.8, 0.7, 0.6], [True, True, False, True]
    >>> print([round(float(x), 2) for x in coverage_at_risk(c, ok, [0.0, 0.25, 0.3])])
    [0.5, 1.0, 1.0]
  """
  return _at_targets(_coverage_at_risk_impl, confidences, correct, risk, "risk", low_open=False)
