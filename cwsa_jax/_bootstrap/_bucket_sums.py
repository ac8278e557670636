"""The evaluation bootstrap's data, prepared once, and the exact bucket sums of a resample.

The samples are sorted once by decreasing confidence (on the host), each sample's bucket of
the merged grid of thresholds and bin edges is found once, and a resample given as
multiplicities over that order gets the sweep's exact per-bucket sums, from which the sweep
and the equal-width ECE follow (``_sweep_and_calibration``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _calibration
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _stats
from cwsa_jax import _sweep

# --- every metric of the evaluation report, from one sort ---------------------------------
#
# Each resample is evaluated in two parts that share nothing with a sort:
#
# * the samples are sorted once by decreasing confidence, and resample b is
#   the vector of multiplicities m_i = #{j : i_bj = i} over that order (a
#   count of its indices);
# * the sweep and the equal-width calibration bins are sums over the buckets
#   of the merged grid of thresholds and bin edges: each sample's bucket is
#   found once (``_sweep.bucket_ids``), and a resample's exact bucket sums
#   (the sweep's binary layout) are sums of m and of m times the digits of
#   1 - c, in streaming order; the retained set of each threshold and each
#   bin is then a range of buckets;
# * the risk-coverage points of the resample are at the tie-group ends, at
#   K = the prefix sum of m and E = the prefix sum of m (1 - kappa): one
#   sequential pass, no sort.
_DIGIT_BITS = 6
_SUM_BLOCK = 1024  # samples per block of the bucket sums' variadic reduction


class _Evaluation(NamedTuple):
  """The data of one evaluation bootstrap, prepared once (per sample: in sorted order)."""
  rank: jax.Array | None   # [n] sorted position of input sample i (None: the input is sorted)
  source: jax.Array | None  # [n] uint32 input row of each sorted position (Poisson scheme only)
  run_start: jax.Array     # [R + 1] where each run of one bucket starts in sorted order (and n)
  run_bucket: jax.Array    # [R] the bucket of the merged grid of each run
  digits: jax.Array        # [4, n] 6-bit digits of the binary layout's columns u_hi, u_lo
  correct: jax.Array       # [n] bool
  group_end: jax.Array     # [n] bool: last sample of its tie group
  retained: jax.Array      # [T] bucket where the retained set of each sorted threshold starts
  bins: jax.Array          # [B + 1] bucket where each bin starts (and G + 1)


class _Plan(NamedTuple):
  """Static choices of one evaluation bootstrap."""
  num_buckets: int  # of the merged grid of thresholds and bin edges
  num_thresholds: int
  num_bins: int
  ece_norm: str
  convention: str
  normalize: str
  scheme: str  # "multinomial" or "poisson"
  kernels: _dispatch.Kernels = _dispatch.DEFAULT  # the area scan's form per platform


@jax.jit
def _buckets_and_digits(confidences: jax.Array, grid: jax.Array):
  """Each sample's bucket of ``grid`` and the [4, n] 6-bit digits (int8) of the binary
  layout's 12-bit columns (u_hi, u_lo) of 1 - c."""
  u_hi, u_lo = _exact.grid_columns(1.0 - jnp.clip(confidences, 0.0, 1.0))
  mask = (1 << _DIGIT_BITS) - 1
  digits = jnp.stack([u_hi >> _DIGIT_BITS, u_hi & mask, u_lo >> _DIGIT_BITS, u_lo & mask])
  return _sweep.bucket_ids(confidences, grid), digits.astype(jnp.int8)


def _digit_columns(m: jax.Array, correct: jax.Array, digits: jax.Array) -> list[jax.Array]:
  """The 10 int32 columns of the bucket sums: (wrong, correct) x (m, m d_0, ..., m d_3)."""
  m = m.astype(jnp.int32)
  right = jnp.where(correct, m, 0)
  wrong = m - right
  out = [wrong, right]
  for d in digits:
    d = d.astype(jnp.int32)
    out += [wrong * d, right * d]
  return out


