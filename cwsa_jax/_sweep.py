"""The fused threshold sweep: every hard metric at every threshold in one call.

A kernel that compares every sample with every threshold materialises an
n x T mask: O(nT) time and memory. Here each sample is instead *bucketed*
into its threshold interval, the per-bucket sufficient statistics are summed
exactly (``_exact``), and a reverse cumulative sum over the T + 1 buckets gives
the retained-set statistics of every threshold at once. The cost is O(n) plus
a few passes of a short binary search, nearly flat in T.

Bucketing uses a small table over [0, 1] split into 2T or more equal cells:
for each cell, the index of its first threshold and the number of thresholds
inside it; a binary search over that (usually empty or single-element) range
finishes the job. ``c >= tau`` is evaluated exactly,
so ties at a threshold are retained, as the paper defines.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cwsa_jax import _exact
from cwsa_jax import _stats
from cwsa_jax import _validation

class SweepResult(NamedTuple):
  """Hard metrics at every threshold; every field has shape [..., T]."""
  thresholds: jax.Array
  coverage: jax.Array
  selective_accuracy: jax.Array
  cwsa: jax.Array
  cwsa_plus: jax.Array


def num_cells(num_thresholds: int) -> int:
  """Static size of the bucket table: a power of two >= 2T (at least 64)."""
  return max(64, 1 << (2 * num_thresholds - 1).bit_length())


def _cell(x: jax.Array, cells: int) -> jax.Array:
  # floor(x * cells) is monotone non-decreasing in x (cells is a power of two,
  # so the product is exact): cell(t) < cell(c) implies t < c, and
  # cell(t) > cell(c) implies t > c. Only equal cells need a comparison.
  return jnp.clip(jnp.floor(x * cells), 0, cells - 1).astype(jnp.int32)


def bucket_table(sorted_thresholds: jax.Array, cells: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per cell: index of its first threshold, number of thresholds in it; and the max count."""
  counts = jnp.zeros((cells,), jnp.int32).at[_cell(sorted_thresholds, cells)].add(1)
  first = jnp.cumsum(counts) - counts
  return first, counts, jnp.max(counts)


def bucketize(confidences: jax.Array, sorted_thresholds: jax.Array, first: jax.Array,
              counts: jax.Array, max_per_cell: jax.Array) -> jax.Array:
  """Number of sorted thresholds <= each confidence: its bucket in [0, T].

  ``k = first[cell(c)] + #{thresholds t in cell(c) : t <= c}``, the second
  term found by binary lifting with ceil(log2(max_per_cell + 1)) steps (one
  step for any grid finer than the table).
  """
  num_thresholds = sorted_thresholds.shape[0]
  cell = _cell(confidences, first.shape[0])
  if num_thresholds < (1 << 15):
    # One gather instead of two: first and count packed in 15 + 16 bits.
    packed = (first << 16) | counts
    entry = packed[cell]
    start, end = entry >> 16, (entry >> 16) + (entry & 0xFFFF)
  else:
    start = first[cell]
    end = start + counts[cell]
  num_steps = 32 - jax.lax.clz(max_per_cell)

  def step(i, k):
    stride = jnp.left_shift(1, num_steps - 1 - i)
    probe = k + stride
    index = jnp.clip(probe - 1, 0, num_thresholds - 1)
    take = (probe <= end) & (sorted_thresholds[index] <= confidences)
    return jnp.where(take, probe, k)

  return jax.lax.fori_loop(0, num_steps, step, start)


