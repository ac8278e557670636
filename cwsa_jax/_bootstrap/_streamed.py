"""The Poisson evaluation bootstrap fed one confidence range at a time (out-of-core data):
:class:`StreamedEvaluationBootstrap`, whose state per resample is the exact bucket sums and the
area scan's carry, both exact to 2^53 samples (``_exact``'s wide sums)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _calibration
from cwsa_jax import _exact
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation
from cwsa_jax._bootstrap._area_scan import RANGE_TOTAL_LIMIT
from cwsa_jax._bootstrap._area_scan import _WideAreaCarry
from cwsa_jax._bootstrap._area_scan import _areas_from_wide_carry
from cwsa_jax._bootstrap._area_scan import _wide_area_carry_zero
from cwsa_jax._bootstrap._area_scan import _wide_area_scan
from cwsa_jax._bootstrap._bucket_sums import _Evaluation
from cwsa_jax._bootstrap._bucket_sums import _Plan
from cwsa_jax._bootstrap._bucket_sums import _prepare_evaluation
from cwsa_jax._bootstrap._bucket_sums import _weighted_bucket_sums
from cwsa_jax._bootstrap._checks import _check_common
from cwsa_jax._bootstrap._checks import _check_level
from cwsa_jax._bootstrap._engine import _MAX_STREAMED_N
from cwsa_jax._bootstrap._engine import MAX_EVALUATION_N
from cwsa_jax._bootstrap._engine import EvaluationMetrics
from cwsa_jax._bootstrap._engine import _check_evaluation_data
from cwsa_jax._bootstrap._engine import _check_evaluation_options
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import _interval_jit
from cwsa_jax._bootstrap._runner import POISSON_BLOCK_ELEMENTS
from cwsa_jax._bootstrap._runner import run_blocks
from cwsa_jax._bootstrap._sampler import _RESAMPLING
from cwsa_jax._bootstrap._sampler import _poisson_block_jit
from cwsa_jax._bootstrap._sampler import _poisson_from_seed
from cwsa_jax._bootstrap._sampler import _seed

_MIN_RANGE_LENGTH = 1 << 16  # the smallest padded range length (one compilation per power of 2)


# The most rows of one range: its bucket sums are exact int32 prefix sums below 2^29 rows
# (``_weighted_bucket_sums``), as for the in-memory Poisson bootstrap.
_MAX_RANGE_N = MAX_EVALUATION_N["poisson"]
_COUNT_COLUMNS = (0, 3)  # of the bucket sums' binary layout: (wrong, correct) x (count, u_hi, u_lo)


class _RangeState(NamedTuple):
  """Per resample: the exact bucket sums (top, hi, lo) [B, G + 1, 6] (``_exact``'s wide
  sums, every top -1 past capacity) and the area scan's wide carry."""
  sums: tuple
  carry: _WideAreaCarry


def _range_total(pair):
  """(int32 sum of the multiplicities, whether it reaches :data:`RANGE_TOTAL_LIMIT`) of one
  range's exact bucket sums ``(hi, lo)`` [G + 1, 6].

  ``floor(T / 4096) = sum hi + floor(sum lo / 4096)``: every term a count below 2^31.
  """
  hi, lo = (x[:, _COUNT_COLUMNS] for x in pair)
  whole = jnp.sum(hi) + (jnp.sum(lo) >> 12)
  return jnp.sum(hi) * 4096 + jnp.sum(lo), whole >= RANGE_TOTAL_LIMIT >> 12


def _range_update(m, data, state, plan):
  """``state`` after the range ``data`` with multiplicities ``m`` (one resample), marked
  past capacity (every top -1) where a column's sums outgrow the wide sums
  (``_exact.seal``) or the range adds :data:`RANGE_TOTAL_LIMIT` or more to K."""
  pair = _weighted_bucket_sums(m, data, plan.num_buckets)
  total, too_large = _range_total(pair)
  top, hi, lo = _exact.seal(_exact.wide_add(state.sums, _exact.widen(*pair)))
  top = jnp.where(too_large, _exact.OVER_CAPACITY, top)
  carry = _wide_area_scan(m, data.correct, data.group_end, state.carry, total, plan.convention,
                          plan.kernels)
  return _RangeState((top, hi, lo), carry)


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_update_jit(data, state, start, ms, plan):
  state = jax.tree.map(lambda x: lax.dynamic_slice_in_dim(x, start.astype(jnp.int32),
                                                          ms.shape[0]), state)
  return lax.map(lambda args: _range_update(args[0], data, args[1], plan), (ms, state))


