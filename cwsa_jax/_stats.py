"""Sufficient statistics of the hard CWSA family and the metrics computed from them.

For a threshold tau and the retained set S = {i : c_i >= tau}, with
u_i = 1 - c_i and kappa_i the (possibly graded) correctness, the four sums

.. math::

  N = |S|, \\quad A = \\sum_S \\kappa_i, \\quad U = \\sum_S u_i, \\quad
  V = \\sum_S u_i \\kappa_i

determine every hard metric, because phi_i = (c_i - tau)/(1 - tau)
= 1 - u_i/(1 - tau):

.. math::

  \\sum_S \\phi_i = N - \\frac{U}{1-\\tau}, \\qquad
  \\sum_S \\phi_i \\kappa_i = A - \\frac{V}{1-\\tau},

  \\mathrm{CWSA} = \\frac{(2A - N) - (2V - U)/(1-\\tau)}{N}, \\qquad
  \\mathrm{CWSA}^+ = \\frac{A - V/(1-\\tau)}{N}.

Sums of u = 1 - c are used rather than sums of c - tau: near tau = 0.99 the
latter cancel catastrophically in float32, the former do not. The sums are
exact (see ``_exact``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _exact
from cwsa_jax import _validation

U_DIGITS = 3  # 1 - c for float32 c is a multiple of 2^-24: three base-256 digits are exact.
GRADED_DIGITS = 4  # graded kappa and u * kappa: truncated below 2^-32.

NORMALIZATIONS = ("retained", "all")


class Sums(NamedTuple):
  """The four retained-set sums (float32, shape [...])."""
  count: jax.Array
  correct: jax.Array
  one_minus_c: jax.Array
  one_minus_c_correct: jax.Array


def segments_per_bucket(graded: bool) -> int:
  """Binary correctness splits each bucket into (wrong, correct) segments."""
  return 1 if graded else 2


# The binary layout's columns per segment: count and 1 - c = (u_hi 4096 + u_lo) 2^-24.
BINARY_COLUMNS = ("count", "u_hi", "u_lo")


def bucket_width(graded: bool) -> int:
  """Columns W of one bucket's sums: 2 segments x (1, u_hi, u_lo), or the 12 graded columns."""
  return 1 + 2 * GRADED_DIGITS + U_DIGITS if graded else 2 * len(BINARY_COLUMNS)