def sorted_thresholds(thresholds: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(argsort order, sorted thresholds) of a [T] threshold vector.

  A NaN threshold (possible only inside a user's ``jit``, where its results are
  NaN) is sorted last and bucketed as +inf, so the cell table of the others
  never depends on how NaN converts to an integer.
  """
  order = jnp.argsort(thresholds)
  sorted_values = thresholds[order]
  return order, jnp.where(jnp.isnan(sorted_values), jnp.inf, sorted_values)


def bucket_sums(confidences: jax.Array, correct: jax.Array, sorted_thresh: jax.Array,
                mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Exact per-bucket statistics ``(hi, lo)``, int32 [T + 1, W], of 1-D samples.

  Bucket ``b`` holds the samples with exactly ``b`` sorted thresholds <= c;
  W is 6 (binary correctness: wrong and correct segments of 3 columns) or 12
  (graded). Samples with ``mask`` False are left out. The sums are exact
  integers in canonical form, so adding two of them (and normalising) gives
  bit-for-bit the sums of the concatenated samples.
  """
  num_thresholds = sorted_thresh.shape[0]
  graded = correct.dtype != jnp.bool_
  first, counts, max_per_cell = bucket_table(sorted_thresh, num_cells(num_thresholds))
  per_bucket = _stats.segments_per_bucket(graded)
  num_segments = per_bucket * (num_thresholds + 1)

  def columns_fn(c, kappa, *keep):
    bucket = bucketize(jnp.clip(c, 0.0, 1.0), sorted_thresh, first, counts, max_per_cell)
    ids, cols = _stats.segment_columns(c, kappa, bucket)
    if keep:  # out-of-range ids are dropped by the segment sum
      ids = jnp.where(keep[0], ids, num_segments)
    return ids, cols

  arrays = [confidences, correct] + ([] if mask is None else [mask])
  hi, lo = _exact.segment_sums(columns_fn, arrays, num_segments)
  # [buckets * per_bucket, K] -> [buckets, per_bucket * K]
  return hi.reshape(num_thresholds + 1, -1), lo.reshape(num_thresholds + 1, -1)


def sums_from_bucket_sums(hi: jax.Array, lo: jax.Array) -> _stats.Sums:
  """Retained-set :class:`~cwsa_jax._stats.Sums` [T + 1] of exact per-bucket sums [T + 1, W].

  Entry ``b`` sums the buckets ``b, ..., T``: entry 0 is every sample, entry
  ``j + 1`` the retained set of sorted threshold ``j``.
  """
  graded = hi.shape[-1] != 6
  hi, lo = _exact.suffix_sums(hi, lo)
  return _stats.sums_from_columns(_exact.to_float(hi, lo), graded)


def result_from_sums(sums: _stats.Sums, thresholds: jax.Array, order: jax.Array,
                     invalid: jax.Array) -> SweepResult:
  """The :class:`SweepResult` at ``thresholds`` (user order) of the suffix sums (sorted order).

  Results are NaN where ``invalid`` (scalar) is set or a threshold lies
  outside [0, 1).
  """
  num_thresholds = thresholds.shape[0]
  n = sums.count[0]
  metrics = _stats.metrics_from_sums(_stats.Sums(*(x[1:] for x in sums)), thresholds[order], n)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(num_thresholds, dtype=order.dtype))
  fields = [m[inverse] for m in metrics]
  fields = _validation.poison(fields, rows=invalid, items=_validation.bad_threshold(thresholds))
  return SweepResult(thresholds, *fields)


def result_from_bucket_sums(hi: jax.Array, lo: jax.Array, thresholds: jax.Array,
                            order: jax.Array, invalid: jax.Array) -> SweepResult:
  """The :class:`SweepResult` of per-bucket sums (sorted order) at ``thresholds`` (user order)."""
  return result_from_sums(sums_from_bucket_sums(hi, lo), thresholds, order, invalid)


def _exact_suffix_sums(confidences, correct, sorted_thresh):
  return sums_from_bucket_sums(*bucket_sums(confidences, correct, sorted_thresh))


def _segments(confidences, correct, sorted_thresh):
  del correct
  num_thresholds = sorted_thresh.shape[0]
  first, counts, max_per_cell = bucket_table(sorted_thresh, num_cells(num_thresholds))
  bucket = bucketize(jnp.clip(confidences, 0.0, 1.0), sorted_thresh, first, counts, max_per_cell)
  return bucket, (num_thresholds + 1,), 0


