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

Speed: the exact metrics need one sort. For boolean correctness the confidence
bit pattern (for non-negative float32 the int32 bit pattern orders like the
value) and the error bit are packed into one int32 key, so a single-operand
integer sort does all the work; XLA sorts that about as fast as NumPy's argsort
on CPU, where a float argsort is about 15x slower (see
``benchmarks/bench_aurc.py``). Graded correctness adds a binary search per
sample (about 3x the sort); the "published_code" convention needs a stable
two-operand sort (about 10x).

Invalid values (scores outside [0, 1] or not finite, correctness other than
0/1 or outside [0, 1], targets out of range) raise ``ValueError`` on concrete
inputs and give NaN inside a user's ``jax.jit`` / ``jax.vmap`` (for the
invalid row, or target; ``num_points`` -1). Scores must lie in [0, 1] while
``_validation.SCORES_IN_UNIT_INTERVAL`` is True (the one switch to accept
any finite real score).

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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _validation

CONVENTIONS = ("step", "trapezoid", "published_code")
# Working-point comparisons allow this much (about 2.4e-7): float32 cannot hold
# decimal targets such as 0.1 or 0.3 exactly, and XLA's float32 division on CPU
# may be 1 ulp off, yet a coverage k/n or risk E/k equal to the target must count.
_TARGET_SLACK = 2.0**-22


class RiskCoverageCurve(NamedTuple):
  """Tie-grouped risk-coverage curve, padded to a fixed length ``n``.

  Points are ordered by decreasing threshold (increasing coverage). Only the
  first ``num_points`` entries are distinct points; the rest repeat the last
  point (coverage 1), so plotting or integrating the padded arrays is harmless.

  Attributes:
    thresholds: [..., n] confidence of each point's tie group (accept ``c >= t``).
    coverage: [..., n] accepted fraction ``k_j / n``.
    risk: [..., n] selective risk ``E_{k_j} / k_j``.
    generalized_risk: [..., n] generalized risk ``E_{k_j} / n``.
    num_points: [...] int32, number of distinct confidences.
  """
  thresholds: jax.Array
  coverage: jax.Array
  risk: jax.Array
  generalized_risk: jax.Array
  num_points: jax.Array


class RiskCoverageSummary(NamedTuple):
  """AURC, AUGRC and E-AURC computed from one sort (each of shape [...])."""
  aurc: jax.Array
  augrc: jax.Array
  eaurc: jax.Array


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


def _float_key(c: jax.Array) -> jax.Array:
  """int32 key that orders like ``c`` for c in [0, 1] (-0.0 and NaN map to 0)."""
  c = jnp.minimum(jnp.where(c > 0, c, jnp.float32(0.0)), jnp.float32(1.0))
  return lax.bitcast_convert_type(c, jnp.int32)


# --------------------------------------------------------------------------
# Sorted outcomes and areas
# --------------------------------------------------------------------------


class _Sorted(NamedTuple):
  key: jax.Array     # [n] int32 confidence bits, decreasing
  cum_loss: jax.Array  # [n] E_k (int32 when binary, float32 when graded); exact at group ends
  is_end: jax.Array  # [n] bool, last sample of its tie group