@functools.partial(jax.jit, static_argnames=("num_chunks",), **_RESAMPLING)
def _poisson_block_wide_jit(source, source_high, length, key, start, num_chunks):
  """:func:`~cwsa_jax._bootstrap._sampler._poisson_block_jit` of row numbers past 2^32:
  row r = 2^32 h + l draws from the Threefry counter (h, l), where rows below 2^32 draw
  from (0, r): the same multiplicities for those (``source`` the low words, ``source_high``
  the high ones)."""
  real = jnp.arange(source.shape[0]) < length

  def one(b):
    m = _poisson_from_seed(_seed(key, b), source, source_high)
    return jnp.where(real, m, 0).astype(jnp.int8)

  return jax.vmap(one)(start + jnp.arange(num_chunks, dtype=jnp.uint32))


def _range_block(data, source_high, length, state, key, start, plan, num_chunks):
  """The states of resamples start, start + 1, ... after the range ``data``."""
  if source_high is None:
    ms = _poisson_block_jit(data.source, length, key, start, num_chunks)
  else:
    ms = _poisson_block_wide_jit(data.source, source_high, length, key, start, num_chunks)
  return _range_update_jit(data, state, start, ms, plan)


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_estimate_jit(data, length, state, plan):
  m = (jnp.arange(data.correct.shape[0]) < length).astype(jnp.int32)
  return _range_update(m, data, state, plan)


def _wide_sweep_and_calibration(sums, retained, bins, thresholds, order, plan):
  """``_bucket_sums._sweep_and_calibration`` of wide bucket sums (top, hi, lo) [G + 1, 6]:
  the same integers give the same floats (each total rounded once)."""
  top, hi, lo = (jnp.concatenate([x, jnp.zeros_like(x[:1])])  # suffix from G + 1: nothing
                 for x in _exact.wide_suffix_sums(sums))
  out = {}
  rows = jnp.concatenate([jnp.zeros((1,), jnp.int32), retained])  # entry 0: everything
  sums = _stats.sums_from_columns(_exact.wide_to_float((top[rows], hi[rows], lo[rows])), False)
  out["accuracy"] = sums.correct[0] / sums.count[0]
  result = _stats.renormalize(
      _sweep.result_from_sums(sums, thresholds, order, jnp.zeros((), bool)), plan.normalize)
  out.update({f: getattr(result, f) for f in _sweep.METRIC_FIELDS})
  start = (top[bins], hi[bins], lo[bins])
  per_bin = _exact.wide_sub(tuple(x[:-1] for x in start), tuple(x[1:] for x in start))
  # (wrong, correct) x (count, u_hi, u_lo) -> the canonical calibration columns (count,
  # kappa digits at 2^-12, 2^-24, 2^-36, u_hi, u_lo): kappa's first digit is 4096 N_correct.
  col = lambda j: tuple(x[:, j] for x in per_bin)  # noqa: E731
  both = lambda j: _exact.wide_add(col(j), col(j + 3))  # noqa: E731
  right = _exact.wide_times_4096(col(3))
  zero = tuple(jnp.zeros_like(x) for x in right)
  columns = [both(0), right, zero, zero, both(1), both(2)]
  top, hi, lo = (jnp.stack([c[i] for c in columns], axis=-1) for i in range(3))
  out["ece"] = _calibration.error_from_totals(_stats.calibration_totals(hi, lo, top),
                                              plan.ece_norm)
  return out


def _wide_metrics(state: _RangeState, retained, bins, thresholds, order, plan):
  """Every metric of a resample's state (``_engine._metrics`` of wide sums and carry); NaN
  past capacity."""
  out = _wide_sweep_and_calibration(state.sums, retained, bins, thresholds, order, plan)
  out.update(_areas_from_wide_carry(state.carry, plan.convention))
  over = _exact.over_capacity(state.sums[0])
  return {name: jnp.where(over, jnp.nan, x) for name, x in out.items()}


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_metrics_jit(state, retained, bins, thresholds, order, plan):
  return jax.vmap(lambda state: _wide_metrics(state, retained, bins, thresholds, order,
                                              plan))(state)