def segment_columns(confidences: jax.Array, correct: jax.Array,
                    bucket: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Segment ids and int32 digit columns [K, n] of the samples' statistics.

  Binary ``correct`` (bool): segment ``2 bucket + correct`` and columns
  (1, u_hi, u_lo) with u = 1 - c = (u_hi 2^12 + u_lo) 2^-24 exactly; A and V
  are the count and U of the "correct" segments. Three columns instead of
  eight halve the memory traffic of the scatter.

  Graded ``correct`` (float kappa in [0, 1]): segment ``bucket`` and columns
  (1, kappa digits, u digits, (u kappa) digits) in base 256.
  """
  c = jnp.clip(confidences.astype(jnp.float32), 0.0, 1.0)
  u = 1.0 - c
  ones = jnp.ones(c.shape, jnp.int32)
  if correct.dtype == jnp.bool_:
    ids = 2 * bucket + correct.astype(jnp.int32)
    return ids, jnp.stack([ones] + _exact.grid_columns(u), axis=0)
  kappa = jnp.clip(correct.astype(jnp.float32), 0.0, 1.0)
  cols = ([ones] + _exact.digits(kappa, GRADED_DIGITS) + _exact.grid_digits(u)
          + _exact.digits(u * kappa, GRADED_DIGITS))
  return bucket, jnp.stack(cols, axis=0)


def sums_from_columns(values: jax.Array, graded: bool) -> Sums:
  """Turns summed columns (float32 [B, segments_per_bucket * K]) into :class:`Sums` [B]."""
  if not graded:
    wrong, right = values[..., 0:3], values[..., 3:6]
    u_of = lambda v: v[..., 1] * 2.0**-12 + v[..., 2] * 2.0**-24
    return Sums(count=wrong[..., 0] + right[..., 0], correct=right[..., 0],
                one_minus_c=u_of(wrong) + u_of(right), one_minus_c_correct=u_of(right))
  g = GRADED_DIGITS
  count = values[..., 0]
  correct = _exact.combine(values[..., 1:1 + g], g)
  u = _exact.combine(values[..., 1 + g:1 + g + U_DIGITS], U_DIGITS)
  uk = _exact.combine(values[..., 1 + g + U_DIGITS:1 + 2 * g + U_DIGITS], g)
  return Sums(count, correct, u, uk)


# ------------------------------------------------------------------ calibration
#
# Per-bin sums for the ECE family: the count N, A = sum kappa and U = sum (1 - c)
# of each bin. Binary correctness reuses the binary layout above (segment
# 2 bin + correct, columns (1, u_hi, u_lo): A is the count of the "correct"
# segments). Graded correctness has one segment per bin and the columns
# (1, kappa in three base-4096 digits, u_hi, u_lo). Either is brought to the
# canonical per-bin columns CALIBRATION_COLUMNS (the graded ones), where every
# column is a base-4096 digit, so any signed combination such as the gap
# sum (c - kappa) = N - A - U converts to float32 exactly (``_exact.exact_float``).

CALIBRATION_COLUMNS = 6  # count, kappa digits at 2^-12, 2^-24, 2^-36, u digits at 2^-12, 2^-24
_KAPPA_WIDE = 3
_COUNT, _KAPPA, _U = 0, 1, 1 + _KAPPA_WIDE


def calibration_columns(confidences: jax.Array, correct: jax.Array,
                        bin_index: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Segment ids and int32 columns [K, n] of the per-bin calibration sums.

  Binary ``correct``: :func:`segment_columns` (2 segments per bin, K = 3);
  graded: segment ``bin_index`` and the canonical columns (K = 6).
  """
  if correct.dtype == jnp.bool_:
    return segment_columns(confidences, correct, bin_index)
  c = jnp.clip(confidences.astype(jnp.float32), 0.0, 1.0)
  kappa = jnp.clip(correct.astype(jnp.float32), 0.0, 1.0)
  cols = ([jnp.ones(c.shape, jnp.int32)] + _exact.wide_digits(kappa, _KAPPA_WIDE)
          + _exact.grid_columns(1.0 - c))
  return bin_index, jnp.stack(cols, axis=0)


def calibration_segments(num_bins: int, graded: bool) -> int:
  """Number of segments of :func:`calibration_columns` for ``num_bins`` bins."""
  return num_bins * segments_per_bucket(graded)


def calibration_canonical(hi: jax.Array, lo: jax.Array,
                          graded: bool) -> tuple[jax.Array, jax.Array]:
  """The canonical exact per-bin sums [B, CALIBRATION_COLUMNS] of either layout's sums.

  Binary sums [2B, 3] become count = N_wrong + N_right, the first kappa digit
  4096 N_right (A = N_right exactly) and u = U_wrong + U_right; graded sums
  are canonical already. Exact integer operations only.
  """
  if graded:
    return hi, lo
  num_bins = hi.shape[0] // 2
  h, l = hi.reshape(num_bins, 2, 3), lo.reshape(num_bins, 2, 3)
  both = lambda j: _exact.add((h[:, 0, j], l[:, 0, j]), (h[:, 1, j], l[:, 1, j]))
  count, u_hi, u_lo = both(0), both(1), both(2)
  right = _exact.to_int(h[:, 1, 0], l[:, 1, 0])  # N_right < 2^31
  zero = jnp.zeros_like(right)
  cols_hi = [count[0], right, zero, zero, u_hi[0], u_lo[0]]
  cols_lo = [count[1], zero, zero, zero, u_hi[1], u_lo[1]]
  return jnp.stack(cols_hi, axis=-1), jnp.stack(cols_lo, axis=-1)


class BinTotals(NamedTuple):
  """Per-bin sums from the canonical calibration columns (float32 [..., B])."""
  count: jax.Array       # N (exact below 2^24)
  correct: jax.Array     # A = sum kappa
  confidence: jax.Array  # sum c = N - U
  gap: jax.Array         # sum (c - kappa) = N - A - U


def _column_terms(hi: jax.Array, lo: jax.Array, top: jax.Array | None):
  """``term(j, sign, place)``: the ``_exact.exact_float`` terms of column j (pair or wide)."""
  if top is None:
    return lambda j, sign, place: [(sign, hi[..., j], lo[..., j], place)]
  return lambda j, sign, place: _exact.wide_terms(
      sign, (top[..., j], hi[..., j], lo[..., j]), place)


def calibration_totals(hi: jax.Array, lo: jax.Array, top: jax.Array | None = None) -> BinTotals:
  """:class:`BinTotals` of the canonical sums [..., B, CALIBRATION_COLUMNS] (``top``: a state's
  wide sums, ``_exact.widen``).

  Each total is one exact integer combination of the columns rounded once to
  float32 (``_exact.exact_float``), so the gap keeps full relative precision
  even when N - A and U nearly cancel, and equal states give equal floats.
  """
  col = _column_terms(hi, lo, top)
  count = col(_COUNT, 1, 0)
  kappa = [t for j in range(_KAPPA_WIDE) for t in col(_KAPPA + j, 1, -1 - j)]
  u = col(_U, 1, -1) + col(_U + 1, 1, -2)
  # The four totals as signs of the terms (count, kappa, u), converted in one call.
  signs = np.array([[1, 0, 0], [0, 1, 0], [1, 0, -1], [1, -1, -1]], np.int32)
  groups = [0] * len(count) + [1] * len(kappa) + [2] * len(u)
  terms = [(signs[:, g].reshape((4,) + (1,) * jnp.ndim(h)), h, l, p)
           for g, (_, h, l, p) in zip(groups, count + kappa + u)]
  return BinTotals(*_exact.exact_float(terms))


# ------------------------------------------------------------------ losses
#
# Per-bucket count and summed loss 1 - kappa (streaming risk-coverage): the
# columns (1, loss in three base-4096 digits); binary losses are 0 or 4096 in
# the first digit, graded ones exact down to 2^-36.

LOSS_COLUMNS = 1 + _KAPPA_WIDE


def loss_columns(correct: jax.Array) -> list[jax.Array]:
  """int32 columns (1, loss digits) of each sample's loss ``1 - kappa``."""
  loss = 1.0 - jnp.clip(correct.astype(jnp.float32), 0.0, 1.0)
  return [jnp.ones(loss.shape, jnp.int32)] + _exact.wide_digits(loss, _KAPPA_WIDE)


def loss_totals(hi: jax.Array, lo: jax.Array,
                top: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(count, summed loss), float32 [...], of exact sums [..., LOSS_COLUMNS] (each rounded once;
  ``top``: a state's wide sums)."""
  col = _column_terms(hi, lo, top)
  count = col(0, 1, 0)
  loss = [t for j in range(_KAPPA_WIDE) for t in col(1 + j, 1, -1 - j)]
  signs = np.array([[1, 0], [0, 1]], np.int32)  # (count, loss) in one call
  terms = [(signs[:, g].reshape((2,) + (1,) * jnp.ndim(h)), h, l, p)
           for g, (_, h, l, p) in zip([0] * len(count) + [1] * len(loss), count + loss)]
  count, loss = _exact.exact_float(terms)
  return count, loss


class Metrics(NamedTuple):
  coverage: jax.Array
  selective_accuracy: jax.Array
  cwsa: jax.Array
  cwsa_plus: jax.Array


def divide(*pairs: tuple[jax.Array, Any]) -> tuple[jax.Array, ...]:
  """``x / y`` of each pair ``(x, y)``, elementwise and rounded once (IEEE division).

  XLA turns a division by a broadcast scalar or by a constant into a
  multiplication by its reciprocal: two roundings, 1 ulp off in about a
  quarter of cases (coverage ``count / n``), and results that change when a
  caller's ``jit`` closes over the thresholds. Divisors behind an
  optimization barrier stay divisions; each is first made to depend on its
  ``x`` (NaN where ``x`` is, as the quotient is), so that under ``vmap`` it
  carries the batch axes of ``x`` before the barrier rather than being
  broadcast to them after it. The dividends go behind the same barrier, so that
  a quotient divided again stays two divisions (XLA would rewrite
  ``(a / b) / c`` into ``a / (b c)``, whose product is rounded for large
  ``b c``). Meant for small arrays; on [n] arrays the barrier materialises
  both operands.
  """
  operands = lax.optimization_barrier(tuple(
      (x, jnp.where(x == x, jnp.asarray(y, x.dtype), jnp.nan)) for x, y in pairs))  # noqa: PLR0124
  return tuple(x / y for x, y in operands)


def metrics_from_sums(sums: Sums, tau: jax.Array, n) -> Metrics:
  """Coverage, selective accuracy, CWSA and CWSA+ from the retained-set sums.

  Empty S gives CWSA = CWSA+ = 0 and selective accuracy NaN. Each division
  is rounded once (:func:`divide`).
  """
  count, correct, u, uk = sums
  tau = tau.astype(jnp.float32)
  one_minus_tau = 1.0 - tau
  nonempty = count > 0
  safe_count = jnp.where(nonempty, count, 1.0)
  scaled, scaled_plus = divide((2.0 * uk - u, one_minus_tau), (uk, one_minus_tau))
  coverage, accuracy, cwsa, cwsa_plus = divide(
      (count, n), (correct, safe_count), ((2.0 * correct - count) - scaled, safe_count),
      (correct - scaled_plus, safe_count))
  return Metrics(
      coverage=coverage,
      selective_accuracy=jnp.where(nonempty, accuracy, jnp.nan),
      cwsa=jnp.where(nonempty, cwsa, 0.0),
      cwsa_plus=jnp.where(nonempty, cwsa_plus, 0.0),
  )


def invalid_inputs(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """Scalar bool of 1-D samples: some confidence or correctness is invalid.

  For kernels that receive already converted samples (streaming states, the
  bootstrap); the public functions get their flags from ``_validation``.
  """
  return (jnp.any(_validation.bad_unit(confidences))
          | jnp.any(_validation.bad_correct(correct)))


# ------------------------------------------------------------------ derivatives
#
# The retained-set sums are exact integers, so autodiff through them gives 0.
# Yet they are differentiable almost everywhere: the retained sets are locally
# constant in c (and in tau), and A, U, V are linear in kappa and c, so
#
#   dA = sum_S dkappa_i,  dU = -sum_S dc_i,  dV = sum_S (-kappa_i dc_i + (1 - c_i) dkappa_i),
#
# while N, and the retained sets themselves, have derivative 0. ``exact_sums``
# returns the exact sums as its primal and these float sums as its tangent;
# everything computed from the sums (``metrics_from_sums``, including its
# dependence on tau) is then differentiated by ordinary autodiff.


def _sample_tangents(confidences, correct, d_confidences, d_correct) -> jax.Array:
  """Per-sample tangents [n, 3] of (kappa, u, u kappa) with u = 1 - c."""
  c = confidences.astype(jnp.float32)
  dc = d_confidences.astype(jnp.float32)
  du = -dc
  if jnp.issubdtype(correct.dtype, jnp.floating):
    kappa = correct.astype(jnp.float32)
    dk = d_correct.astype(jnp.float32)
    return jnp.stack([dk, du, du * kappa + (1.0 - c) * dk], axis=-1)
  kappa = correct.astype(jnp.float32)
  return jnp.stack([jnp.zeros_like(du), du, du * kappa], axis=-1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def exact_sums(exact_fn: Callable, segments_fn: Callable, confidences: jax.Array,
               correct: jax.Array, *extra: jax.Array) -> Sums:
  """Exact retained-set sums with their almost-everywhere derivative.

  Args:
    exact_fn: ``exact_fn(confidences, correct, *extra)`` -> :class:`Sums` of
      shape ``[..., B - start]``: suffix sums over ``B`` buckets (entry ``b``
      sums the samples in buckets ``b + start, ..., B - 1``).
    segments_fn: ``segments_fn(confidences, correct, *extra)`` -> ``(ids, shape,
      start)``: each sample's flat bucket id (out of range: left out), the
      static shape ``(..., B)`` of the buckets and the static ``start``.
    confidences: [n] float confidences.
    correct: [n] bool or float correctness.
    *extra: further arguments (thresholds, group ids); the sums are locally
      constant in them.

  Returns:
    ``exact_fn``'s result; its tangent is the float sum of the per-sample
    tangents over the same sets.
  """
  return exact_fn(confidences, correct, *extra)


@exact_sums.defjvp
def _exact_sums_jvp(exact_fn, segments_fn, primals, tangents):
  confidences, correct, *extra = primals
  d_confidences, d_correct = tangents[0], tangents[1]
  out = exact_sums(exact_fn, segments_fn, confidences, correct, *extra)
  ids, shape, start = segments_fn(confidences, correct, *extra)
  columns = _sample_tangents(confidences, correct, d_confidences, d_correct)
  per_bucket = jax.ops.segment_sum(columns, ids, num_segments=math.prod(shape))
  per_bucket = per_bucket.reshape(tuple(shape) + (3,))
  suffix = jnp.flip(jnp.cumsum(jnp.flip(per_bucket, -2), axis=-2), -2)[..., start:, :]
  return out, Sums(jnp.zeros_like(out.count), suffix[..., 0], suffix[..., 1], suffix[..., 2])


def check_normalize(normalize: str) -> None:
  if normalize not in NORMALIZATIONS:
    raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")


def renormalize(metrics, normalize: str):
  """Applies the CWSA denominator choice to a result with coverage and cwsa fields.

  ``"retained"`` keeps the paper's (1/|S|) sum; ``"all"`` is the published
  code's (1/n) sum, i.e. coverage x CWSA. CWSA+ always divides by |S| (the
  published code does too).
  """
  if normalize == "retained":
    return metrics
  return metrics._replace(cwsa=metrics.coverage * metrics.cwsa)