def _sort_outcomes(c: jax.Array, correct: jax.Array, *, keep_input_order: bool) -> _Sorted:
  """Sorts by decreasing confidence and accumulates the loss.

  Three paths, fastest first:
  * boolean correctness: one int32 sort of ``confidence bits << 1 | error``;
  * graded correctness (tie-grouped conventions): one int32 sort of the
    confidence bits, then each loss is added at the end of its tie group
    (found by binary search), so ``cum_loss`` is exact at group ends only,
    which is all the tie-grouped metrics read;
  * ``keep_input_order`` ("published_code"): a stable two-operand sort.
  """
  key = _float_key(c)
  if keep_input_order:
    if correct.dtype == jnp.bool_:
      loss = jnp.logical_not(correct).astype(jnp.int32)
    else:
      loss = 1.0 - correct.astype(jnp.float32)
    neg_key, loss_sorted = lax.sort((-key, loss), num_keys=1, is_stable=True)
    key_sorted = -neg_key
    cum = _cumsum(loss_sorted)
  elif correct.dtype == jnp.bool_:
    # Confidence bits (< 2**30 for c <= 1) shifted left, error bit in the lowest
    # bit. Sorting the negation gives decreasing confidence.
    packed = (key << 1) | jnp.logical_not(correct).astype(jnp.int32)
    packed = -lax.sort(-packed)
    key_sorted = packed >> 1
    cum = _cumsum(packed & 1)
  else:
    neg_sorted = lax.sort(-key)  # ascending
    key_sorted = -neg_sorted
    group_end = jnp.searchsorted(neg_sorted, -key, side="right") - 1
    loss = 1.0 - correct.astype(jnp.float32)
    cum = _cumsum(jnp.zeros(key.shape, jnp.float32).at[group_end].add(loss))
  is_end = jnp.concatenate([key_sorted[:-1] != key_sorted[1:], jnp.ones((1,), bool)])
  return _Sorted(key_sorted, cum, is_end)


# On CPU ``lax.associative_scan`` runs these prefix scans several times faster
# than ``jnp.cumsum`` / ``lax.cummax`` (about 3 ms against 9 / 27 ms at n = 1e6).
def _cumsum(x: jax.Array) -> jax.Array:
  return lax.associative_scan(jnp.add, x)


def _exclusive_cummax(x: jax.Array) -> jax.Array:
  incl = lax.associative_scan(jnp.maximum, x)
  return jnp.concatenate([jnp.zeros((1,), x.dtype), incl[:-1]])


def _terms(cum: jax.Array, is_end: jax.Array, convention: str):
  """Per-position contributions to (n * AURC, n^2 * AUGRC) of one curve.

  ``cum`` holds the cumulative loss E_k (k = 1..n) and ``is_end`` marks the tie
  group ends; each group's area is stored at its last position.
  """
  n = cum.shape[0]
  pos = jnp.arange(1, n + 1, dtype=jnp.int32)
  posf = pos.astype(jnp.float32)
  cumf = cum.astype(jnp.float32)
  risk = cumf / posf
  if convention == "published_code":
    # Trapezoid over the points k = 1..n (coverage 1/n .. 1), no tie grouping.
    weight = jnp.ones((n,), jnp.float32).at[0].add(-0.5).at[-1].add(-0.5)
    return weight * risk, weight * cumf
  zero = jnp.float32(0.0)
  prev_pos = _exclusive_cummax(jnp.where(is_end, pos, 0))
  width = (pos - prev_pos).astype(jnp.float32)  # group size, valid at group ends
  if convention == "step":
    return jnp.where(is_end, width * risk, zero), jnp.where(is_end, width * cumf, zero)
  # trapezoid: cum is nondecreasing, so its running max over the group ends
  # before k is E at the previous group end.
  prev_cumf = _exclusive_cummax(
      jnp.where(is_end, cum, jnp.zeros((), cum.dtype))).astype(jnp.float32)
  prev_risk = jnp.where(
      prev_pos > 0, prev_cumf / jnp.maximum(prev_pos, 1).astype(jnp.float32), risk)
  return (jnp.where(is_end, width * (prev_risk + risk) * 0.5, zero),
          jnp.where(is_end, width * (prev_cumf + cumf) * 0.5, zero))


def _areas(cum: jax.Array, is_end: jax.Array, convention: str):
  """(AURC, AUGRC) of the curve with cumulative loss ``cum`` and group ends ``is_end``."""
  n = cum.shape[0]
  aurc_terms, augrc_terms = _terms(cum, is_end, convention)
  return jnp.sum(aurc_terms) / n, jnp.sum(augrc_terms) / n / n


def _oracle_curve(num_errors: jax.Array, n: int, convention: str):
  """(cumulative errors, group ends) of the best scoring of ``num_errors`` errors.

  "step" / "published_code": a strict order with every correct sample first.
  "trapezoid": two levels, all correct tied above all errors tied.
  """
  pos = jnp.arange(1, n + 1, dtype=jnp.int32)
  num_correct = n - num_errors
  cum = jnp.maximum(pos - num_correct, 0).astype(jnp.int32)
  if convention == "trapezoid":
    is_end = (pos == num_correct) | (pos == n)
  else:
    is_end = jnp.ones((n,), bool)
  return cum, is_end


