"""The kernels of the risk-coverage metrics: one sort, then one scan over the tie groups.

Everything :mod:`cwsa_jax._risk_coverage` computes, per row and under ``jit``: the
sorted outcomes and the tie-group scan (sequential over cache-sized chunks on CPU,
parallel prefix scans elsewhere), the AURC / AUGRC / E-AURC kernels (their formula
pieces in :mod:`cwsa_jax._areas`; on CUDA GPUs boolean outcomes go through
``_group_areas``' kernel), the curve and the working points, and the result types.
The public functions, their checks and batching are in :mod:`cwsa_jax._risk_coverage`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cwsa_jax import _areas
from cwsa_jax._kernels import _dispatch
from cwsa_jax._kernels import _group_areas
from cwsa_jax import _mesh
from cwsa_jax._kernels import _sort
from cwsa_jax import _stats

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


# The public module re-exports them: their home for help(), repr and pickle.
RiskCoverageCurve.__module__ = RiskCoverageSummary.__module__ = "cwsa_jax._risk_coverage"


# --------------------------------------------------------------------------
# Sorted outcomes and the tie-group scan
# --------------------------------------------------------------------------
#
# Every result here is a fold over the samples in decreasing confidence order.
# After one sort (``_sort``: NumPy on CPU, lax.sort elsewhere), a scan walks the
# sorted samples carrying the loss so far and the start of the current tie
# group, so that slot k (the k-th sample, 1-based) "closes" the tie group that
# ends at position k - 1 whenever its key differs from the previous one. The
# samples are padded with at least one slot whose key is below every
# confidence, so slot n + 1 closes the last group. Each result is a reduction
# over the slots (``_scan_groups``).
#
# On CPU the scan is a sequential loop over cache-sized chunks (XLA:CPU runs a
# sequential pass several times faster than a parallel prefix scan, and the
# chunks keep every intermediate in cache); elsewhere it is one chunk of
# parallel prefix scans. ``lax.platform_dependent`` picks the form when the
# computation is lowered; both give the same values (to float32 rounding of
# graded losses).

_CHUNK_SIZE = 1 << 14  # CPU: slots per chunk
_RUNNING_CHUNK_SIZE = 1 << 17  # ... when only the running loss is scanned (no tie groups)
_PAD_KEY = -(2**30 - 1)  # key of the padding slots: below every confidence key
_NO_KEY = -(2**31)  # the "previous key" of slot 1: differs from every key


def _layout(n: int, sequential: bool, groups: bool = True) -> tuple[int, int]:
  """(chunk size, number of slots): at least n + 1 slots, a whole number of chunks."""
  if not sequential:
    return n + 1, n + 1
  chunk = min(_CHUNK_SIZE if groups else _RUNNING_CHUNK_SIZE, n + 1)
  return chunk, -(-(n + 1) // chunk) * chunk


def _sorted_outcomes(c: jax.Array, correct: jax.Array, *, keep_input_order: bool, length: int):
  """Confidence keys and losses [length] in decreasing confidence order, then padding.

  Two paths (boolean "published_code" has its own, ``_published_binary``):
  * boolean correctness: one int32 sort of ``-(confidence bits << 1 | error)``
    (the bits of a float32 in [0, 1] order like its value), both outputs from
    the sorted keys, no gather;
  * graded correctness: one stable sort of the keys that also returns each
    sample's input position, and a gather of the losses (differentiable in
    kappa; stable, which ``keep_input_order`` needs: ties keep their input order).
  Padding: key ``_PAD_KEY``, loss 0.
  """
  key = _sort.float_key(c)
  if correct.dtype == jnp.bool_ and not keep_input_order:
    error = jnp.logical_not(correct).astype(jnp.int32)
    neg = _sort.sort(-((key << 1) | error), length=length, fill=-2 * _PAD_KEY)
    return (-neg) >> 1, (-neg) & 1
  loss = 1.0 - correct.astype(jnp.float32)
  neg_key, order = _sort.sort_with_order(-key, length=length, fill=-_PAD_KEY)
  return -neg_key, jnp.take(loss, order, mode="fill", fill_value=0)


class _Slots(NamedTuple):
  """The tie-group scan at slots ``k`` (1-based positions in decreasing confidence order).

  Every field but ``k`` and ``new`` describes the samples *before* slot k.
  When ``new`` (the key at k differs from the key at k - 1), slot k closes the
  tie group ending at position k - 1: its confidence key is ``key``, it spans
  positions ``start .. k - 1``, the loss up to its end is ``cum`` and up to
  the previous group's end ``before``; it is group number ``groups - 1``.
  """
  k: jax.Array        # int32
  new: jax.Array      # bool (always at k = 1 and k = n + 1)
  key: jax.Array      # int32 key at k - 1
  cum: jax.Array      # E_{k-1}: int32 (binary) or float32 (graded)
  start: jax.Array    # int32 first position of the group holding k - 1
  before: jax.Array   # E at position start - 1
  groups: jax.Array   # int32 number of group starts at positions < k


class _Carry(NamedTuple):
  cum: jax.Array
  compensation: jax.Array  # Kahan compensation of ``cum`` (graded losses)
  start: jax.Array
  before: jax.Array
  key: jax.Array
  k: jax.Array
  groups: jax.Array


def _scan_sequential(keys: jax.Array, losses: jax.Array, carry: _Carry):
  """One chunk as a sequential loop; float losses are summed with Kahan compensation."""
  graded = losses.dtype != jnp.int32
  # The key comparisons are vectorized; the loop carries only what depends on
  # the previous sample.
  prev_key = jnp.concatenate([carry.key[None], keys[:-1]])
  new = keys != prev_key

  def step(c: _Carry, x):
    is_new, loss = x
    if graded:
      y = loss - c.compensation
      cum = c.cum + y
      compensation = (cum - c.cum) - y
    else:
      cum, compensation = c.cum + loss, c.compensation
    out = (c.cum, c.start, c.before, c.groups)
    return _Carry(cum, compensation, jnp.where(is_new, c.k, c.start),
                  jnp.where(is_new, c.cum, c.before), c.key, c.k + 1,
                  c.groups + is_new.astype(jnp.int32)), out

  carry, (cum, start, before, groups) = lax.scan(step, carry, (new, losses), unroll=8)
  return carry._replace(key=keys[-1]), (new, prev_key, cum, start, before, groups)


def _scan_parallel(keys: jax.Array, losses: jax.Array, carry: _Carry, running_max: bool = True):
  """One chunk as parallel prefix sums, and each slot's group start by one scatter and a gather.

  Integer running sums are ``lax.cumsum`` (one library scan on GPUs); float
  losses use a tree-shaped scan (``associative_scan``, rounding error
  O(log n)). Binary losses: each slot's group start and the E before it are
  running maxima (``running_max``; False: as graded losses); graded losses: the group
  starts are written to a table indexed by the group number (each start its
  own entry) and read back at every slot.
  """
  size = keys.shape[0]
  k = carry.k + lax.iota(jnp.int32, size)
  shifted = lambda first, x: jnp.concatenate([first[None], x[:-1]])
  prev_key = shifted(carry.key, keys)
  new = keys != prev_key
  if losses.dtype == jnp.int32:
    running = lax.cumsum(losses)
  else:
    running = lax.associative_scan(jnp.add, losses)
  cum_incl = carry.cum + running
  cum = shifted(carry.cum, cum_incl)
  local = lax.cumsum(new.astype(jnp.int32))  # group starts in this chunk at slots <= k
  groups_incl = carry.groups + local
  if losses.dtype == jnp.int32 and running_max:
    # k increases and the integer E never decreases: the latest start and the E
    # before it are running maxima over the starts (two scans, no scatter).
    # (Slots k >= 1, so a positive running maximum means a start was seen; the group
    # count, a third scan, is then computed only where a result reads it.)
    latest = lax.cummax(jnp.where(new, k, 0))
    start_incl = jnp.where(latest > 0, latest, carry.start)
    before_incl = jnp.where(latest > 0, lax.cummax(jnp.where(new, cum, 0)), carry.before)
  else:
    # Entry j: slot and E before slot of the chunk's (j + 1)-th group start.
    at = jnp.where(new, local - 1, size + lax.iota(jnp.int32, size))  # distinct; rest dropped
    starts = jnp.zeros((size,), jnp.int32).at[at].set(k, mode="drop", unique_indices=True)
    befores = jnp.zeros((size,), cum.dtype).at[at].set(cum, mode="drop", unique_indices=True)
    latest = jnp.maximum(local - 1, 0)
    start_incl = jnp.where(local > 0, starts[latest], carry.start)
    before_incl = jnp.where(local > 0, befores[latest], carry.before)
  out = (new, prev_key, cum, shifted(carry.start, start_incl), shifted(carry.before, before_incl),
         shifted(carry.groups, groups_incl))
  return _Carry(cum_incl[-1], carry.compensation, start_incl[-1], before_incl[-1], keys[-1],
                k[-1] + 1, groups_incl[-1]), out


def _scan_groups(keys: jax.Array, losses: jax.Array, reduce, init, *, chunk: int,
                 sequential: bool, running_max: bool = True):
  """Folds ``reduce(acc, slots, chunk_index)`` over the tie-group scan of sorted outcomes
  (``running_max``: how the parallel scan finds the group starts of binary losses)."""
  zero = jnp.zeros((), losses.dtype)
  one = jnp.ones((), jnp.int32)
  carry = _Carry(zero, zero, one, zero, jnp.asarray(_NO_KEY, jnp.int32), one, 0 * one)
  scan = (_scan_sequential if sequential
          else functools.partial(_scan_parallel, running_max=running_max))

  def body(i, state):
    carry, acc = state
    slice_ = lambda x: lax.dynamic_slice_in_dim(x, i * chunk, chunk)
    k = carry.k + lax.iota(jnp.int32, chunk)
    carry, out = scan(slice_(keys), slice_(losses), carry)
    return carry, reduce(acc, _Slots(k, *out), i)

  carry, init = _mesh.vary_like((carry, init), keys, losses)
  num_chunks = losses.shape[0] // chunk
  if num_chunks == 1:
    return body(0, (carry, init))[1]
  return lax.fori_loop(0, num_chunks, body, (carry, init))[1]


# --------------------------------------------------------------------------
# AURC, AUGRC, E-AURC
# --------------------------------------------------------------------------


def _closes(s: _Slots, n: int) -> jax.Array:
  """Slots that close a tie group of the n samples."""
  return s.new & (s.k >= 2) & (s.k <= n + 1)


def _risk(s: _Slots) -> jax.Array:
  """Selective risk E_{k-1} / (k - 1) at each slot (0 / 1 at k = 1)."""
  return s.cum.astype(jnp.float32) / jnp.maximum(s.k - 1, 1).astype(jnp.float32)


def _area_terms(s: _Slots, n: int, convention: str):
  """Per-slot contributions to (n AURC, n^2 AUGRC).

  Tie-grouped conventions: the closed group's area at the slot that closes it
  (:func:`cwsa_jax._areas.point_terms`). "published_code": position k - 1's
  trapezoid weight times E_{k-1} / (k - 1).
  """
  end = s.k - 1
  cumf = s.cum.astype(jnp.float32)
  risk = _risk(s)
  zero = jnp.float32(0.0)
  if convention == "published_code":
    valid = (end >= 1) & (end <= n)
    weight = _areas.published_weight(end, n)
    return jnp.where(valid, weight * risk, zero), jnp.where(valid, weight * cumf, zero)
  closes = _closes(s, n)
  width = (s.k - s.start).astype(jnp.float32)
  previous = None
  if convention == "trapezoid":  # the group before: it ends at start - 1 with loss ``before``
    previous_end = s.start - 1
    beforef = s.before.astype(jnp.float32)
    previous = (previous_end > 0, beforef / jnp.maximum(previous_end, 1).astype(jnp.float32),
                beforef)
  aurc_terms, augrc_terms = _areas.point_terms(width, risk, cumf, convention, previous)
  return jnp.where(closes, aurc_terms, zero), jnp.where(closes, augrc_terms, zero)


def _excess_terms(s: _Slots, n: int, num_correct: jax.Array, convention: str) -> jax.Array:
  """Per-slot n E-AURC ("step", "trapezoid"; every term >= 0, from the integer differences to
  the oracle, :mod:`cwsa_jax._areas`): the closed group's term at the slot that closes it,
  and for "step" the oracle's tie term of position k - 1 where it is not its group's last."""
  end = s.k - 1
  width = s.k - s.start  # at the closing slot W; else k - 1 - K' (K' = start - 1)
  zero = jnp.float32(0.0)
  closes = _closes(s, n)
  if convention == "trapezoid":
    previous_end = s.start - 1
    point = _areas.trapezoid_excess(width, jnp.maximum(end, 1), s.cum,
                                    (previous_end > 0, previous_end, s.before), num_correct, n)
    return jnp.where(closes, point, zero)
  point = _areas.step_excess(width, jnp.maximum(end, 1), s.cum, num_correct)
  inside = ~s.new & (s.k >= 2) & (s.k <= n)  # position k - 1 ties with position k
  return (jnp.where(closes, point, zero)
          + jnp.where(inside, _areas.tie_excess(width, end, num_correct), zero))


def _published_binary(c, correct, *, with_eaurc):
  """AURC, AUGRC and E-AURC, "published_code" convention, boolean correctness.

  No tie groups: one stable sort gives the running error count E_p at every
  position (``_sort.stable_flag_counts``; on CPU NumPy counts them right after
  sorting), and the areas are one fused weighted sum over positions.
  """
  n = c.shape[0]
  error = jnp.logical_not(correct).astype(jnp.int32)
  cum = _sort.stable_flag_counts(-_sort.float_key(c), error)  # E_p, p = 1..n
  positionf = (lax.iota(jnp.int32, n) + 1).astype(jnp.float32)

  def trapezoid(cumf):  # sum_p w_p E_p / p and sum_p w_p E_p, w = 1 but 1/2 at p = 1 and p = n
    ends = lambda x: jnp.where(n > 1, 0.5 * (x[0] + x[-1]), x[0])
    return jnp.sum(cumf / positionf) - ends(cumf / positionf), jnp.sum(cumf) - ends(cumf)

  aurc_value, augrc_value = _areas.areas(*trapezoid(cum.astype(jnp.float32)), n)
  if not with_eaurc:
    return RiskCoverageSummary(aurc_value, augrc_value, jnp.float32(jnp.nan))
  num_errors = cum[n - 1]
  m = n - num_errors  # number of correct samples
  # sum_p w_p (E_p - E*_p) / p: nonnegative integer differences to the optimal strict order.
  position = lax.iota(jnp.int32, n) + 1
  difference = (cum - _areas.oracle_errors(position, m)).astype(jnp.float32)
  return RiskCoverageSummary(aurc_value, augrc_value,
                             _excess(trapezoid(difference)[0], n, num_errors))


def _summary_kernel(c, correct, *, convention, sequential, with_eaurc, running_max=True):
  """AURC, AUGRC and (binary correctness, ``with_eaurc``) E-AURC of one row.

  E-AURC is the sum of nonnegative terms from the integer differences
  ``E_K - E*_K`` to the optimal order (:func:`_excess_terms`): nothing cancels, and
  it is exactly 0 for an optimal order or one class.
  """
  if convention == "published_code" and correct.dtype == jnp.bool_:
    return _published_binary(c, correct, with_eaurc=with_eaurc)
  n = c.shape[0]
  chunk, length = _layout(n, sequential, groups=convention != "published_code")
  keys, losses = _sorted_outcomes(c, correct, keep_input_order=convention == "published_code",
                                  length=length)
  with_eaurc = with_eaurc and correct.dtype == jnp.bool_
  num_errors = jnp.sum(jnp.logical_not(correct).astype(jnp.int32))
  m = n - num_errors  # number of correct samples

  def reduce(sums, s, i):
    aurc_terms, augrc_terms = _area_terms(s, n, convention)
    row = [jnp.sum(aurc_terms), jnp.sum(augrc_terms)]
    if with_eaurc:
      row.append(jnp.sum(_excess_terms(s, n, m, convention)))
    return lax.dynamic_update_index_in_dim(sums, jnp.stack(row), i, 0)

  num_chunks = length // chunk
  init = jnp.zeros((num_chunks, 2 + with_eaurc), jnp.float32)
  sums = _scan_groups(keys, losses, reduce, init, chunk=chunk,
                      sequential=sequential, running_max=running_max)
  total = jnp.sum(sums, axis=0)  # pairwise over chunks
  aurc_value, augrc_value = _areas.areas(total[0], total[1], n)
  if not with_eaurc:
    return RiskCoverageSummary(aurc_value, augrc_value, jnp.float32(jnp.nan))
  return RiskCoverageSummary(aurc_value, augrc_value, _excess(total[2], n, num_errors))


def _per_sample(total, n) -> jax.Array:
  """``total / n`` rounded once: XLA would multiply by ``1 / n`` (n is static), 1 ulp off in
  about half the cases (``_stats.divide``)."""
  return _stats.divide((total, n))[0]


def _excess(total, n, num_errors) -> jax.Array:
  """E-AURC from its summed n E-AURC terms (``total / n`` rounded once), exactly 0 with one
  class (:func:`cwsa_jax._areas.excess_area`)."""
  return _areas.excess_area(total, n, num_errors, divide=_stats.divide)


def _per_backend(kernel, kernels: _dispatch.Kernels, *args, cuda=None, **options):
  """``kernel(*args, sequential=...)`` as ``kernels`` picks: the sequential form on CPU, the
  parallel one elsewhere (or ``cuda(*args)`` on CUDA GPUs, where given)."""
  return kernels.pick(
      "risk_coverage", *args, cpu=functools.partial(kernel, sequential=True, **options),
      default=functools.partial(kernel, sequential=False,
                                running_max=kernels.starts_by_running_max, **options),
      cuda=cuda)


def _summary_by_tiles(c, correct, *, convention, with_eaurc,
                      kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  """:func:`_summary_kernel` of boolean outcomes on CUDA GPUs: the sort, ``_group_areas``'
  kernel for the areas, and for E-AURC XLA prefix sums and reductions of the same bytes (the
  terms of :func:`_excess_terms`, position p in the place of slot p + 1)."""
  n = c.shape[0]
  keys, errors = _sorted_outcomes(c, correct, keep_input_order=False, length=n + 1)
  byte = _group_areas.flags(keys, errors, n)
  aurc_sum, augrc_sum = _group_areas.area_sums(byte, convention=convention, kernels=kernels)
  aurc_value, augrc_value = _areas.areas(aurc_sum, augrc_sum, n)
  if not with_eaurc:
    return RiskCoverageSummary(aurc_value, augrc_value, jnp.float32(jnp.nan))
  error, start = _group_areas.error_and_start(byte)
  position = lax.iota(jnp.int32, byte.shape[0]) + 1  # past n: no error, no start
  num_errors = jnp.sum(error)
  m = n - num_errors  # number of correct samples
  cum = lax.cumsum(error)  # E_p
  real = position <= n
  ends = real & ((jnp.concatenate([start[1:], jnp.zeros((1,), start.dtype)]) == 1)
                 | (position == n))
  first = lax.cummax(jnp.where(start == 1, position, 0))  # the group's first position
  width = position - first + 1  # at an end W; else p - K'
  zero = jnp.float32(0.0)
  if convention == "step":
    terms = (jnp.where(ends, _areas.step_excess(width, position, cum, m), zero)
             + jnp.where(real & ~ends, _areas.tie_excess(width, position, m), zero))
  else:
    previous_end = first - 1
    before = jnp.where(previous_end > 0, cum[jnp.maximum(previous_end - 1, 0)], 0)
    terms = jnp.where(ends, _areas.trapezoid_excess(width, position, cum,
                                                    (previous_end > 0, previous_end, before),
                                                    m, n), zero)
  return RiskCoverageSummary(aurc_value, augrc_value, _excess(jnp.sum(terms), n, num_errors))


@functools.partial(jax.jit, static_argnames=("convention", "with_eaurc", "kernels"))
def _summary_impl(c, correct, *, convention, with_eaurc, kernels):
  """:func:`_summary_kernel` on every backend: ``_summary_by_tiles`` on CUDA GPUs where it
  applies (boolean correctness, "step" or "trapezoid")."""
  cuda = None
  if _group_areas.applies(c, correct, convention, kernels=kernels):
    cuda = functools.partial(_summary_by_tiles, convention=convention, with_eaurc=with_eaurc,
                             kernels=kernels)
  return _per_backend(_summary_kernel, kernels, c, correct, cuda=cuda, convention=convention,
                      with_eaurc=with_eaurc)


# --------------------------------------------------------------------------
# The curve and the working points
# --------------------------------------------------------------------------


def _curve_point(end, cum, key, n: int):
  """(threshold, coverage, risk, generalized risk) of groups ending at ``end`` (1-based) with
  loss ``cum`` up to there and confidence key ``key``; every division rounded once."""
  cumf, endf = cum.astype(jnp.float32), end.astype(jnp.float32)
  coverage, generalized = _stats.divide((endf, n), (cumf, n))
  return (lax.bitcast_convert_type(key, jnp.float32), coverage, cumf / endf, generalized)


def _curve_binary_sequential(c, correct):
  """The curve of boolean correctness on CPU: one sequential pass of two running counts.

  In decreasing confidence order, position i (0-based) ends a tie group when
  its key differs from the next one (the padding key after the last sample
  differs from every key); the running error count E and the running count
  of group ends give each end its group number, and one scatter writes the
  ends in order.
  """
  n = c.shape[0]
  keys, errors = _sorted_outcomes(c, correct, keep_input_order=False, length=n + 1)
  is_end = (keys[:n] != keys[1:]).astype(jnp.int32)

  def step(carry, x):
    carry = (carry[0] + x[0], carry[1] + x[1])
    return carry, carry

  zero = _mesh.vary_like(jnp.zeros((), jnp.int32), errors)
  _, (cum, groups) = lax.scan(step, (zero, zero), (errors[:n], is_end), unroll=8)
  position = lax.iota(jnp.int32, n)
  slot = jnp.where(is_end == 1, groups - 1, n)  # n: not an end, dropped
  end = jnp.zeros((n,), jnp.int32).at[slot].set(position + 1, mode="drop", unique_indices=True)
  num_points = groups[n - 1]
  end = jnp.where(position < num_points, end, n)  # the padding repeats the last group
  points = _curve_point(end, cum[end - 1], keys[end - 1], n)
  thresholds = _group_confidences(points[0], c, num_points)
  return RiskCoverageCurve(thresholds, *points[1:], num_points=num_points)


def _curve_kernel(c, correct, *, sequential, running_max=True):
  if sequential and correct.dtype == jnp.bool_:
    return _curve_binary_sequential(c, correct)
  n = c.shape[0]
  chunk, length = _layout(n, sequential)
  keys, losses = _sorted_outcomes(c, correct, keep_input_order=False, length=length)

  # The ends and losses of the groups a chunk closes are compacted in a
  # chunk-sized buffer (a scatter in cache), then written as one contiguous
  # block after those of the earlier chunks (an in-place dynamic-update-slice;
  # the buffers have a chunk of slack at the end, overwritten or cut off).
  def reduce(acc, s, i):
    ends, cums, count = acc
    closes = _closes(s, n)
    local = jnp.where(closes, s.groups - 1 - count, chunk)  # chunk: out of range, dropped

    def put(buffer, values):
      block = jnp.zeros((chunk,), buffer.dtype).at[local].set(values, mode="drop")
      return lax.dynamic_update_slice_in_dim(buffer, block, count, 0)

    return put(ends, s.k - 1), put(cums, s.cum), count + jnp.sum(closes.astype(jnp.int32))

  size = n + chunk
  init = (jnp.zeros((size,), jnp.int32), jnp.zeros((size,), losses.dtype), jnp.zeros((), jnp.int32))
  ends, cums, num_points = _scan_groups(keys, losses, reduce, init, chunk=chunk,
                                        sequential=sequential, running_max=running_max)

  # Group g ends at position ends[g] (1-based); the padding repeats the last
  # group, which always ends at n.
  end = jnp.maximum(ends[:n], 1)
  real = lax.iota(jnp.int32, n) < num_points
  last = _curve_point(jnp.int32(n), cums[num_points - 1], keys[n - 1], n)
  out = tuple(jnp.where(real, v, w)
              for v, w in zip(_curve_point(end, cums[:n], keys[end - 1], n), last))
  thresholds = _group_confidences(out[0], c, num_points)
  return RiskCoverageCurve(thresholds, *out[1:], num_points=num_points)


@functools.partial(jax.jit, static_argnames=("kernels",))
def _curve_impl(c, correct, *, kernels):
  return _per_backend(_curve_kernel, kernels, c, correct)


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
  group = jnp.searchsorted(-key, -_sort.float_key(confidences), side="left")
  group = jnp.minimum(group, num_points - 1)
  d_confidences = tangents[1].astype(jnp.float32)
  total = jax.ops.segment_sum(d_confidences, group, num_segments=n)
  count = jax.ops.segment_sum(jnp.ones_like(d_confidences), group, num_segments=n)
  mean = total / jnp.maximum(count, 1.0)
  tangent = mean[jnp.minimum(jnp.arange(n), num_points - 1)]  # padding repeats the last point
  return thresholds, tangent


def _first_position(n: int, target: jax.Array) -> jax.Array:
  """Smallest position p in [1, n] whose coverage p / n is >= ``target`` (n if none), by bisection."""
  low = jnp.zeros(target.shape, jnp.int32)  # positions 1..low have coverage < target
  high = jnp.full(target.shape, n, jnp.int32)
  for _ in range(int(n).bit_length() + 1):
    mid = (low + high + 1) // 2
    below = _per_sample(mid.astype(jnp.float32), n) < target
    low, high = jnp.where(below, mid, low), jnp.where(below, high, mid - 1)
  return jnp.minimum(low + 1, n)


def _risk_at_coverage_kernel(c, correct, target, *, sequential, running_max=True):
  n = c.shape[0]
  chunk, length = _layout(n, sequential)
  keys, losses = _sorted_outcomes(c, correct, keep_input_order=False, length=length)
  flat = target.reshape(-1)
  position = _first_position(n, flat - _TARGET_SLACK)  # the answer is its tie group's risk

  def reduce(acc, s, i):
    end = s.k - 1
    holds = (_closes(s, n)[:, None] & (s.start[:, None] <= position[None, :])
             & (position[None, :] <= end[:, None]))
    return acc + jnp.sum(jnp.where(holds, _risk(s)[:, None], jnp.float32(0.0)), axis=0)

  init = jnp.zeros(flat.shape, jnp.float32)
  result = _scan_groups(keys, losses, reduce, init, chunk=chunk,
                     sequential=sequential, running_max=running_max)
  return result.reshape(target.shape)


@functools.partial(jax.jit, static_argnames=("kernels",))
def _risk_at_coverage_impl(c, correct, target, *, kernels):
  return _per_backend(_risk_at_coverage_kernel, kernels, c, correct, target)


def _coverage_at_risk_kernel(c, correct, target, *, sequential, running_max=True):
  n = c.shape[0]
  chunk, length = _layout(n, sequential)
  keys, losses = _sorted_outcomes(c, correct, keep_input_order=False, length=length)
  flat = target.reshape(-1)

  def reduce(acc, s, i):
    ok = _closes(s, n)[:, None] & (_risk(s)[:, None] <= flat[None, :] + _TARGET_SLACK)
    return jnp.maximum(acc, jnp.max(jnp.where(ok, (s.k - 1)[:, None], 0), axis=0))

  init = jnp.zeros(flat.shape, jnp.int32)
  best = _scan_groups(keys, losses, reduce, init, chunk=chunk,
                   sequential=sequential, running_max=running_max)
  return _per_sample(best.astype(jnp.float32), n).reshape(target.shape)


@functools.partial(jax.jit, static_argnames=("kernels",))
def _coverage_at_risk_impl(c, correct, target, *, kernels):
  return _per_backend(_coverage_at_risk_kernel, kernels, c, correct, target)
