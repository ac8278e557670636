"""The exact risk-coverage areas in one place: the AURC and AUGRC term of each curve point, the
E-AURC terms (exact differences from the oracle, or the oracle itself), and the harmonic
differences the oracle's closed form needs.

Three callers compute these areas from different layouts: the exact metrics
(``_risk_coverage_kernels``: a scan over tie groups, under ``jit``), the evaluation
bootstrap (``_bootstrap._area_scan``: a scan over resampled multiplicities, under
``jit``) and ``cwsa-jax evaluate --stream`` (``cli/_stream``: tie groups streamed
from files, summed in float64 NumPy on the host). The helpers that both kinds of
caller use take the array namespace ``xp`` (``jax.numpy``, the default, or
``numpy``); each keeps the operations, and their order, of the code it replaced,
so every result is bit for bit what it was. The exact metrics compute E-AURC from the
per-point differences to the oracle (:func:`step_excess`, :func:`trapezoid_excess`), which
need the number of correct samples before the scan: the in-memory bootstraps know each
resample's count up front and use them too (``_area_scan._excess_sum``); the streamed
bootstrap and ``cli/_stream`` (one pass, the count known only at its end) subtract the
oracle's closed form.

Notation, as in :mod:`cwsa_jax._risk_coverage`: the samples sorted by decreasing
confidence, a point of the curve ends a tie group after ``K`` accepted samples with
``E`` errors (risk ``R = E / K``); the point before it had ``K'``, ``E'``, ``R'``; the
group's width is ``W = K - K'``; ``n`` samples in all, ``m`` of them correct.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from cwsa_jax import _stats


def _divide(xp: Any):
  """Divisions rounded once: ``_stats.divide`` under ``jit`` (XLA would multiply by a
  reciprocal), plain ``/`` on the host."""
  if xp is jnp:
    return _stats.divide
  return lambda *pairs: tuple(x / y for x, y in pairs)


def point_terms(width, risk, errors, convention: str, previous=None, *, xp: Any = jnp):
  """(n AURC term, n^2 AUGRC term) of curve points, for ``"step"`` or ``"trapezoid"``.

  .. math::

    \\text{step:}\\quad W R,\\quad W E \\qquad
    \\text{trapezoid:}\\quad W \\frac{R' + R}{2},\\quad W \\frac{E' + E}{2}

  ``previous`` (trapezoid only) is ``(has_previous, R', E')``: the first point
  (``has_previous`` False) takes its own risk for ``R'``, and its ``E'`` is 0.
  """
  if convention == "step":
    return width * risk, width * errors
  has_previous, previous_risk, previous_errors = previous
  previous_risk = xp.where(has_previous, previous_risk, risk)
  return width * (previous_risk + risk) * 0.5, width * (previous_errors + errors) * 0.5


def published_weight(position, n):
  """The "published_code" convention's trapezoid weight of position ``p`` (1-based) of n, no
  tie groups: 1, but 1/2 at p = 1 and p = n."""
  return 1.0 - 0.5 * (position == 1) - 0.5 * (position == n)


def areas(aurc_sum, augrc_sum, n, *, xp: Any = jnp):
  """AURC ``aurc_sum / n`` and AUGRC ``augrc_sum / n / n``, each division rounded once."""
  divide = _divide(xp)
  aurc_value, augrc_value = divide((aurc_sum, n), (augrc_sum, n))
  return aurc_value, divide((augrc_value, n))[0]


# --- E-AURC ---------------------------------------------------------------------------------
#
# E-AURC = AURC - oracle, the oracle being the smallest AURC of any scoring of the same outcomes
# under the same convention: for "step" and "published_code" a strict order with the m correct
# samples first (E*_p = max(p - m, 0) errors among the first p), for "trapezoid" all correct
# tied above all errors tied (the line from (m / n, 0) to (1, E / n), area (E / n)^2 / 2).
#
# The exact metrics sum it as nonnegative terms, from the integer differences E_K - E*_K >= 0
# (:func:`step_excess`, :func:`tie_excess`, :func:`trapezoid_excess`): the difference of two
# nearly equal areas would cancel (a nearly optimal order at n = 10^6 gave exactly 0).


def oracle_errors(position, num_correct, *, xp: Any = jnp):
  """``E*_p = max(p - m, 0)``: the errors among the first ``p`` samples of the optimal strict
  order (every correct sample first)."""
  return xp.maximum(position - num_correct, 0)


def step_excess(width, end, errors, num_correct):
  """n E-AURC ("step", "published_code" without its weights) of curve points: the point's
  area less the oracle's at its own end, ``W (E_K - E*_K) / K`` (float32, >= 0).

  With the tie terms of :func:`tie_excess` they sum to n E-AURC:

  .. math::

    n\\,\\mathrm{E\\text{-}AURC} = \\sum_{\\text{points}} W\\,\\frac{E_K - E^*_K}{K}
      + \\sum_{\\text{points}} \\sum_{p = K' + 1}^{K}
        \\Bigl(\\frac{E^*_K}{K} - \\frac{E^*_p}{p}\\Bigr).

  ``width``, ``end`` and ``errors`` int32 (W, K >= 1, E_K), ``num_correct`` m.
  """
  difference = (errors - oracle_errors(end, num_correct)).astype(jnp.float32)
  return width.astype(jnp.float32) * (difference / end.astype(jnp.float32))


def tie_excess(rank, position, num_correct):
  """The "step" oracle's tie terms (float32, >= 0) at positions ``q`` that are not the last of
  their tie group, ``rank`` = q - K' (K' the previous point's K):

  .. math::

    \\sum_{p = K' + 1}^{K} \\Bigl(\\frac{E^*_K}{K} - \\frac{E^*_p}{p}\\Bigr)
      = \\sum_{q = K' + 1}^{K - 1} (q - K')\\,\\frac{m}{q (q + 1)}\\,[q \\ge m],

  as ``E*_p / p`` grows by ``m / (q (q + 1))`` from q to q + 1 for q >= m and not below m.
  """
  qf = position.astype(jnp.float32)
  term = rank.astype(jnp.float32) * (jnp.asarray(num_correct).astype(jnp.float32)
                                     / (qf * (qf + 1.0)))
  return jnp.where(position >= num_correct, term, jnp.float32(0.0))


def _trapezoid_gap(end, errors, num_correct, n):
  """``R_K - E*_K / n = (E_K - E*_K) / K + E*_K (n - K) / (K n)`` (float32, >= 0, ``K >= 1``):
  how far a point's risk lies above the "trapezoid" oracle's line at its coverage."""
  oracle = oracle_errors(end, num_correct)
  endf = end.astype(jnp.float32)
  return ((errors - oracle).astype(jnp.float32) / endf
          + oracle.astype(jnp.float32) * ((n - end).astype(jnp.float32) / (endf * n)))


def trapezoid_excess(width, end, errors, previous, num_correct, n):
  """n E-AURC ("trapezoid") of curve points (float32, >= 0): the point's trapezoid less the
  oracle line's area over it.

  .. math::

    W\\,\\frac{g' + g}{2} + \\frac{(K - m)^+ (m - K')^+}{2 n},\\qquad
    g = R_K - \\frac{E^*_K}{n} = \\frac{E_K - E^*_K}{K} + \\frac{E^*_K (n - K)}{K n},

  with the oracle line ``E*_K / n`` (risk ``max(K - m, 0) / n`` at coverage K / n), ``g'``
  the previous point's (``R_K`` for the first point, where the curve starts at its own
  risk), and the second term the line's kink at m inside the group (the chord over it less
  the area under it). For m >= 1 (all wrong: the oracle is 1, see :func:`one_class`).
  ``previous`` is ``(has_previous, K', E_K')``.
  """
  has_previous, previous_end, previous_errors = previous
  endf = end.astype(jnp.float32)
  gap = _trapezoid_gap(end, errors, num_correct, n)
  previous_gap = jnp.where(has_previous,
                           _trapezoid_gap(jnp.maximum(previous_end, 1), previous_errors,
                                          num_correct, n),
                           errors.astype(jnp.float32) / endf)
  kink = (jnp.maximum(end - num_correct, 0).astype(jnp.float32)
          * jnp.maximum(num_correct - previous_end, 0).astype(jnp.float32) / (2.0 * n))
  return width.astype(jnp.float32) * ((previous_gap + gap) * 0.5) + kink


def excess_area(total, n, num_errors, *, divide):
  """E-AURC ``total / n`` from the summed nonnegative terms (``divide`` rounds once), exactly
  0 with one class (:func:`one_class`)."""
  return jnp.where(one_class(num_errors, n), jnp.float32(0.0), divide((total, n))[0])


def step_oracle(num_errors, num_correct, harmonic, n, *, xp: Any = jnp):
  """The "step" AURC of the optimal strict order in closed form,

  .. math::

    \\frac{1}{n} \\sum_{p = m + 1}^{n} \\frac{p - m}{p} = \\frac{E - m (H_n - H_m)}{n},

  from ``harmonic`` = H_n - H_m (:func:`harmonic_difference` or
  :func:`harmonic_difference_exact`), the division rounded once.
  """
  return _divide(xp)((num_errors - num_correct * harmonic, n))[0]


def trapezoid_oracle(num_errors, n, *, xp: Any = jnp):
  """The "trapezoid" oracle ``(E / n)^2 / 2`` (all correct tied above all errors tied), as
  ``0.5 * e ** 2`` (on the host ``**`` is libm's pow, which rounds unlike ``e * e`` in about
  one case in a thousand)."""
  error_rate = _divide(xp)((num_errors, n))[0]
  return 0.5 * error_rate ** 2


def one_class(num_errors, n):
  """Every sample correct or every sample wrong: E-AURC is 0."""
  return (num_errors == 0) | (num_errors == n)


def optimal_order(convention: str, n, num_correct, errors_first_m, starts_after_m=None,
                  starts_at_m1=None):
  """Whether the order reaches the convention's oracle (checked on integers): no error among
  the first m positions (``errors_first_m`` = 0) and, for "step", every error its own tie group
  (``starts_after_m``, the tie groups starting after position m, = n - m) or, for "trapezoid",
  all errors one tie group starting at m + 1 (``starts_after_m`` = ``starts_at_m1`` = 1)."""
  if convention == "trapezoid":
    return (errors_first_m == 0) & (starts_after_m == 1) & (starts_at_m1 == 1)
  optimal = errors_first_m == 0
  if convention == "step":
    optimal &= starts_after_m == n - num_correct
  return optimal


def eaurc(aurc_value, oracle, trivial, *, xp: Any = jnp):
  """E-AURC ``max(AURC - oracle, 0)``, exactly 0 where ``trivial`` (:func:`one_class`, or an
  :func:`optimal_order`)."""
  return xp.where(trivial, 0.0, xp.maximum(aurc_value - oracle, 0.0))


# --- harmonic differences ---------------------------------------------------------------------
#
# Two forms, kept apart on purpose: under jit (the evaluation bootstrap, once per resample) an
# O(1) float32 asymptotic form; on the host (the streamed report, float64 throughout) the exact
# float64 sum. The asymptotic form in float64 would differ from the sum in its last digits, and
# the float64 sum of up to n terms cannot run per resample under jit.

# H_0 .. H_7 (float32): also the streamed bootstrap's harmonic difference past int32.
SMALL_HARMONIC = np.cumsum(np.concatenate([[0.0], 1.0 / np.arange(1, 8)])).astype(np.float32)
_HARMONIC_BLOCK = 1 << 20  # terms per block of the host sum


def harmonic_difference(r, n):
  """H_n - H_r = sum_{k = r + 1}^{n} 1/k (float32) of int32 0 <= r <= n, in O(1) memory.

  With f(x) = ln x + 1/(2x) - 1/(12 x^2) + 1/(120 x^4), H_x = f(x) + gamma + O(x^-6):
  for r >= 8 the difference f(n) - f(r), its logarithm as log1p((n - r) / r) (a
  truncation error below 2e-8 relative); for r < 8 the exact H_r, and H_n from f(n)
  when n >= 8.
  """
  def tail(x):  # f(x) - ln x
    return 0.5 / x - 1.0 / (12.0 * x * x) + 1.0 / (120.0 * x * x * x * x)

  small = jnp.asarray(SMALL_HARMONIC)
  rf, nf = jnp.maximum(r, 8).astype(jnp.float32), jnp.maximum(n, 8).astype(jnp.float32)
  large = jnp.log1p((n - r).astype(jnp.float32) / rf) + tail(nf) - tail(rf)
  h_n = jnp.where(n < 8, small[jnp.clip(n, 0, 7)], jnp.log(nf) + np.float32(np.euler_gamma)
                  + tail(nf))
  return jnp.where(r >= 8, large, h_n - small[jnp.clip(r, 0, 7)])


def harmonic_difference_exact(r: int, n: int) -> float:
  """``sum_{p = r + 1}^{n} 1/p`` in float64 on the host, in blocks (bounded memory)."""
  return float(sum(np.sum(1.0 / np.arange(start, min(start + _HARMONIC_BLOCK, n + 1),
                                          dtype=np.float64))
                   for start in range(r + 1, n + 1, _HARMONIC_BLOCK)))