def _weighted_bucket_sums(m: jax.Array, data: _Evaluation, num_buckets: int):
  """Exact per-bucket sums (hi, lo) [G + 1, 6] (the sweep's binary layout) of the resample
  with multiplicities ``m``: sums of m and of m times the 6-bit digits, wrong and correct.

  The samples are sorted, so each bucket is one run of positions [p_r, p_{r+1}) and its
  sums are differences of prefix sums S(p) at the run starts: S(p) = the sums of the
  whole blocks of ``_SUM_BLOCK`` samples before p (one pass of a variadic reduction:
  every column at once, no scatter) plus the part of p's block before p. Every block or
  partial sum is at most 63 n (the digits are below 64 and multinomial multiplicities add
  up to n; Poisson ones are at most 12: 756 per sample), an exact int32 for n < 2^25, and
  is split into (hi, lo) = (s >> 12, s & 4095) before the prefix sums; two digits d, d'
  give the column 64 d + d'.
  """
  n = m.shape[0]
  size = _SUM_BLOCK
  whole = n // size * size
  columns = [x[:whole].reshape(-1, size) for x in _digit_columns(m, data.correct, data.digits)]
  zero = jnp.zeros((), jnp.int32)
  blocks = jnp.stack(lax.reduce(columns, [zero] * len(columns),
                                lambda a, b: [x + y for x, y in zip(a, b)], (1,)), -1)  # [nb, 10]
  prefix = [jnp.concatenate([jnp.zeros((1, blocks.shape[1]), jnp.int32),
                             lax.associative_scan(jnp.add, x, axis=0)])
            for x in _exact.split(blocks)]  # [nb + 1, 10]
  # The part of each run start's block before it: a window of one block, masked.
  q = data.run_start // size
  at = q[:, None] * size + jnp.arange(size, dtype=jnp.int32)
  before = at < data.run_start[:, None]
  at = jnp.minimum(at, n - 1)
  window = _digit_columns(jnp.where(before, m[at], 0), data.correct[at], data.digits[:, at])
  part = jnp.stack([jnp.sum(x, axis=1) for x in window], -1)  # [R + 1, 10]
  part_hi, part_lo = _exact.split(part)
  s_hi, s_lo = prefix[0][q] + part_hi, prefix[1][q] + part_lo
  run_hi, run_lo = _exact.canonical(s_hi[1:] - s_hi[:-1], s_lo[1:] - s_lo[:-1])  # [R, 10]
  # [R runs] -> [G + 1 buckets] (empty runs add 0) -> [2 (G + 1) segments (2 bucket +
  # correct), 5 columns]
  hi, lo = (jnp.zeros((num_buckets, 10), jnp.int32).at[data.run_bucket].add(x)
            .reshape(num_buckets, 5, 2).transpose(0, 2, 1).reshape(2 * num_buckets, 5)
            for x in (run_hi, run_lo))

  def column(j):  # 64 d_j + d_{j+1}, exactly, as (hi, lo)
    low = (lo[:, j] << _DIGIT_BITS) + lo[:, j + 1]  # < 2^19
    return _exact.canonical((hi[:, j] << _DIGIT_BITS) + hi[:, j + 1] + (low >> 12), low & 4095)

  count, u_hi, u_lo = (hi[:, 0], lo[:, 0]), column(1), column(3)
  # [2 (G + 1) segments, 3 columns] -> [G + 1 buckets, 6]
  return (jnp.stack([count[0], u_hi[0], u_lo[0]], -1).reshape(num_buckets, -1),
          jnp.stack([count[1], u_hi[1], u_lo[1]], -1).reshape(num_buckets, -1))


