"""The fused threshold sweep: every hard metric at every threshold in one call.

A kernel that compares every sample with every threshold materialises an
n x T mask: O(nT) time and memory. Here each sample is instead *bucketed*
into its threshold interval, the per-bucket sufficient statistics are summed
exactly (``_exact``), and a reverse cumulative sum over the T + 1 buckets gives
the retained-set statistics of every threshold at once. The cost is O(n),
nearly flat in T.

Bucketing uses a table over [0, 1] split into 4T or more equal cells: for
each cell, the index of its first threshold, the number of thresholds inside
it and the smallest of them. When no cell holds two thresholds (any grid
coarser than the table), a sample's bucket is one lookup and one comparison,
``first[cell(c)] + [c >= smallest[cell(c)]]``; otherwise a short binary search
over the thresholds of the sample's cell finishes the job. ``c >= tau`` is
evaluated exactly, so ties at a threshold are retained, as the paper defines.

:func:`bucket_sums` is the one bucket-and-sum pipeline of the sweep family:
:func:`sweep`, ``sweep_by_group`` (segments ``group * (T + 1) + bucket``),
the single-threshold metrics (T = 1), ``bootstrap_sweep``'s estimate and
``SweepState``. Leading batch axes, and ``jax.vmap`` over it (a custom
batching rule), become more segments of the same single pass, not a batched
loop. On CUDA GPUs, binary samples with at most ``_dense.MAX_BUCKETS``
buckets (and no groups, mask or given buckets) are summed by ``_dense``'s
kernels instead of scatter-adds, and one row of them with more
buckets by ``_sorted_sums`` (one sort): the same integers, bit for bit.
The internal entry points take a ``_dispatch.Kernels`` (``kernels=``, a
static argument) that picks these forms; the public functions run the default.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from cwsa_jax._kernels import _dense
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax._kernels import _sort
from cwsa_jax._kernels import _sorted_sums
from cwsa_jax import _stats
from cwsa_jax import _threshold_order
from cwsa_jax import _validation


class SweepResult(NamedTuple):
  """Hard metrics at every threshold; every field has shape [..., T]."""
  thresholds: jax.Array
  coverage: jax.Array
  selective_accuracy: jax.Array
  cwsa: jax.Array
  cwsa_plus: jax.Array


# The metric fields of a SweepResult (everything but the thresholds).
METRIC_FIELDS = SweepResult._fields[1:]

# The metric fields that score a threshold (all but coverage): what ``select_threshold``
# maximises and ``aumcc`` integrates, in the order their error messages list them.
SCORE_FIELDS = ("cwsa", "cwsa_plus", "selective_accuracy")


def default_thresholds() -> np.ndarray:
  """The default grid 0.50, 0.51, ..., 0.99 (50 thresholds, float32)."""
  return (np.arange(50, dtype=np.float64) / 100.0 + 0.5).astype(np.float32)


def published_thresholds() -> np.ndarray:
  """``np.linspace(0.5, 0.99, 20)`` in float32: the grid of the paper's published code."""
  return np.linspace(0.5, 0.99, 20).astype(np.float32)


# ------------------------------------------------------------------ bucketing


def num_cells(num_thresholds: int) -> int:
  """Static size of the bucket table: a power of two >= 4T (at least 1024, at most 2^20)."""
  return min(1 << 20, max(1024, 1 << (4 * num_thresholds - 1).bit_length()))


def _cell(x: jax.Array, cells: int) -> jax.Array:
  # floor(x * cells) is monotone non-decreasing in x (cells is a power of two,
  # so the product is exact): cell(t) < cell(c) implies t < c, and
  # cell(t) > cell(c) implies t > c. Only equal cells need a comparison.
  return jnp.clip(jnp.floor(x * cells), 0, cells - 1).astype(jnp.int32)