_CAPACITY = (f"at most 2^53 = {float(_MAX_STREAMED_N):.1e} samples in all, ranges of fewer "
             f"than 2^29 = {_MAX_RANGE_N} rows")


class StreamedEvaluationBootstrap:
  """The Poisson bootstrap of :func:`bootstrap_evaluation`, fed one confidence range at a time.

  For data that do not fit in memory: the samples are given in ranges of
  confidence, from the highest range to the lowest (every confidence of a range
  below every one of the previous range, so that no tie group is split), each
  with its samples' row numbers in the whole data. Resample b gives row r the
  same Poisson(1) multiplicity as :func:`bootstrap_evaluation` with
  ``resampling="poisson"`` (which numbers the rows 0, ..., n - 1), so when the
  ranges cover the data the intervals are the same (to float32 rounding of the
  area sums). Each range adds its exact bucket sums to every resample's and
  continues every resample's area scan from where the previous range left it:
  the state is O(B (T + bins)), and a range's samples are held only while it is
  added.

  Capacity: exact to 2^53 (9.0e15) samples in all, in ranges of fewer than
  2^29 rows each. Every resample's bucket sums are ``_exact``'s wide sums
  (top, hi, lo), as the mergeable states', and its area scan carries the count
  K and errors E of the resample as wide sums too (its areas are float32 sums,
  as in memory). Its E-AURC is AURC less the oracle's closed form: a resample's
  correct count, which the exact differences need at every point, is known only
  after the last range, so for a nearly optimal ranking E-AURC keeps only the
  absolute precision of AURC (the in-memory bootstrap's is exact to float32). Row numbers are any integers in [0, 2^64); rows below 2^32
  draw from the Threefry counter (0, r), rows past it from (r >> 32, r mod 2^32).
  Past the capacity :meth:`add_range` raises ``ValueError`` and leaves the
  state as it was: too many samples in all or in one range (checked first),
  or a resample whose sums outgrow the wide sums or whose size grows by 2^30
  or more in one range (checked after the range, on the host; with Poisson(1)
  multiplicities neither happens within the sample limits but with
  probability below e^-(10^7)).
  .. code-block:: python

    boot = StreamedEvaluationBootstrap(thresholds, key=jax.random.key(0))
    for confidences, correct, rows in ranges:   # decreasing confidence
      boot.add_range(confidences, correct, rows)
    result = boot.result(level=0.95)           # BootstrapResult of EvaluationMetrics
  """

  def __init__(self, thresholds, *, key, num_resamples: int = 1000, num_bins: int = 15,
               ece_norm: str = "l1", aurc_convention: str = "step",
               normalize: str = "retained"):
    num_bins = _check_evaluation_options(num_bins, ece_norm, aurc_convention, normalize,
                                         "poisson")
    self._t = _validation.as_thresholds(thresholds)
    self._key, self._num_resamples, _ = _check_common(key, num_resamples, 1, 1)
    self._order, sorted_t = _sweep.sorted_thresholds(self._t)
    self._sorted = np.asarray(sorted_t)
    self._num_bins = num_bins
    self._options = (ece_norm, aurc_convention, normalize)
    self._n = 0
    self._lowest = None  # the smallest confidence so far
    self._plan = self._grid = None
    self._state = self._estimate = None

  @property
  def num_samples(self) -> int:
    """The samples added so far."""
    return self._n

  def add_range(self, confidences, correct, rows) -> None:
    """Adds the samples of one confidence range: ``confidences`` [m] in [0, 1], boolean
    ``correct`` [m] and their row numbers ``rows`` [m] in the whole data.

    Raises:
      ValueError: invalid values, a confidence not below every confidence added before, or
        past the capacity (nothing is added then).
    """
    rows = np.asarray(rows)
    if np.shape(confidences) == (0,) and rows.shape == (0,):
      return  # an empty range
    c, k = _check_evaluation_data(confidences, correct, "StreamedEvaluationBootstrap")
    c, k = np.asarray(c, np.float32), np.asarray(k)
    if rows.shape != c.shape or not np.issubdtype(rows.dtype, np.integer):
      raise ValueError("rows must be integer row numbers, one per sample")
    if rows.min() < 0:
      raise ValueError(f"rows must be row numbers in [0, 2^64), got {int(rows.min())}")
    if self._lowest is not None and c.max() >= self._lowest:
      raise ValueError(f"the ranges must come in decreasing confidence: a confidence "
                       f"{float(c.max())} is not below {self._lowest} of an earlier range")
    if c.shape[0] >= _MAX_RANGE_N or self._n + c.shape[0] > _MAX_STREAMED_N:
      raise ValueError(f"StreamedEvaluationBootstrap takes {_CAPACITY}: got a range of "
                       f"{c.shape[0]} rows after {self._n}")
    padded = max(_MIN_RANGE_LENGTH, 1 << (c.shape[0] - 1).bit_length())
    source_high = None
    if rows.max() >= 1 << 32:  # the rows' high words, in the sorted order of the range
      rows = rows.astype(np.uint64)
      data, num_buckets = _prepare_evaluation(c, k, self._sorted, self._num_bins, "poisson",
                                              rows=np.arange(c.shape[0]), padded=padded)
      ordered = np.pad(rows[np.asarray(data.source)[:c.shape[0]]], (0, padded - c.shape[0]))
      data = data._replace(source=jnp.asarray((ordered & 0xFFFFFFFF).astype(np.uint32)))
      source_high = jnp.asarray((ordered >> np.uint64(32)).astype(np.uint32))
    else:
      data, num_buckets = _prepare_evaluation(c, k, self._sorted, self._num_bins, "poisson",
                                              rows=rows, padded=padded)
    if self._plan is None:
      self._start(data, num_buckets)
    length = jnp.int32(c.shape[0])
    estimate = _range_estimate_jit(data, length, self._estimate, self._plan)
    per_block = max(1, min(self._num_resamples, POISSON_BLOCK_ELEMENTS // padded))
    total = -(-self._num_resamples // per_block) * per_block
    state = jax.tree.map(lambda x: jnp.pad(x, [(0, total - x.shape[0])] + [(0, 0)] * (x.ndim - 1)),
                         self._state)
    state = run_blocks(
        lambda start, size, chunks: _range_block(data, source_high, length, state, self._key,
                                                 start, self._plan, chunks),
        self._num_resamples, 1, padded, block_elements=POISSON_BLOCK_ELEMENTS)
    # On the host, between ranges: a state past capacity is refused, never kept.
    if bool(jnp.any(_exact.over_capacity(estimate.sums[0])) | jnp.any(
        _exact.over_capacity(state.sums[0]))):
      raise ValueError(f"StreamedEvaluationBootstrap: a resample went past its capacity with "
                       f"this range (nothing was added); it takes {_CAPACITY}, and a range may "
                       f"add fewer than 2^30 to a resample's size")
    self._estimate, self._state = estimate, state
    self._lowest = float(c.min())
    self._n += c.shape[0]

  def _start(self, data: _Evaluation, num_buckets: int) -> None:
    self._plan = _Plan(num_buckets, self._t.shape[0], self._num_bins, *self._options, "poisson")
    self._grid = (data.retained, data.bins)

    def zero(*shape):
      sums = tuple(jnp.zeros((*shape, num_buckets, 6), jnp.int32) for _ in range(3))
      return _RangeState(sums, _wide_area_carry_zero(shape))

    self._estimate, self._state = zero(), zero(self._num_resamples)

  def result(self, level: float = 0.95) -> BootstrapResult:
    """The estimate and the percentile interval of every metric at ``level``, as
    :func:`bootstrap_evaluation` (fields :class:`EvaluationMetrics`)."""
    level = _check_level(level)
    if self._n == 0:
      raise ValueError("no samples were added")
    args = (*self._grid, self._t, self._order, self._plan)
    estimate = jax.tree.map(lambda x: x[0], _range_metrics_jit(
        jax.tree.map(lambda x: x[None], self._estimate), *args))
    low, high = _interval_jit(_range_metrics_jit(self._state, *args), jnp.float32(level))
    return BootstrapResult(EvaluationMetrics(**estimate), EvaluationMetrics(**low),
                           EvaluationMetrics(**high))