@functools.partial(jax.jit, static_argnames=("convention",))
def _summary_impl(c, correct, *, convention):
  s = _sort_outcomes(c, correct, keep_input_order=convention == "published_code")
  n = c.shape[0]
  aurc_terms, augrc_terms = _terms(s.cum_loss, s.is_end, convention)
  aurc_value = jnp.sum(aurc_terms) / n
  augrc_value = jnp.sum(augrc_terms) / n / n
  if correct.dtype != jnp.bool_:
    return RiskCoverageSummary(aurc_value, augrc_value, jnp.float32(jnp.nan))
  num_errors = s.cum_loss[-1]
  oracle_terms, _ = _terms(*_oracle_curve(num_errors, n, convention), convention)
  # Summing the per-position differences (not subtracting two sums) makes a
  # curve that coincides with the oracle's give exactly 0. With a single class
  # every scoring is optimal.
  excess = jnp.maximum(jnp.sum(aurc_terms - oracle_terms) / n, 0.0)
  eaurc_value = jnp.where((num_errors == 0) | (num_errors == n), jnp.float32(0.0), excess)
  return RiskCoverageSummary(aurc_value, augrc_value, eaurc_value)


@functools.partial(jax.jit, static_argnames=("convention",))
def _aurc_impl(c, correct, *, convention):
  s = _sort_outcomes(c, correct, keep_input_order=convention == "published_code")
  return _areas(s.cum_loss, s.is_end, convention)