def _sweep_and_calibration(bucket_sums, retained, bins, thresholds, order, plan):
  """The sweep and the ECE of a resample's exact per-bucket sums (hi, lo) [G + 1, 6]."""
  hi, lo = _sweep.suffix_sums(*bucket_sums)  # [G + 1, 6]
  hi = jnp.concatenate([hi, jnp.zeros_like(hi[:1])])  # suffix from G + 1: nothing
  lo = jnp.concatenate([lo, jnp.zeros_like(lo[:1])])
  out = {}
  rows = jnp.concatenate([jnp.zeros((1,), jnp.int32), retained])  # entry 0: everything
  sums = _stats.sums_from_columns(_exact.to_float(hi[rows], lo[rows]), False)
  out["accuracy"] = sums.correct[0] / sums.count[0]  # exact counts below 2^24
  result = _stats.renormalize(
      _sweep.result_from_sums(sums, thresholds, order, jnp.zeros((), bool)), plan.normalize)
  out.update({f: getattr(result, f) for f in _sweep.METRIC_FIELDS})
  start_hi, start_lo = hi[bins], lo[bins]
  bin_hi, bin_lo = _exact.canonical(start_hi[:-1] - start_hi[1:], start_lo[:-1] - start_lo[1:])
  # Per bin -> per segment (2 bin + correct), the calibration pipeline's binary layout.
  width = len(_stats.BINARY_COLUMNS)
  totals = _stats.calibration_totals(*_stats.calibration_canonical(
      bin_hi.reshape(-1, width), bin_lo.reshape(-1, width), False))
  out["ece"] = _calibration.error_from_totals(totals, plan.ece_norm)
  return out


def _prepare_evaluation(confidences: np.ndarray, correct: np.ndarray,
                        sorted_thresholds: np.ndarray, num_bins: int, scheme: str, *,
                        rows: np.ndarray | None = None,
                        padded: int | None = None) -> tuple[_Evaluation, int]:
  """The one sort (on the host), each sample's bucket of the merged grid of thresholds and
  bin edges, and the buckets where the retained sets and the bins start.

  ``rows``: the samples' row numbers (Poisson multiplicities; default 0, ..., n - 1).
  ``padded``: pad the samples to this length (correct and group_end False) and the
  runs to one per bucket (empty ones at the end), so that data of any n <= padded has
  the same shapes; the padding must get multiplicity 0.
  """
  n = confidences.shape[0]
  bits = confidences.view(np.int32) & np.int32(0x7FFFFFFF)  # orders like the value
  order = np.argsort(-bits, kind="stable")
  c = confidences[order]
  edges = np.asarray(_calibration.width_edges(num_bins))[1:-1]
  grid = np.unique(np.concatenate([sorted_thresholds, edges]).astype(np.float32))
  bucket, digits = _buckets_and_digits(jnp.asarray(c), jnp.asarray(grid))
  bucket = np.asarray(bucket)
  # Bucket b holds the samples with b grid values <= c: c >= g_j is bucket j + 1 and above.
  retained = np.searchsorted(grid, sorted_thresholds) + 1
  bins = np.concatenate([[0], np.searchsorted(grid, edges) + 1, [grid.shape[0] + 1]])
  rank = None
  if scheme == "multinomial" and not np.array_equal(order, np.arange(n)):
    rank = np.empty(n, np.int32)
    rank[order] = np.arange(n, dtype=np.int32)
  sorted_bits = bits[order]
  starts = np.flatnonzero(np.diff(bucket, prepend=-1))  # the runs of one bucket (sorted order)
  run_start, run_bucket = np.append(starts, n), bucket[starts]
  source = (order if rows is None else rows[order]).astype(np.uint32)
  correct, group_end = correct[order], np.append(sorted_bits[1:] != sorted_bits[:-1], True)
  if padded is not None:
    extra = padded - n
    source, correct, group_end = (np.pad(x, (0, extra)) for x in (source, correct, group_end))
    digits = jnp.pad(digits, ((0, 0), (0, extra)))
    empty = grid.shape[0] + 1 - run_bucket.shape[0]
    run_start, run_bucket = np.pad(run_start, (0, empty), mode="edge"), np.pad(run_bucket,
                                                                               (0, empty))
  data = _Evaluation(
      rank=None if rank is None else jnp.asarray(rank),
      source=jnp.asarray(source) if scheme == "poisson" else None,
      run_start=jnp.asarray(run_start.astype(np.int32)),
      run_bucket=jnp.asarray(run_bucket.astype(np.int32)),
      digits=digits, correct=jnp.asarray(correct), group_end=jnp.asarray(group_end),
      retained=jnp.asarray(retained.astype(np.int32)), bins=jnp.asarray(bins.astype(np.int32)))
  return data, grid.shape[0] + 1