def bucket_table(sorted_thresholds: jax.Array, cells: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per cell: index of its first threshold, number of thresholds in it; and the max count."""
  cell = _cell(sorted_thresholds, cells)
  counts = jnp.zeros((cells,), jnp.int32).at[cell].add(1)
  # A sequential scan on CPU (_sort.cumsum): as fast as a parallel one at every
  # table size, and it compiles in a fraction of the time (the parallel scan
  # was about a third of a sweep's compilation). Elsewhere lax.cumsum: the lookups
  # read the table inside a lax.cond (see _Buckets.switch), so XLA cannot fuse the
  # cumulative sum into them and redo it for every sample.
  first = _sort.cumsum(counts) - counts
  return first, counts, jnp.max(counts)


def cell_minima(sorted_thresholds: jax.Array, first: jax.Array, counts: jax.Array) -> jax.Array:
  """Per cell: its smallest threshold (+inf for a cell without one)."""
  last = sorted_thresholds.shape[0] - 1
  return jnp.where(counts > 0, sorted_thresholds[jnp.minimum(first, last)], jnp.inf)


def bucketize(confidences: jax.Array, sorted_thresholds: jax.Array, first: jax.Array,
              counts: jax.Array, max_per_cell: jax.Array,
              minima: jax.Array | None = None) -> jax.Array:
  """Number of sorted thresholds <= each confidence: its bucket in [0, T].

  ``k = first[cell(c)] + #{thresholds t in cell(c) : t <= c}``: one comparison
  with the cell's smallest threshold when no cell holds more than one,
  otherwise binary lifting with ceil(log2(max_per_cell + 1)) steps.
  """
  if minima is None:
    minima = cell_minima(sorted_thresholds, first, counts)
  table = (first, counts, max_per_cell, minima)
  return jax.lax.cond(max_per_cell <= 1,
                      lambda c: _bucketize(c, sorted_thresholds, table, one_per_cell=True),
                      lambda c: _bucketize(c, sorted_thresholds, table, one_per_cell=False),
                      confidences)


def _bucketize(confidences, sorted_thresholds, table, *, one_per_cell: bool):
  """:func:`bucketize` for a table known to hold at most one threshold per cell, or any table."""
  num_thresholds = sorted_thresholds.shape[0]
  if num_thresholds == 1:
    return (confidences >= sorted_thresholds[0]).astype(jnp.int32)
  first, counts, max_per_cell, minima = table
  cell = _cell(confidences, first.shape[0])
  if one_per_cell:
    return first[cell] + (confidences >= minima[cell]).astype(jnp.int32)
  if num_thresholds < (1 << 15):
    # One gather instead of two: first and count packed in 15 + 16 bits.
    entry = ((first << 16) | counts)[cell]
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


@jax.jit
def sorted_thresholds(thresholds: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(argsort order, sorted thresholds) of a [T] threshold vector.

  A NaN threshold (possible only inside a user's ``jit``, where its results are
  NaN) is sorted last and bucketed as +inf, so the cell table of the others
  never depends on how NaN converts to an integer. An ascending grid (the
  usual case) skips the sort.

  Jitted: the bootstraps call it on concrete thresholds, where an
  eager ``lax.cond`` of these local branches traced and compiled again on every
  call.
  """
  def argsort(t):
    return jnp.argsort(t).astype(jnp.int32)

  def identity(t):
    return jnp.arange(t.shape[0], dtype=jnp.int32)

  ascending = jnp.all(thresholds[1:] >= thresholds[:-1])  # False with a NaN
  order = jax.lax.cond(ascending, identity, argsort, thresholds)
  sorted_values = thresholds[order]
  return order, jnp.where(jnp.isnan(sorted_values), jnp.inf, sorted_values)


class _Buckets:
  """The bucketing of one threshold grid: its table, built once per call."""

  def __init__(self, sorted_thresh: jax.Array):
    self.sorted = sorted_thresh
    self.num_buckets = sorted_thresh.shape[0] + 1
    if self.num_buckets > 2:
      first, counts, max_per_cell = bucket_table(sorted_thresh, num_cells(self.num_buckets - 1))
      self.table = (first, counts, max_per_cell, cell_minima(sorted_thresh, first, counts))
      self.one_per_cell = max_per_cell <= 1
    else:
      self.table = (None,) * 4
      self.one_per_cell = None

  def __call__(self, confidences: jax.Array, *, one_per_cell: bool = False) -> jax.Array:
    """Buckets of ``confidences``; ``one_per_cell`` (static) assumes ``self.one_per_cell``."""
    return _bucketize(jnp.clip(confidences, 0.0, 1.0), self.sorted, self.table,
                      one_per_cell=one_per_cell)

  def switch(self, fn, *args):
    """``fn(*args, one_per_cell=...)``, the fast variant where the table allows it.

    One ``lax.cond`` around all of ``fn`` (e.g. a whole segment sum), so that
    the fast branch fuses the lookups into their consumers.
    """
    if self.one_per_cell is None:
      return fn(*args, one_per_cell=False)
    return jax.lax.cond(self.one_per_cell, functools.partial(fn, one_per_cell=True),
                        functools.partial(fn, one_per_cell=False), *args)


# ------------------------------------------------------------------ the pipeline


def _by_rows(rows: int, n: int, chunk_size: int) -> bool:
  """The layout of several rows of n samples (leading axes, vmap): chunks of whole rows
  when a row fits in a chunk of ``chunk_size`` (each chunk summed into a table of its own
  rows), else the flattened samples, each sample's row found by a division."""
  return rows > 1 and n <= chunk_size


def _chunk_rows(size: int, rows: int, n: int, offset: jax.Array | None,
                chunk_size: int) -> jax.Array | None:
  """The row of each of a chunk's ``size`` entries (None for one row): relative to the
  chunk's first row for chunks of rows ([size, 1]), else from the flattened position of
  the chunk's first sample ``offset`` ([size])."""
  if _by_rows(rows, n, chunk_size):
    return jnp.arange(size, dtype=jnp.int32)[:, None]
  if rows > 1:
    return (offset + jnp.arange(size, dtype=jnp.int32)) // n
  return None


def _row_segment_sums(columns_fn, arrays, num_segments: int, rows: int, n: int,
                      kernels: _dispatch.Kernels):
  """:func:`_exact.segment_sums` of ``arrays`` laid out as [rows, n] or flattened (see
  :func:`_by_rows`); ``columns_fn`` gets the chunk's first flattened position last when
  flattened rows need it (:func:`_chunk_rows`). Its columns are counted (the count first,
  ``_stats.segment_columns``)."""
  chunk_size = kernels.chunk_size
  if _by_rows(rows, n, chunk_size):
    return _exact.segment_sums(columns_fn, [a.reshape(rows, n) for a in arrays], num_segments,
                               chunk_size=chunk_size // n,
                               segments_per_entry=num_segments // rows, counted=True,
                               kernels=kernels)
  return _exact.segment_sums(columns_fn, [a.reshape(-1) for a in arrays], num_segments,
                             chunk_size=chunk_size, with_offset=rows > 1, counted=True,
                             kernels=kernels)


def _bucket_sums_impl(confidences, correct, sorted_thresh, *extra, num_groups, masked, given,
                      drop_invalid=False, dense=True,
                      kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  """Exact per-bucket sums of samples [..., n]: one pass, leading axes as more segments.

  On CUDA GPUs (as ``kernels`` picks), binary samples with few buckets (and no
  groups, mask or given buckets) take ``_dense``'s kernel, and one row of them
  with more buckets ``_sorted_sums`` (one sort; the same integers, no
  scatter), unless ``dense`` is False: the scatter path.
  """
  extra = list(extra)
  known = extra.pop() if given else None
  groups = extra[0] if num_groups else None
  mask = extra[-1] if masked else None
  lead, n = confidences.shape[:-1], confidences.shape[-1]
  rows = math.prod(lead)
  if dense and not (num_groups or masked or given):
    scatter = functools.partial(_bucket_sums_impl, num_groups=None, masked=False, given=False,
                                drop_invalid=drop_invalid, dense=False, kernels=kernels)
    num_buckets = sorted_thresh.shape[0] + 1
    if _dense.applies(confidences, correct, num_buckets, kernels=kernels):
      return kernels.pick("dense", confidences, correct, sorted_thresh,
                          cuda=functools.partial(_dense.bucket_sums, unit=True, kernels=kernels),
                          default=scatter)
    if _sorted_sums.applies(confidences, correct, num_buckets, kernels=kernels):
      return kernels.pick("sorted_sums", confidences, correct, sorted_thresh,
                          cuda=_sorted_sums.bucket_sums, default=scatter)
  buckets = _Buckets(sorted_thresh)
  if given:
    buckets.one_per_cell = None  # nothing to look up
  num_buckets = buckets.num_buckets
  per_row = (num_groups or 1) * num_buckets
  num_segments = _stats.segments_per_bucket(correct.dtype != jnp.bool_) * rows * per_row
  flattened = rows > 1 and not _by_rows(rows, n, kernels.chunk_size)

  def columns(c, kappa, *rest, one_per_cell):
    rest = list(rest)
    offset = rest.pop() if flattened else None
    segment = rest.pop() if given else buckets(c, one_per_cell=one_per_cell)
    # Left out: confidences NaN or outside [0, 1] (drop_invalid: the count tells),
    # out-of-range groups (inside a user's jit) and masked samples.
    drop = [_validation.bad_unit(c)] if drop_invalid else []
    if groups is not None:
      g = rest.pop(0)
      segment = g * num_buckets + segment
      drop.append((g < 0) | (g >= num_groups))
    if mask is not None:
      drop.append(~rest.pop(0))
    row = _chunk_rows(c.shape[0], rows, n, offset, kernels.chunk_size)
    if row is not None:
      segment = segment + row * per_row
    ids, cols = _stats.segment_columns(c, kappa, segment)
    if drop:
      ids = jnp.where(functools.reduce(jnp.logical_or, drop), num_segments, ids)
    return ids, cols

  def sums(*arrays, one_per_cell):
    fn = functools.partial(columns, one_per_cell=one_per_cell)
    return _row_segment_sums(fn, arrays, num_segments, rows, n, kernels)

  arrays = (confidences, correct, *extra) + ((known,) if given else ())
  hi, lo = buckets.switch(sums, *arrays)
  # [rows * G * buckets * per_bucket, K] -> [..., (G,) buckets, per_bucket * K]
  shape = lead + ((num_groups,) if num_groups else ()) + (num_buckets, -1)
  return hi.reshape(shape), lo.reshape(shape)


@functools.lru_cache(maxsize=None)
def _bucket_sums_kernel(num_groups: int | None, masked: bool, given: bool, drop_invalid: bool,
                        kernels: _dispatch.Kernels):
  """:func:`_bucket_sums_impl` whose ``vmap`` flattens the batch into more segments."""
  impl = functools.partial(_bucket_sums_impl, num_groups=num_groups, masked=masked, given=given,
                           drop_invalid=drop_invalid, kernels=kernels)
  kernel = custom_vmap(impl)

  @kernel.def_vmap
  def _rule(axis_size, in_batched, confidences, correct, sorted_thresh, *extra):
    if in_batched[2]:  # a grid per batch member: no shared table, batch the plain kernel
      in_axes = tuple(0 if b else None for b in in_batched)
      return jax.vmap(impl, in_axes=in_axes)(confidences, correct, sorted_thresh, *extra), (True, True)
    samples = [x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
               for x, b in zip((confidences, correct, *extra), in_batched[:2] + in_batched[3:])]
    return kernel(samples[0], samples[1], sorted_thresh, *samples[2:]), (True, True)

  return kernel


def bucket_sums(confidences: jax.Array, correct: jax.Array, sorted_thresh: jax.Array,
                mask: jax.Array | None = None, *, groups: jax.Array | None = None,
                num_groups: int | None = None,
                buckets: jax.Array | None = None,
                drop_invalid: bool = False,
                kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> tuple[jax.Array, jax.Array]:
  """Exact per-bucket statistics ``(hi, lo)``, int32 [..., (G,) T + 1, W], of samples [..., n].

  Bucket ``b`` holds the samples with exactly ``b`` sorted thresholds <= c;
  W is ``_stats.bucket_width(graded)``. With ``groups`` ([..., n] ids in
  [0, num_groups); others are left out) the buckets are per group. Samples
  with ``mask`` False are left out, and with ``drop_invalid`` those whose
  confidence is NaN or outside [0, 1] (for traced samples: :func:`kept_count`
  of the sums counts the rest, a validity flag that costs no pass of its
  own). ``_dense`` and ``_sorted_sums`` (CUDA) always leave them out; the
  scatter path only when asked, its compare costing a few percent of a
  10^5-sample sweep on the CPU. The sums are exact integers in canonical
  form, so adding two of them (and normalising) gives bit-for-bit the sums of
  the concatenated samples. Leading axes [...] (and ``jax.vmap``) are summed
  in the same single pass, as separate segments. ``buckets`` ([..., n],
  :func:`bucket_ids` computed earlier, e.g. once before many resamples)
  skips the bucketing. ``kernels`` picks the forms (and the chunk size).
  """
  extra = ([] if groups is None else [groups]) + ([] if mask is None else [mask])
  extra += [] if buckets is None else [buckets]
  kernel = _bucket_sums_kernel(None if groups is None else num_groups, mask is not None,
                               buckets is not None, drop_invalid, kernels)
  return kernel(confidences, correct, sorted_thresh, *extra)


# pack_samples: segment ids (2 bucket + correct) in the top 7 bits, 1 - c in 2^-24 units in 25.
PACKED_MAX_BUCKETS = 64
_UNIT_BITS = 25


def pack_samples(confidences: jax.Array, correct: jax.Array, buckets: jax.Array) -> jax.Array:
  """Binary samples as one int32 word each, for sums that gather them many times (a bootstrap).

  The word holds the sample's segment ``2 bucket + correct`` (``buckets`` from
  :func:`bucket_ids`, at most :data:`PACKED_MAX_BUCKETS` of them) in its top 7
  bits and ``u = (1 - c) 2^24``, an integer in [0, 2^24] for float32 ``c``, in
  the low 25: what :func:`packed_bucket_sums` sums, the ids and columns of
  ``_stats.segment_columns`` without a float operation per gathered sample.
  """
  c = jnp.clip(confidences.astype(jnp.float32), 0.0, 1.0)
  units = ((1.0 - c) * 16777216.0).astype(jnp.int32)
  return ((2 * buckets + correct.astype(jnp.int32)) << _UNIT_BITS) | units


def _packed_sums_impl(words: jax.Array, *, num_buckets: int,
                      kernels: _dispatch.Kernels) -> tuple[jax.Array, jax.Array]:
  lead, n = words.shape[:-1], words.shape[-1]
  rows, per_row = math.prod(lead), 2 * num_buckets

  def columns(w, *offset):
    ids = jax.lax.shift_right_logical(w, _UNIT_BITS)
    units = w & ((1 << _UNIT_BITS) - 1)
    row = _chunk_rows(w.shape[0], rows, n, offset[0] if offset else None, kernels.chunk_size)
    if row is not None:
      ids = ids + row * per_row
    return ids, jnp.stack([jnp.ones_like(units)] + _exact.unit_columns(units), axis=0)

  hi, lo = _row_segment_sums(columns, (words,), rows * per_row, rows, n, kernels)
  shape = lead + (num_buckets, -1)
  return hi.reshape(shape), lo.reshape(shape)


@functools.lru_cache(maxsize=None)
def _packed_kernel(num_buckets: int, kernels: _dispatch.Kernels):
  """:func:`_packed_sums_impl` whose ``vmap`` flattens the batch into more segments."""
  kernel = custom_vmap(functools.partial(_packed_sums_impl, num_buckets=num_buckets,
                                         kernels=kernels))

  @kernel.def_vmap
  def _rule(axis_size, in_batched, words):
    del axis_size, in_batched  # words are batched
    return kernel(words), (True, True)

  return kernel


def packed_bucket_sums(words: jax.Array, num_buckets: int, *,
                       kernels: _dispatch.Kernels = _dispatch.DEFAULT
                       ) -> tuple[jax.Array, jax.Array]:
  """:func:`bucket_sums` of binary samples [..., n] packed by :func:`pack_samples`.

  The same exact ``(hi, lo)`` [..., T + 1, 6], bit for bit, as
  ``bucket_sums(c, correct, sorted_thresh, buckets=buckets)``.
  """
  if num_buckets > PACKED_MAX_BUCKETS:
    raise ValueError(f"packed samples hold at most {PACKED_MAX_BUCKETS} buckets, got {num_buckets}")
  return _packed_kernel(num_buckets, kernels)(words)


def bucket_ids(confidences: jax.Array, sorted_thresh: jax.Array) -> jax.Array:
  """Each sample's bucket in [0, T] (the segments of the sums' derivatives)."""
  buckets = _Buckets(sorted_thresh)
  return buckets.switch(buckets, confidences)


def suffix_sums(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact reverse cumulative sums along the bucket axis (-2) of per-bucket sums."""
  hi, lo = _exact.suffix_sums(jnp.moveaxis(hi, -2, 0), jnp.moveaxis(lo, -2, 0))
  return jnp.moveaxis(hi, 0, -2), jnp.moveaxis(lo, 0, -2)


def sums_from_bucket_sums(hi: jax.Array, lo: jax.Array, top: jax.Array | None = None) -> _stats.Sums:
  """Retained-set :class:`~cwsa_jax._stats.Sums` [..., T + 1] of exact per-bucket sums [..., T + 1, W].

  Entry ``b`` sums the buckets ``b, ..., T``: entry 0 is every sample, entry
  ``j + 1`` the retained set of sorted threshold ``j``. With ``top`` the sums
  are a state's wide ``(top, hi, lo)`` (``_exact.widen``); each total is
  rounded once either way, so both give the same floats for the same integers.
  """
  graded = hi.shape[-1] != _stats.bucket_width(False)
  if top is None:
    hi, lo = suffix_sums(hi, lo)
    return _stats.sums_from_columns(_exact.to_float(hi, lo), graded)
  wide = _exact.wide_suffix_sums(tuple(jnp.moveaxis(x, -2, 0) for x in (top, hi, lo)))
  return _stats.sums_from_columns(jnp.moveaxis(_exact.wide_to_float(wide), 0, -2), graded)


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
                            order: jax.Array, invalid: jax.Array,
                            top: jax.Array | None = None) -> SweepResult:
  """The :class:`SweepResult` of per-bucket sums (sorted order) at ``thresholds`` (user order)."""
  return result_from_sums(sums_from_bucket_sums(hi, lo, top), thresholds, order, invalid)


def kept_count(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """int32 [...]: the samples in per-bucket sums [..., T + 1, W] (exact: their count columns,
  the first of each segment's)."""
  graded = hi.shape[-1] != _stats.bucket_width(False)
  step = hi.shape[-1] // _stats.segments_per_bucket(graded)
  total = lambda x: jnp.sum(x[..., ::step], axis=(-2, -1))  # noqa: E731
  return _exact.to_int(total(hi), total(lo))


def _sums_of(confidences, correct, sorted_thresh, hi, lo):
  del confidences, correct, sorted_thresh
  return sums_from_bucket_sums(hi, lo)


def _segments(confidences, correct, sorted_thresh, *bucket_sums):
  del correct, bucket_sums
  return bucket_ids(confidences, sorted_thresh), (sorted_thresh.shape[0] + 1,), 0


@functools.partial(jax.jit, static_argnames=("normalize", "drop_invalid", "kernels"))
def _sweep_1d(confidences, correct, thresholds, normalize="retained", drop_invalid=False,
              kernels=_dispatch.DEFAULT):
  order, sorted_thresh = sorted_thresholds(thresholds)
  # Exact integer sums (no derivative), and from them the retained-set sums, whose
  # derivative in c (and kappa) is the float sum over each retained set.
  hi, lo = bucket_sums(*jax.lax.stop_gradient((confidences, correct, sorted_thresh)),
                       drop_invalid=drop_invalid, kernels=kernels)
  sums = _stats.exact_sums(_sums_of, _segments, confidences, correct, sorted_thresh, hi, lo)
  # drop_invalid (traced samples; concrete ones were checked): the kernel leaves out
  # confidences NaN or outside [0, 1], and a row that lost any is invalid, flagged
  # without a pass of its own.
  left_out = (kept_count(hi, lo) != confidences.shape[-1]) if drop_invalid else jnp.zeros((), bool)
  return _stats.renormalize(result_from_sums(sums, thresholds, order, left_out), normalize)


@_threshold_order.at("thresholds")
@_public.entry
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
  Concrete float64 confidences are compared with the thresholds in float64
  (``_threshold_order``: float32 stand-ins at most one ulp away); the
  ``thresholds`` field is float32.

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
  return _sweep(confidences, correct, thresholds, normalize=normalize)


def _sweep(confidences, correct, thresholds, *, normalize: str = "retained",
           kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> SweepResult:
  """:func:`sweep` with these ``kernels`` (the internal entry point)."""
  _stats.check_normalize(normalize)
  if not _validation.is_concrete(confidences, correct):
    return _sweep_traced(confidences, correct, thresholds, normalize=normalize, kernels=kernels)
  return _checked_sweep(confidences, correct, thresholds, normalize=normalize, kernels=kernels)


def _checked_sweep(confidences, correct, thresholds, *, normalize: str,
                   kernels: _dispatch.Kernels) -> SweepResult:
  traced = not _validation.is_concrete(confidences, correct)
  # Invalid traced confidences, and concrete ones on an accelerator: left out and counted by
  # the kernel (_sweep_1d), with no pass of their own; correctness here.
  deferred = _validation.deferred_to_kernel(confidences, kernels=kernels)
  confidences, correct, invalid = _validation.samples(confidences, correct, flag_confidences=False,
                                                      check_confidences=not deferred,
                                                      kernels=kernels)
  thresholds, _ = _validation.thresholds(thresholds)  # invalid ones: NaN in the kernel
  fn = functools.partial(_sweep_1d, normalize=normalize, drop_invalid=traced or deferred,
                         kernels=kernels)
  for _ in range(confidences.ndim - 1):
    fn = jax.vmap(fn, in_axes=(0, 0, None))  # a flattening rule, not a loop (bucket_sums)
  result = fn(confidences, correct, thresholds)
  if deferred:  # a row that lost samples is NaN
    _validation.raise_if_left_out(np.isnan(np.asarray(result.coverage)), confidences,
                                  kernels=kernels)
  if invalid is None:
    return result
  return SweepResult(result.thresholds, *_validation.poison(tuple(result[1:]), rows=invalid))


# Traced samples (inside a user's jit, vmap or grad): the value checks become
# flags, computed with the kernel in one compiled call rather than op by op.
_sweep_traced = jax.jit(_checked_sweep, static_argnames=("normalize", "kernels"))