# --------------------------------------------------------------------------
# Public metrics
# --------------------------------------------------------------------------


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
    confidences: [..., n] scores in [0, 1]; higher means more confident.
      Leading axes are batch axes (the functions are also ``jax.vmap``-able).
    correct: [..., n] boolean / 0-1 correctness, or graded correctness in [0, 1]
      (the loss is ``1 - correct``).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...] (a scalar for 1-D inputs) in [0, 1]; lower is better.

  Examples:
    >>> from cwsa_jax._risk_coverage import aurc
    >>> c, ok = [0.7, 0.6, 0.8], [True, False, True]
    >>> print(round(float(aurc(c, ok)), 4), round(float(aurc(c, ok, convention="trapezoid")), 4))
    0.1111 0.0556

  References:
    Geifman & El-Yaniv, "Selective classification for deep neural networks", 2017.
  """
  _check_convention(convention)
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_aurc_impl, convention=convention)
  return _validation.poison(_batched(fn, c.ndim)(c, k)[0], rows=invalid)


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
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...] in [0, 1]; lower is better.

  Examples:
    >>> from cwsa_jax._risk_coverage import augrc
    >>> print(round(float(augrc([0.7, 0.6, 0.8], [True, False, True], convention="trapezoid")), 4))
    0.0556

  References:
    Traub et al., "Overcoming common flaws in the evaluation of selective
    classification systems", NeurIPS 2024.
  """
  _check_convention(convention)
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_aurc_impl, convention=convention)
  return _validation.poison(_batched(fn, c.ndim)(c, k)[1], rows=invalid)


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

  The result is clamped at 0 against float32 rounding.

  Args:
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean or 0/1 correctness (graded values are rejected: the
      optimum above assumes binary losses; inside jit/vmap they give NaN).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    float32 of shape [...], >= 0.

  Examples:
    >>> from cwsa_jax._risk_coverage import eaurc
    >>> print(round(float(eaurc([0.9, 0.8, 0.7], [True, False, True])), 4))
    0.1667
  """
  _check_convention(convention)
  c, k, invalid = _prepare(confidences, correct, binary=True)
  fn = functools.partial(_summary_impl, convention=convention)
  return _validation.poison(_batched(fn, c.ndim)(c, k).eaurc, rows=invalid)


def risk_coverage_summary(confidences: Any, correct: Any, *,
                          convention: str = "step") -> RiskCoverageSummary:
  """AURC, AUGRC and E-AURC from a single sort.

  Args:
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean / 0-1 correctness, or graded correctness in [0, 1]
      (then ``eaurc`` is NaN: its optimum is defined for binary losses only).
    convention: ``"step"`` (default), ``"trapezoid"`` or ``"published_code"``.

  Returns:
    ``RiskCoverageSummary(aurc, augrc, eaurc)``, each float32 [...], equal to
    the separate functions.

  Examples:
    >>> from cwsa_jax._risk_coverage import risk_coverage_summary
    >>> s = risk_coverage_summary([0.7, 0.6, 0.8], [True, False, True])
    >>> print(round(float(s.aurc), 4), round(float(s.augrc), 4), round(float(s.eaurc), 4))
    0.1111 0.1111 0.0
  """
  _check_convention(convention)
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_summary_impl, convention=convention)
  return _validation.poison(_batched(fn, c.ndim)(c, k), rows=invalid)


@jax.jit
def _curve_impl(c, correct):
  s = _sort_outcomes(c, correct, keep_input_order=False)
  n = c.shape[0]
  pos = jnp.arange(1, n + 1, dtype=jnp.int32)
  cumf = s.cum_loss.astype(jnp.float32)
  values = (
      lax.bitcast_convert_type(s.key, jnp.float32),
      pos.astype(jnp.float32) / n,
      cumf / pos.astype(jnp.float32),
      cumf / n,
  )
  group = _cumsum(s.is_end.astype(jnp.int32)) - 1
  target = jnp.where(s.is_end, group, n)  # n is out of range: dropped
  out = tuple(jnp.full((n,), v[-1]).at[target].set(v, mode="drop") for v in values)
  num_points = group[-1] + 1
  thresholds = _group_confidences(out[0], c, num_points)
  return RiskCoverageCurve(thresholds, *out[1:], num_points=num_points)


@jax.custom_jvp
def _group_confidences(thresholds, confidences, num_points):
  """``thresholds`` (the padded tie-group confidences, rebuilt from integer keys) unchanged.

  Its derivative: each point moves with its tie group's confidences (their mean
  tangent; one sample per group almost everywhere), so d thresholds_j / d c_i
  is 1 for the sample of group j, not the 0 the integer keys would give.
  """
  del confidences, num_points
  return thresholds


@_group_confidences.defjvp
def _group_confidences_jvp(primals, tangents):
  thresholds, confidences, num_points = primals
  n = thresholds.shape[0]
  # Group of each sample: the first point (descending, padding last) at or below its value.
  key = lax.bitcast_convert_type(thresholds, jnp.int32)
  group = jnp.searchsorted(-key, -_float_key(confidences), side="left")
  group = jnp.minimum(group, num_points - 1)
  d_confidences = tangents[1].astype(jnp.float32)
  total = jax.ops.segment_sum(d_confidences, group, num_segments=n)
  count = jax.ops.segment_sum(jnp.ones_like(d_confidences), group, num_segments=n)
  mean = total / jnp.maximum(count, 1.0)
  tangent = mean[jnp.minimum(jnp.arange(n), num_points - 1)]  # padding repeats the last point
  return thresholds, tangent


def risk_coverage_curve(confidences: Any, correct: Any) -> RiskCoverageCurve:
  r"""The tie-grouped risk-coverage curve (one point per distinct confidence).

  .. math::
    \left(t_j,\ \frac{k_j}{n},\ \frac{E_{k_j}}{k_j},\ \frac{E_{k_j}}{n}\right),
    \quad j = 1..G

  Args:
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].

  Returns:
    ``RiskCoverageCurve`` of [..., n] arrays (``num_points`` [...]) padded with the last point (coverage 1);
    ``num_points`` says how many are distinct. Slice ``[:num_points]`` outside jit.

  Examples:
    >>> from cwsa_jax._risk_coverage import risk_coverage_curve
    >>> curve = risk_coverage_curve([0.9, 0.5, 0.9, 0.2], [True, False, False, True])
    >>> m = int(curve.num_points)
    >>> print(m, [round(float(x), 2) for x in curve.coverage[:m]], [round(float(x), 3) for x in curve.risk[:m]])
    3 [0.5, 0.75, 1.0] [0.5, 0.667, 0.5]
  """
  c, k, invalid = _prepare(confidences, correct)
  return _validation.poison(_batched(_curve_impl, c.ndim)(c, k), rows=invalid)


def _as_targets(x: Any, name: str, *, low_open: bool):
  """(float32 targets, elementwise flag or None)."""
  t = _validation.as_float_array(x, name).astype(jnp.float32)
  return t, _validation.check_range(t, name, low_open=low_open)


@jax.jit
def _risk_at_coverage_impl(c, correct, target):
  s = _sort_outcomes(c, correct, keep_input_order=False)
  n = c.shape[0]
  pos = jnp.arange(1, n + 1, dtype=jnp.int32)
  coverage = pos.astype(jnp.float32) / n
  # End of the tie group holding each position (reverse running minimum).
  group_end = lax.associative_scan(jnp.minimum, jnp.where(s.is_end, pos - 1, n), reverse=True)
  first = jnp.clip(jnp.searchsorted(coverage, target - _TARGET_SLACK, side="left"), 0, n - 1)
  end = group_end[first]
  return s.cum_loss[end].astype(jnp.float32) / pos[end].astype(jnp.float32)


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
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    coverage: target coverage(s) in (0, 1], scalar or any shape.

  Returns:
    float32 array of shape ``[...] + coverage.shape``.

  Examples:
    >>> from cwsa_jax._risk_coverage import risk_at_coverage
    >>> c, ok = [0.9, 0.8, 0.7, 0.6], [True, True, False, True]
    >>> print([round(float(r), 4) for r in risk_at_coverage(c, ok, [0.5, 0.75, 1.0])])
    [0.0, 0.3333, 0.25]
  """
  c, k, invalid = _prepare(confidences, correct)
  t, target_flag = _as_targets(coverage, "coverage", low_open=True)
  result = _batched(_risk_at_coverage_impl, c.ndim, 1)(c, k, t)
  return _validation.poison(result, rows=invalid, items=target_flag)