@jax.jit
def _sweep_1d(confidences, correct, thresholds):
  order, sorted_thresh = sorted_thresholds(thresholds)
  # Exact sums; their derivative in c (and kappa) is the float sum over each retained set.
  sums = _stats.exact_sums(_exact_suffix_sums, _segments, confidences, correct, sorted_thresh)
  return result_from_sums(sums, thresholds, order, jnp.zeros((), bool))


def sweep(confidences, correct, thresholds, *, normalize: str = "retained") -> SweepResult:
  """Coverage, selective accuracy, CWSA and CWSA+ at every threshold, fused.

  For each threshold tau_t, with S_t = {i : c_i >= tau_t} and
  phi_i = (c_i - tau_t)/(1 - tau_t):

  .. math::

    \\mathrm{coverage}_t = |S_t|/n, \\quad
    \\mathrm{CWSA}_t = \\frac{1}{|S_t|}\\sum_{S_t} \\phi_i (2\\kappa_i - 1), \\quad
    \\mathrm{CWSA}^+_t = \\frac{1}{|S_t|}\\sum_{S_t} \\phi_i \\kappa_i,

  and selective accuracy = mean of kappa over S_t. CWSA and CWSA+ are 0 and
  selective accuracy NaN where S_t is empty.

  One jitted call costs O(n + T) plus a short binary search per sample, so it
  is nearly flat in T; the sums are exact, so float32 results stay within a
  few ulp of a float64 computation. Thresholds may be in any order.

  Args:
    confidences: [..., n] confidences in [0, 1]. Leading axes are batch axes
      (e.g. models or bootstrap resamples); the function is also
      ``jax.vmap``-able.
    correct: [..., n] bool or 0/1 correctness, or graded correctness kappa in
      [0, 1] (float).
    thresholds: [T] thresholds in [0, 1).
    normalize: ``"retained"`` (default, the paper's definition: CWSA divided by
      ``|S|``) or ``"all"`` (CWSA divided by n, as the paper's published code does;
      equals coverage x CWSA).

  Returns:
    :class:`SweepResult` with fields ``thresholds`` [T] and ``coverage``,
    ``selective_accuracy``, ``cwsa``, ``cwsa_plus`` [..., T].

  Raises:
    ValueError: on concrete inputs with NaN/inf, values outside [0, 1],
      integer correctness other than 0/1, thresholds outside [0, 1),
      mismatched shapes or no samples. Inside a user's ``jit`` / ``vmap``
      invalid values give NaN instead: the whole row for invalid samples,
      the column of an invalid threshold.

  Gradients: CWSA and CWSA+ are differentiable almost everywhere in the
  confidences (and in graded correctness and in the thresholds): the
  retained sets are locally constant, phi is linear in c, so
  d CWSA / d c_i = (2 kappa_i - 1) / ((1 - tau) |S|) for a retained sample and
  0 otherwise (``normalize="all"``: n instead of |S|; CWSA+: kappa_i instead
  of 2 kappa_i - 1), and d phi_i / d tau = (c_i - 1)/(1 - tau)^2. These are
  returned exactly (a custom JVP beside the exact integer sums). Coverage
  and selective accuracy are piecewise constant in c: their gradient in c
  is 0, which is exact almost everywhere (see ``soft_cwsa`` for a relaxed
  one).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import sweep
    >>> r = sweep(jnp.array([0.9, 0.6, 0.8, 0.55]), jnp.array([True, False, True, True]),
    ...           jnp.array([0.5, 0.7]))
    >>> print(r.coverage.tolist(), [round(float(x), 4) for x in r.cwsa])
    [1.0, 0.5] [0.325, 0.5]
  """
  _stats.check_normalize(normalize)
  confidences, correct, invalid = _validation.samples(confidences, correct)
  thresholds, _ = _validation.thresholds(thresholds)  # invalid ones: NaN in the kernel
  fn = _sweep_1d
  for _ in range(confidences.ndim - 1):
    fn = jax.vmap(fn, in_axes=(0, 0, None))
  result = fn(confidences, correct, thresholds)
  result = _stats.renormalize(result, normalize)
  fields = _validation.poison(tuple(result[1:]), rows=invalid)
  return SweepResult(result.thresholds, *fields)
