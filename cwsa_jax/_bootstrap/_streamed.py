"""The Poisson evaluation bootstrap fed one confidence range at a time (out-of-core data):
:class:`StreamedEvaluationBootstrap`, whose state per resample is the exact bucket sums and the
area scan's carry."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _exact
from cwsa_jax import _sweep
from cwsa_jax import _validation
from cwsa_jax._bootstrap._area_scan import _AreaCarry
from cwsa_jax._bootstrap._area_scan import _area_carry_zero
from cwsa_jax._bootstrap._area_scan import _area_scan
from cwsa_jax._bootstrap._bucket_sums import _Evaluation
from cwsa_jax._bootstrap._bucket_sums import _Plan
from cwsa_jax._bootstrap._bucket_sums import _prepare_evaluation
from cwsa_jax._bootstrap._bucket_sums import _weighted_bucket_sums
from cwsa_jax._bootstrap._checks import _check_common
from cwsa_jax._bootstrap._checks import _check_level
from cwsa_jax._bootstrap._engine import _MAX_STREAMED_N
from cwsa_jax._bootstrap._engine import EvaluationMetrics
from cwsa_jax._bootstrap._engine import _check_evaluation_data
from cwsa_jax._bootstrap._engine import _check_evaluation_options
from cwsa_jax._bootstrap._engine import _metrics
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import _interval_jit
from cwsa_jax._bootstrap._runner import POISSON_BLOCK_ELEMENTS
from cwsa_jax._bootstrap._runner import run_blocks
from cwsa_jax._bootstrap._sampler import _poisson_block_jit

_MIN_RANGE_LENGTH = 1 << 16  # the smallest padded range length (one compilation per power of 2)


class _RangeState(NamedTuple):
  """Per resample: the exact bucket sums (hi, lo) [B, G + 1, 6] and the area scan's carry."""
  hi: jax.Array
  lo: jax.Array
  carry: _AreaCarry


def _range_update(m, data, state, plan):
  """``state`` after the range ``data`` with multiplicities ``m`` (one resample)."""
  hi, lo = _exact.add((state.hi, state.lo), _weighted_bucket_sums(m, data, plan.num_buckets))
  carry = _area_scan(m, data.correct, data.group_end, state.carry, plan.convention, plan.kernels)
  return _RangeState(hi, lo, carry)


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_update_jit(data, state, start, ms, plan):
  state = jax.tree.map(lambda x: lax.dynamic_slice_in_dim(x, start.astype(jnp.int32),
                                                          ms.shape[0]), state)
  return lax.map(lambda args: _range_update(args[0], data, args[1], plan), (ms, state))


def _range_block(data, length, state, key, start, plan, num_chunks):
  """The states of resamples start, start + 1, ... after the range ``data``."""
  ms = _poisson_block_jit(data.source, length, key, start, num_chunks)
  return _range_update_jit(data, state, start, ms, plan)


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_estimate_jit(data, length, state, plan):
  m = (jnp.arange(data.correct.shape[0]) < length).astype(jnp.int32)
  return _range_update(m, data, state, plan)


@functools.partial(jax.jit, static_argnames=("plan",))
def _range_metrics_jit(state, retained, bins, thresholds, order, plan):
  return jax.vmap(lambda state: _metrics((state.hi, state.lo), state.carry, retained, bins,
                                          thresholds, order, plan))(state)


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
      ValueError: invalid values, or a confidence not below every confidence added before.
    """
    rows = np.asarray(rows)
    if np.shape(confidences) == (0,) and rows.shape == (0,):
      return  # an empty range
    c, k = _check_evaluation_data(confidences, correct, "StreamedEvaluationBootstrap")
    c, k = np.asarray(c, np.float32), np.asarray(k)
    if rows.shape != c.shape or not np.issubdtype(rows.dtype, np.integer):
      raise ValueError("rows must be integer row numbers, one per sample")
    if self._lowest is not None and c.max() >= self._lowest:
      raise ValueError(f"the ranges must come in decreasing confidence: a confidence "
                       f"{float(c.max())} is not below {self._lowest} of an earlier range")
    if self._n + c.shape[0] >= _MAX_STREAMED_N:
      raise ValueError(f"StreamedEvaluationBootstrap takes fewer than {_MAX_STREAMED_N} samples "
                       "in all")
    self._lowest = float(c.min())
    self._n += c.shape[0]
    padded = max(_MIN_RANGE_LENGTH, 1 << (c.shape[0] - 1).bit_length())
    data, num_buckets = _prepare_evaluation(c, k, self._sorted, self._num_bins, "poisson",
                                            rows=rows, padded=padded)
    if self._plan is None:
      self._start(data, num_buckets)
    length = jnp.int32(c.shape[0])
    self._estimate = _range_estimate_jit(data, length, self._estimate, self._plan)
    per_block = max(1, min(self._num_resamples, POISSON_BLOCK_ELEMENTS // padded))
    total = -(-self._num_resamples // per_block) * per_block
    state = jax.tree.map(lambda x: jnp.pad(x, [(0, total - x.shape[0])] + [(0, 0)] * (x.ndim - 1)),
                         self._state)
    self._state = run_blocks(
        lambda start, size, chunks: _range_block(data, length, state, self._key, start,
                                                     self._plan, chunks),
        self._num_resamples, 1, padded, block_elements=POISSON_BLOCK_ELEMENTS)

  def _start(self, data: _Evaluation, num_buckets: int) -> None:
    self._plan = _Plan(num_buckets, self._t.shape[0], self._num_bins, *self._options, "poisson")
    self._grid = (data.retained, data.bins)

    def zero(*shape):
      z = jnp.zeros((*shape, num_buckets, 6), jnp.int32)
      return _RangeState(z, z, _area_carry_zero(shape))

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