@jax.jit
def _coverage_at_risk_impl(c, correct, target):
  s = _sort_outcomes(c, correct, keep_input_order=False)
  n = c.shape[0]
  pos = jnp.arange(1, n + 1, dtype=jnp.int32)
  risk = s.cum_loss.astype(jnp.float32) / pos.astype(jnp.float32)

  def one(t):
    ok = s.is_end & (risk <= t + _TARGET_SLACK)
    return jnp.max(jnp.where(ok, pos, 0)).astype(jnp.float32) / n

  flat = target.reshape(-1)
  return jax.vmap(one)(flat).reshape(target.shape)


def coverage_at_risk(confidences: Any, correct: Any, risk: Any) -> jax.Array:
  r"""Largest achievable coverage whose selective risk is <= ``risk``.

  .. math::
    \mathrm{cov@risk}(r) = \max\{k_j / n : E_{k_j} / k_j \le r\}
    \quad(0 \text{ if no tie group qualifies})

  The risk-coverage curve is not monotone, so this is the best working point,
  not the first crossing. ``E_{k_j} / k_j <= r`` is tested with a slack of
  2**-22 so that a decimal target such as 0.1 matches a risk of exactly 1/10.

  Args:
    confidences: [..., n] scores in [0, 1].
    correct: [..., n] boolean / 0-1 or graded correctness in [0, 1].
    risk: target selective risk(s) in [0, 1], scalar or any shape.

  Returns:
    float32 array of shape ``[...] + risk.shape``.

  Examples:
    >>> from cwsa_jax._risk_coverage import coverage_at_risk
    >>> c, ok = [0.9, 0.8, 0.7, 0.6], [True, True, False, True]
    >>> print([round(float(x), 2) for x in coverage_at_risk(c, ok, [0.0, 0.25, 0.3])])
    [0.5, 1.0, 1.0]
  """
  c, k, invalid = _prepare(confidences, correct)
  t, target_flag = _as_targets(risk, "risk", low_open=False)
  result = _batched(_coverage_at_risk_impl, c.ndim, 1)(c, k, t)
  return _validation.poison(result, rows=invalid, items=target_flag)
