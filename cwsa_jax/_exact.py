"""Exact segment sums of values in [0, 1] with float32 inputs and no x64.

The hard metrics reduce to four sums per threshold over the retained set:
the count ``N``, the correct count (or sum of graded correctness) ``A``,
``U = sum(1 - c)`` and ``V = sum((1 - c) * correct)``. A float32 scatter-add of
10^7 terms loses about 4e-3 relative accuracy (each add rounds against a
large partial sum), far above the 2e-6 we promise.

Instead every value ``x`` in [0, 1] is written as base-256 digits

.. math::

  x = \\sum_{j=0}^{L-1} d_j \\, 256^{-(j+1)}, \\qquad d_0 \\in [0, 256],\\;
  d_{j>0} \\in [0, 255],

which is exact for ``1 - c`` with three digits (for a float32 ``c`` the value
``1 - c`` is a multiple of 2^-24) and truncates below 2^-32 with four digits.
The digits (base 256, or base 4096 for ``1 - c`` in the binary layout) are
summed as int32 in chunks of at most 2^18 samples (so a chunk sum stays below
2^30; a chunk's buffers stay in the cache) and carried between chunks as a
(high, low) pair of int32 with base 2^12 (on CPU a loop over the chunks, where
the count column can ride in the low bits of another, :func:`_counted_column_sums`;
on accelerators every chunk at once, each into a table of its own; ``_dispatch.Kernels``
picks the form). Every sum is
therefore an exact integer until the last step, where it is converted to
float32 once (relative error <= 2^-23).

The column layouts (which digits of which quantity, in which segment) live
in ``_stats``; this module has the digit extraction (:func:`digits`,
:func:`grid_digits`, :func:`grid_columns`, :func:`wide_digits`), the chunked
exact sums (:func:`segment_sums`) and two ways back to float32:
:func:`combine` (a float sum of digit columns) and :func:`exact_float` (a
signed integer combination of columns, carried exactly in int32 limbs and
rounded only at the end, so a difference of two nearly equal sums keeps its
full relative precision).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _mesh
from cwsa_jax._kernels import _sort

_DIGIT_BASE = 256.0
CARRY_BITS = 12  # bits of a limb (base 4096); the bootstrap's wide area carry splits counts by it
_CARRY_MASK = (1 << CARRY_BITS) - 1
# The default chunk (``_dispatch.CHUNK_SIZE``, 2^18 samples). Chunks are balanced and a
# multiple of CHUNK_ALIGN long: on CPU, loops over odd-sized slices run several times slower.
CHUNK_SIZE = _dispatch.CHUNK_SIZE
CHUNK_ALIGN = 64


def digits(x: jax.Array, num_digits: int) -> list[jax.Array]:
  """Base-256 digits of float32 ``x`` in [0, 1], most significant first (at most 4).

  ``x * 2^16`` is exact in binary floating point, so ``hi = floor(x 2^16)`` and
  the remainder ``x 2^16 - hi`` are exact; the remainder's top 16 bits give
  the next two digits. The digits represent ``x`` exactly down to
  256^-num_digits (truncating below).
  """
  if not 1 <= num_digits <= 4:
    raise ValueError(f"num_digits must be in [1, 4], got {num_digits}")
  scaled = x.astype(jnp.float32) * 65536.0
  hi_f = jnp.floor(scaled)
  hi = hi_f.astype(jnp.int32)
  lo = jnp.floor((scaled - hi_f) * 65536.0).astype(jnp.int32)
  return [hi >> 8, hi & 255, lo >> 8, lo & 255][:num_digits]


def grid_digits(x: jax.Array) -> list[jax.Array]:
  """The three base-256 digits of ``x`` in [0, 1] that is a multiple of 2^-24.

  ``1 - c`` for float32 ``c`` in [0, 1] is such a value, so this is exact for
  it, and cheaper than :func:`digits` (one conversion, integer shifts).
  """
  units = (x.astype(jnp.float32) * 16777216.0).astype(jnp.int32)
  return [units >> 16, (units >> 8) & 255, units & 255]


def grid_columns(u: jax.Array) -> list[jax.Array]:
  """The two base-4096 digits ``(hi, lo)`` of ``u`` in [0, 1] that is a multiple of 2^-24.

  ``u = (hi 4096 + lo) 2^-24`` exactly, with ``hi`` in [0, 4096] and ``lo`` in
  [0, 4095]: the cheapest exact columns of ``1 - c`` for float32 ``c``.
  """
  return unit_columns((u.astype(jnp.float32) * 16777216.0).astype(jnp.int32))


def unit_columns(units: jax.Array) -> list[jax.Array]:
  """:func:`grid_columns` of ``u = units 2^-24``, ``units`` int32 in [0, 2^24]."""
  return [units >> CARRY_BITS, units & _CARRY_MASK]


def wide_digits(x: jax.Array, num_digits: int) -> list[jax.Array]:
  """Base-4096 digits of float32 ``x`` in [0, 1], most significant first.

  ``x = sum_j d_j 4096^-(j+1)`` down to 4096^-num_digits (truncating below),
  with ``d_0`` in [0, 4096] and the others in [0, 4095]. Each step scales by
  2^12 and splits off the integer part, both exact in binary floating point;
  three digits hold every float32 ``x >= 2^-12`` exactly.
  """
  rest = x.astype(jnp.float32)
  out = []
  for _ in range(num_digits):
    scaled = rest * 4096.0
    whole = jnp.floor(scaled)
    out.append(whole.astype(jnp.int32))
    rest = scaled - whole
  return out


def split(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(hi, lo)`` of non-negative int32 ``x``: ``x = hi * 4096 + lo``, ``0 <= lo < 4096``."""
  return x >> CARRY_BITS, x & _CARRY_MASK


def _normalize(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  return hi + (lo >> CARRY_BITS), lo & _CARRY_MASK


# Piece widths (bits) that divide a limb; the widest that fits is taken, so short sums keep
# whole limbs (the same program as summing limbs directly).
_PIECE_WIDTHS = (12, 6, 4, 3, 2, 1)


def piece_bits(count: int) -> int:
  """The widest piece ``w`` (dividing 12 bits) with ``count 2^w <= 2^31``: pieces below
  ``2^w`` summed over ``count`` entries, plus a carry below ``count``, never wrap int32.

  12 (whole limbs) up to ``2^19`` entries, 6 up to ``2^25``, 1 up to ``2^30``; more raises.
  """
  for bits in _PIECE_WIDTHS:
    if count << bits <= 1 << 31:
      return bits
  raise ValueError(f"exact int32 sums run over at most 2^30 entries, got {count}")


def _carried_sums(total: Callable[[jax.Array], jax.Array], limbs: Sequence[jax.Array],
                  top: jax.Array, count: int) -> tuple[jax.Array, list[jax.Array]]:
  """Exact ``total`` (a sum or cumulative sum over ``count`` entries of an axis) of the integers
  ``top 4096^L + sum_j limbs[j] 4096^j``, limbs in [0, 4096), as ``(top', limbs')`` with
  ``limbs'`` in [0, 4096).

  .. math::

    s_k = \\mathrm{total}(p_k) + \\lfloor s_{k-1} / 2^w \\rfloor,\\qquad
    p'_k = s_k \\bmod 2^w,\\qquad
    \\mathrm{top}' = \\mathrm{total}(\\mathrm{top}) + \\lfloor s_{last} / 2^w \\rfloor

  over the limbs cut into ``w``-bit pieces ``p_k`` (``w`` = :func:`piece_bits` of
  ``count``), least significant first. Bound: ``s_k < count (2^w - 1) + count <= 2^31``
  for any ``count <= 2^30``; ``top'`` is the total's own top limb, so it stays in int32
  when the total's top does (the caller's bound, e.g. :data:`TOP_CAPACITY`).
  """
  bits = piece_bits(count)
  mask = (1 << bits) - 1
  per_limb = CARRY_BITS // bits
  if per_limb == 1:  # whole limbs: no cut
    pieces = [total(limb) for limb in limbs]
  else:
    pieces = [total((limb >> (bits * i)) & mask) for limb in limbs for i in range(per_limb)]
  out, carry = [], None
  for piece in pieces:
    piece = piece if carry is None else piece + carry
    out.append(piece & mask)
    carry = piece >> bits
  top = total(top) + carry
  if per_limb == 1:
    return top, out
  return top, [functools.reduce(lambda a, b: a | b,
                                (out[j * per_limb + i] << (bits * i) for i in range(1, per_limb)),
                                out[j * per_limb]) for j in range(len(limbs))]


def _column_sums(cols: jax.Array, ids: jax.Array, num_segments: int) -> jax.Array:
  """Per-segment sums [num_segments, K] of int32 columns [K, C, ...] (ids [C, ...]).

  One 1-D scatter-add per column: on CPU, K scalar scatters are about twice
  as fast as one scatter of K-wide rows. Bound: a segment's sum stays in int32
  for up to 2^19 samples of entries at most 4096 (:func:`segment_sums` passes
  chunks of at most 2^18).
  """
  ids = ids.reshape(-1)
  return jnp.stack([jax.ops.segment_sum(col.reshape(-1), ids, num_segments=num_segments)
                    for col in cols], axis=1)


# Counted columns (column 0 the count, 0 or 1; the last column in [0, 4095]): in slots of
# 2^9 samples, the count rides in the low 10 bits of the last column, so K columns take
# K - 1 scatter-adds, each into a table per slot.
_SLOT_BITS = 9
_COUNT_BITS = _SLOT_BITS + 1
_COUNT_MASK = (1 << _COUNT_BITS) - 1


def packs(ids: jax.Array, num_segments: int, num_columns: int) -> bool:
  """Whether :func:`_counted_column_sums` pays here (measured on CPU): two columns or more,
  two slots or more, and slot tables together at most a quarter the size of the samples."""
  slots = -(-ids.size >> _SLOT_BITS)
  return num_columns >= 2 and slots >= 2 and 4 * slots * num_segments <= ids.size


def _counted_column_sums(cols: jax.Array, ids: jax.Array, num_segments: int) -> jax.Array:
  """:func:`_column_sums` of counted columns with one scatter-add fewer (the same sums).

  The sample at flattened position ``p`` adds ``(x_last << 10) | x_0`` to
  entry ``(p >> 9) S + id`` of a table per slot of 2^9 positions. No entry
  sums more than 512 samples, so the count stays below 2^10 and
  ``512 * 4095 << 10`` below 2^31; splitting the entries and summing over
  the slots gives the exact column sums (each below ``4096 C``: in int32 for up
  to 2^19 samples, as :func:`_column_sums`).
  """
  ids, cols = ids.reshape(-1), cols.reshape(cols.shape[0], -1)
  slots = -(-ids.size >> _SLOT_BITS)
  slot = jnp.arange(ids.size, dtype=jnp.int32) >> _SLOT_BITS
  inside = (ids >= 0) & (ids < num_segments)
  flat = jnp.where(inside, ids + slot * num_segments, slots * num_segments)  # outside: dropped
  per_slot = lambda col: jax.ops.segment_sum(  # noqa: E731
      col, flat, num_segments=slots * num_segments).reshape(slots, num_segments)
  table = per_slot((cols[-1] << _COUNT_BITS) | cols[0])
  sums = [jnp.sum(table & _COUNT_MASK, axis=0)]
  sums += [jnp.sum(per_slot(col), axis=0) for col in cols[1:-1]]
  sums += [jnp.sum(table >> _COUNT_BITS, axis=0)]
  return jnp.stack(sums, axis=1)


def _sums(cols: jax.Array, ids: jax.Array, num_segments: int, *, counted: bool) -> jax.Array:
  """:func:`_column_sums`, or :func:`_counted_column_sums` where it :func:`packs`."""
  if counted and packs(ids, num_segments, cols.shape[0]):
    return _counted_column_sums(cols, ids, num_segments)
  return _column_sums(cols, ids, num_segments)


def chunking(n: int, chunk_size: int = CHUNK_SIZE) -> tuple[int, int]:
  """``(num_chunks, size)``: balanced chunks of at most ``chunk_size`` covering n samples.

  ``size`` is a multiple of :data:`CHUNK_ALIGN` when that fits (and n when
  one chunk covers everything); the last chunk is shifted back to end at n.
  """
  if n <= chunk_size:
    return 1, n
  num_chunks = -(-n // chunk_size)
  size = -(-n // num_chunks)
  aligned = -(-size // CHUNK_ALIGN) * CHUNK_ALIGN
  return num_chunks, aligned if aligned <= chunk_size else size


def segment_sums(
    columns_fn: Callable[..., tuple[jax.Array, jax.Array]],
    arrays: Sequence[jax.Array],
    num_segments: int,
    *,
    chunk_size: int | None = None,
    with_offset: bool = False,
    segments_per_entry: int | None = None,
    counted: bool = False,
    kernels: _dispatch.Kernels = _dispatch.DEFAULT,
) -> tuple[jax.Array, jax.Array]:
  """Exact per-segment sums of small non-negative integer columns.

  Args:
    columns_fn: maps chunks of ``arrays`` (each [C, ...]) to ``(segment_ids
      [C, ...] int32, columns [K, C, ...] int32)`` with every column entry in
      [0, 4096]. Ids outside [0, num_segments) are left out.
      (Columns are built feature-major, [K, C]: on CPU, stacking K arrays along
      a new last axis is several times slower than along a new first one.)
    arrays: arrays with a leading axis of equal length n (samples, or rows of
      samples: [n, m] arrays are chunked by rows).
    num_segments: static number of segments.
    chunk_size: most entries of the leading axis per chunk; 4096 times the
      values per chunk (chunk_size * m) must stay below 2^31 (default:
      ``kernels.chunk_size``).
    with_offset: also pass ``columns_fn`` the index in ``arrays`` of the
      chunk's first entry (int32 scalar), as a last argument.
    segments_per_entry: entry ``i`` of the leading axis owns the segments
      ``[i s, (i + 1) s)`` (e.g. one row of samples each); ``columns_fn``
      then returns ids relative to its chunk's first entry, and each chunk
      is summed into a table of its own entries only (a small scatter target
      however many entries there are). ``num_segments = n s``.
    counted: column 0 is a count (entries 0 or 1) and the last column's
      entries are at most 4095: on CPU, the count then rides in the last
      column (:func:`_counted_column_sums`, one scatter-add fewer), except
      for rows with ``segments_per_entry``.
    kernels: picks the CPU form (a loop over the chunks) or the accelerators'
      (every chunk at once).

  Returns:
    ``(hi, lo)``, int32 arrays [num_segments, K] with the exact sums
    ``hi * 4096 + lo`` (``0 <= lo < 4096``). Bound: ``hi`` is a sum over
    4096, below 2^31 for fewer than 2^31 values in all (every partial sum
    too: per chunk below 2^31, carried between chunks as pairs).
  """
  n = arrays[0].shape[0]
  chunk_size = kernels.chunk_size if chunk_size is None else chunk_size
  num_chunks, size = chunking(n, chunk_size)
  offset = (jnp.zeros((), jnp.int32),) if with_offset else ()
  # Rows that own their segments (a vmapped sweep) keep every scatter: packing them
  # measured no gain (slot tables per row, laid out either way).
  counted = counted and segments_per_entry is None
  if num_chunks == 1:
    ids, cols = columns_fn(*arrays, *offset)
    if not (counted and packs(ids, num_segments, cols.shape[0])):
      return split(_column_sums(cols, ids, num_segments))
    return split(kernels.pick(
        "exact", cols, ids,
        cpu=functools.partial(_counted_column_sums, num_segments=num_segments),
        default=functools.partial(_column_sums, num_segments=num_segments)))
  options = dict(num_segments=num_segments, with_offset=with_offset,
                 segments_per_entry=segments_per_entry)
  if segments_per_entry is None:
    at_once = chunking(n, _accelerator_chunk(n, num_segments, chunk_size))
  else:  # each chunk's entries own their segments already
    at_once = num_chunks, size
  return kernels.pick(
      "exact", *arrays,
      cpu=functools.partial(_chunk_loop, columns_fn, num_chunks=num_chunks, size=size,
                            counted=counted, **options),
      default=functools.partial(_chunks_at_once, columns_fn, num_chunks=at_once[0],
                                size=at_once[1], **options))


# Accelerators: chunks small enough that all the chunks' tables together hold
# about this many segments. With few segments per chunk the scatter-adds
# contend for the same entries (an order of magnitude slower on GPUs).
_ACCELERATOR_TABLE_SEGMENTS = 1 << 21


def _accelerator_chunk(n: int, num_segments: int, chunk_size: int) -> int:
  """A power of two in [1024, chunk_size] with about n (S + 1) / 2^21 samples per chunk."""
  target = -(-n * (num_segments + 1) // _ACCELERATOR_TABLE_SEGMENTS)
  return min(chunk_size, 1 << max(10, (target - 1).bit_length()))



def _chunk_loop(columns_fn, *arrays, num_segments, num_chunks, size, with_offset,
                segments_per_entry, counted=False):
  """:func:`segment_sums` on CPU: a loop over the chunks, each summed while in the cache.

  Bound: the carried ``hi`` is the sum so far over 4096 (below 2^31 for fewer than
  2^31 values) and ``lo`` below 8192 before each carry.
  """
  n = arrays[0].shape[0]
  local = jnp.arange(size, dtype=jnp.int32)
  chunk_segments = num_segments if segments_per_entry is None else size * segments_per_entry

  def body(i, carry):
    hi, lo = carry
    first = i * size
    # The last chunk is shifted back to stay in bounds; the samples the
    # previous chunk already counted go to an extra segment that is dropped.
    start = jnp.minimum(first, n - size)
    chunk = [jax.lax.dynamic_slice_in_dim(a, start, size) for a in arrays]
    ids, cols = columns_fn(*chunk, *((start,) if with_offset else ()))
    fresh = (start + local >= first).reshape((size,) + (1,) * (ids.ndim - 1))
    ids = jnp.where(fresh, ids, chunk_segments)
    s_hi, s_lo = split(_sums(cols, ids, chunk_segments + 1, counted=counted)[:chunk_segments])
    if segments_per_entry is None:
      return _normalize(hi + s_hi, lo + s_lo)
    at = start * segments_per_entry
    own = [jax.lax.dynamic_slice_in_dim(x, at, chunk_segments) for x in (hi, lo)]
    own = _normalize(own[0] + s_hi, own[1] + s_lo)
    return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, at, 0) for x, y in zip((hi, lo), own))

  k = jax.eval_shape(
      lambda *a: columns_fn(*a)[1],
      *[jax.ShapeDtypeStruct((size,) + a.shape[1:], a.dtype) for a in arrays],
      *[jax.ShapeDtypeStruct((), jnp.int32) for _ in range(with_offset)]).shape[0]
  zeros = _mesh.vary_like(jnp.zeros((num_segments, k), dtype=jnp.int32), arrays)
  return jax.lax.fori_loop(0, num_chunks, body, (zeros, zeros))


def _chunks_at_once(columns_fn, *arrays, num_segments, num_chunks, size, with_offset,
                    segments_per_entry):
  """:func:`segment_sums` on accelerators: every chunk at once, no loop.

  The samples are padded to ``num_chunks * size`` and viewed as [chunks,
  size]; one scatter-add per column sums each chunk into a table of its own
  (chunk c's segment s at ``c (S + 1) + s``, so the adds spread over all the
  chunks' tables), whose int32 entries stay below 2^30. Their ``(hi, lo)``
  parts are then summed over the chunks: ``hi`` adds up to at most the total
  over 4096 (below 2^31 for fewer than 2^31 samples) and ``lo`` to at most 4095
  per chunk, summed whole up to 2^19 chunks and in narrower pieces beyond
  (:func:`_carried_sums`; up to 2^21 chunks of at least 1024 samples), both exact
  in int32. The result equals :func:`_chunk_loop`'s.
  """
  n = arrays[0].shape[0]
  padded = num_chunks * size
  starts = jnp.arange(num_chunks, dtype=jnp.int32) * size
  view = lambda a: jnp.pad(a, [(0, padded - n)] + [(0, 0)] * (a.ndim - 1)).reshape(  # noqa: E731
      (num_chunks, size) + a.shape[1:])
  chunks = [view(a) for a in arrays]
  ids, cols = jax.vmap(columns_fn)(*chunks, *((starts,) if with_offset else ()))
  # ids [chunks, size, ...], cols [chunks, K, size, ...]
  valid = (starts[:, None] + jnp.arange(size, dtype=jnp.int32) < n).reshape(
      (num_chunks, size) + (1,) * (ids.ndim - 2))
  per_chunk = num_segments if segments_per_entry is None else size * segments_per_entry
  inside = valid & (ids >= 0) & (ids < per_chunk)
  flat = jnp.where(inside, ids, per_chunk) + (jnp.arange(num_chunks, dtype=jnp.int32) * (
      per_chunk + 1)).reshape((num_chunks,) + (1,) * (ids.ndim - 1))
  cols = jnp.moveaxis(cols, 1, 0)  # [K, chunks, size, ...]
  table = _column_sums(cols, flat, num_chunks * (per_chunk + 1))
  table = table.reshape(num_chunks, per_chunk + 1, -1)[:, :per_chunk]  # [chunks, S, K]
  hi, lo = split(table)
  if segments_per_entry is not None:  # chunk c owns segments [c S, (c + 1) S)
    return hi.reshape(-1, hi.shape[-1])[:num_segments], lo.reshape(-1, lo.shape[-1])[:num_segments]
  hi, (lo,) = _carried_sums(functools.partial(jnp.sum, axis=0), [lo], hi, num_chunks)
  return hi, lo


def add(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Exact sum of two ``(hi, lo)`` pairs, in canonical form (``0 <= lo < 4096``)."""
  return _normalize(a[0] + b[0], a[1] + b[1])


def canonical(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The canonical ``(hi, lo)`` of an exact sum whose ``lo`` may exceed 4096 (e.g. after a psum)."""
  return _normalize(hi, lo)


# ------------------------------------------------------------------ wide sums
#
# A mergeable state's sums outgrow the (hi, lo) pairs: hi wraps past 2^31, i.e. a column past
# 2^43 units. States keep each sum as (top, hi, lo) = top 2^36 + hi 2^12 + lo, with hi in
# [0, 2^24) and lo in [0, 4096). Every column adds at most 4096 units per sample, so 2^53
# samples need tops of at most 2^29; a state is marked past capacity from 1.5 2^29 on, so that
# two unmarked states still merge below 2^31. Sums over many buckets (wide_suffix_sums) cut
# the 12-bit limbs into narrower pieces past 2^19 buckets, where whole limbs would wrap.

_HI_BITS = 24
_HI_MASK = (1 << _HI_BITS) - 1
# Largest total of a column's top limbs over a state's buckets before it is marked.
TOP_CAPACITY = 3 << 28
# A state past its capacity has every top limb set to this (sticky through merges).
OVER_CAPACITY = -1

Wide = tuple  # (top, hi, lo) int32 arrays of one shape


def widen(hi: jax.Array, lo: jax.Array) -> Wide:
  """The canonical ``(top, hi, lo)`` of a non-negative ``(hi, lo)`` pair."""
  hi, lo = _normalize(hi, lo)
  return hi >> _HI_BITS, hi & _HI_MASK, lo


def wide_add(a: Wide, b: Wide) -> Wide:
  """Exact sum of two canonical ``(top, hi, lo)`` (tops up to TOP_CAPACITY: no int32 wrap)."""
  lo = a[2] + b[2]
  hi = a[1] + b[1] + (lo >> CARRY_BITS)
  return a[0] + b[0] + (hi >> _HI_BITS), hi & _HI_MASK, lo & _CARRY_MASK


def wide_sub(a: Wide, b: Wide) -> Wide:
  """Exact ``a - b`` of canonical ``(top, hi, lo)`` with ``a >= b`` (floor carries)."""
  lo = a[2] - b[2]
  hi = a[1] - b[1] + (lo >> CARRY_BITS)
  return a[0] - b[0] + (hi >> _HI_BITS), hi & _HI_MASK, lo & _CARRY_MASK


def wide_reduce(w: Wide, total: Callable[[jax.Array], jax.Array]) -> Wide:
  """Exact sum of canonical ``(top, hi, lo)`` by ``total`` (a sum over an axis, or a ``psum``).

  Each limb is cut into pieces of at most 16 bits before ``total`` adds them,
  so up to 2^15 summands never wrap; a total whose top limb leaves int32 comes
  out over capacity.
  """
  top, hi, lo = w
  lo, h0, h1 = total(lo), total(hi & _CARRY_MASK), total(hi >> CARRY_BITS)
  t0, t1 = total(top & 0xFFFF), total(top >> 16)
  over = total((top < 0).astype(jnp.int32)) > 0
  h0 = h0 + (lo >> CARRY_BITS)
  h1 = h1 + (h0 >> CARRY_BITS)
  t0 = t0 + (h1 >> CARRY_BITS)
  t1 = t1 + (t0 >> 16)
  over = over | (t1 >= 1 << 15)
  top = jnp.where(over, OVER_CAPACITY, (t1 << 16) | (t0 & 0xFFFF))
  return top, ((h1 & _CARRY_MASK) << CARRY_BITS) | (h0 & _CARRY_MASK), lo & _CARRY_MASK


def seal(w: Wide, axes: int = 2) -> Wide:
  """``w`` with every top limb set to :data:`OVER_CAPACITY` in each state (its last ``axes``
  axes) that is past its capacity: some top limb marked already, or some column whose total
  over the buckets (axis -2) exceeds ``TOP_CAPACITY`` tops (estimated in float32: the bound
  leaves a factor 8/3 to int32's limit, so the estimate's rounding cannot hide a wrap; even
  summed one by one, below 2^22 buckets it errs by less than a quarter)."""
  top, hi, lo = w
  column = jnp.sum(top.astype(jnp.float32) + hi.astype(jnp.float32) * 2.0**-_HI_BITS, axis=-2)
  over_axes = tuple(range(-axes, 0))
  over = (jnp.any(top < 0, axis=over_axes)
          | jnp.any(column > TOP_CAPACITY, axis=tuple(range(-(axes - 1), 0))))
  over = over.reshape(over.shape + (1,) * axes)
  return jnp.where(over, OVER_CAPACITY, top), hi, lo


def over_capacity(top: jax.Array, axes: int = 2) -> jax.Array:
  """bool [...]: each state (its last ``axes`` axes of ``top``) is past its capacity."""
  return jnp.any(top < 0, axis=tuple(range(-axes, 0)))


def _reverse_cumsum(x: jax.Array) -> jax.Array:
  # _sort.cumsum: XLA:CPU runs jnp.cumsum as a much slower windowed reduction.
  return jnp.flip(_sort.cumsum(jnp.flip(x, 0)), 0)


def wide_suffix_sums(w: Wide) -> Wide:
  """Exact reverse cumulative sums along axis 0 of canonical ``(top, hi, lo)``:
  ``out[b] = sum_{b' >= b} w[b']``.

  The 12-bit limbs ``lo``, ``hi & 4095`` and ``hi >> 12`` are summed whole over up
  to ``2^19`` entries and in narrower pieces beyond (:func:`_carried_sums`), so no
  partial sum wraps int32 for up to ``2^30`` entries (e.g. the 1,032,193 bins of a
  ``RiskCoverageState`` of 12 mantissa bits, where whole limbs would). Bound: the
  tops along axis 0 add up to less than 2^31 (a state within capacity: at most
  about :data:`TOP_CAPACITY` a column); a marked state's tops (-1) give negative
  tops, never a wrap.
  """
  top, hi, lo = w
  top, (lo, h0, h1) = _carried_sums(_reverse_cumsum, [lo, hi & _CARRY_MASK, hi >> CARRY_BITS],
                                    top, lo.shape[0])
  return top, (h1 << CARRY_BITS) | h0, lo


def wide_to_float(w: Wide) -> jax.Array:
  """float32 of canonical ``(top, hi, lo)``, correctly rounded (equal to :func:`to_float` of
  the same integer as a pair)."""
  top, hi, lo = w
  return _round_to_float([lo, hi & _CARRY_MASK, hi >> CARRY_BITS, top], 0)


def wide_times_4096(w: Wide) -> Wide:
  """The canonical ``(top, hi, lo)`` of ``4096 w``: every limb moved up one base-4096 place
  (``w`` below 2^67, i.e. ``top < 2^19``: a count column of a state within capacity).

  A count written where a column of 4096 units per sample is expected (e.g. the number of
  correct samples as the first base-4096 digit of the summed correctness).
  """
  top, hi, lo = w
  return ((top << CARRY_BITS) | (hi >> CARRY_BITS), ((hi & _CARRY_MASK) << CARRY_BITS) | lo,
          jnp.zeros_like(lo))


def wide_terms(sign: int, w: Wide, place: int) -> list:
  """:func:`exact_float` terms of ``sign * w * 4096^place`` for canonical ``(top, hi, lo)``."""
  top, hi, lo = w
  return [(sign, hi, lo, place), (sign, top, jnp.zeros_like(top), place + 2)]


def suffix_sums(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact reverse cumulative sums along axis 0: out[b] = sum_{b' >= b} in[b'].

  ``lo`` (canonical, below 4096) is summed whole over up to ``2^19`` entries and in
  narrower pieces beyond (:func:`_carried_sums`: e.g. a sweep of more than 2^19
  thresholds). Bound: the total's own ``hi`` below 2^31 (the pair's range, below
  2^43; any one-shot sum of fewer than 2^31 samples).
  """
  hi, lo = _normalize(hi, lo)
  hi, (lo,) = _carried_sums(_reverse_cumsum, [lo], hi, lo.shape[0])
  return hi, lo


def to_float(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """float32 of the exact non-negative integer ``hi * 4096 + lo``, correctly rounded.

  A function of the integer only (to nearest, ties to even), so a sum and its
  double convert to a float and its double, however they were accumulated.
  """
  # hi 4096 + lo = a 2^24 + c with a = hi >> 12 and c = (hi & 4095) 4096 + lo below 2^24: two
  # floats held exactly, so their sum is rounded once.
  hi, lo = _normalize(hi, lo)
  c = ((hi & _CARRY_MASK) << CARRY_BITS) | lo
  return (hi >> CARRY_BITS).astype(jnp.float32) * float(1 << 24) + c.astype(jnp.float32)


def to_int(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """int32 value of the exact integer ``hi * 4096 + lo`` (a count: it must stay below 2^31)."""
  return (hi << CARRY_BITS) + lo


def exact_float(terms: Sequence[tuple[int, jax.Array, jax.Array, int]]) -> jax.Array:
  """float32 of the exact integer combination ``sum_t sign_t (hi_t 4096 + lo_t) 4096^place_t``.

  Args:
    terms: ``(sign, hi, lo, place)`` with ``sign`` +1 or -1 (or an int32 array of
      them and 0, broadcast against ``hi``: several combinations at once), ``hi`` and ``lo``
      non-negative int32 arrays of one shape (the ``(hi, lo)`` sums of
      :func:`segment_sums`, or any integer as ``(0, x)``) and ``place`` a
      static integer (a column's weight, e.g. -1 for 2^-12).

  The terms are added into base-4096 int32 limbs and the carries propagated,
  all exactly; only the conversion of the magnitude rounds, once and correctly
  (:func:`_round_to_float`), whatever cancellation the signs cause.
  The result is a function of the exact integer only, so equal sums give
  bit-for-bit equal floats however they were accumulated or merged.

  Bound: ``hi`` and ``lo`` enter cut into their low 12 bits and the rest (below
  2^19), so a term adds less than ``2^19 + 2^12`` to any limb: exact for any
  non-negative int32 ``hi`` and ``lo`` and up to 4000 terms (with the carries, below
  2^31). Added whole, two ``hi`` near 2^30 at one place would wrap (e.g. ``N - A - U``
  of a one-shot sum of 2^30 samples).
  """
  base = min(place for _, _, _, place in terms)
  # lo at place - base, hi one limb up (each spanning two); hi < 2^31 spans three more limbs.
  num_limbs = max(place for _, _, _, place in terms) - base + 5
  num_limbs += num_limbs % 2
  if len(terms) > 4000:
    raise ValueError(f"exact_float adds at most 4000 terms exactly, got {len(terms)}")
  shape = jnp.broadcast_shapes(*(jnp.shape(x) for term in terms for x in term[:3]))
  zero = jnp.zeros(shape, jnp.int32)
  limbs = [zero] * num_limbs
  for sign, hi, lo, place in terms:
    q = place - base
    for at, x in ((q, lo), (q + 1, hi)):
      limbs[at] = limbs[at] + sign * (x & _CARRY_MASK)
      limbs[at + 1] = limbs[at + 1] + sign * (x >> CARRY_BITS)

  def normalize(limbs):
    out = []
    carry = zero
    for limb in limbs[:-1]:
      limb = limb + carry
      out.append(limb & _CARRY_MASK)
      carry = limb >> CARRY_BITS  # arithmetic shift: floor division, also for negatives
    return out + [limbs[-1] + carry]

  limbs = normalize(limbs)
  negative = limbs[-1] < 0  # every lower limb is in [0, 4096)
  limbs = [jnp.where(negative, a, b) for a, b in zip(normalize([-x for x in limbs]), limbs)]
  total = _round_to_float(limbs, base)
  return jnp.where(negative, -total, total)


def _round_to_float(limbs: Sequence[jax.Array], base: int) -> jax.Array:
  """float32 of ``sum_j limbs[j] 4096^(base + j)``, correctly rounded (to nearest, ties to even).

  ``limbs[:-1]`` lie in [0, 4096) and ``limbs[-1]`` in [0, 2^31). The limbs are
  paired into 24-bit words; the leading non-zero word and the one below it
  hold 25 to 48 significant bits: the top 24 are the significand, the next bit
  and every bit below it (a sticky bit) decide the rounding, all in int32; the
  float is then the significand times a power of two, both exact.
  """
  last = limbs[-1]
  limbs = list(limbs[:-1]) + [last & _CARRY_MASK, (last >> CARRY_BITS) & _CARRY_MASK,
                              last >> (2 * CARRY_BITS)]
  zero = jnp.zeros_like(limbs[0])
  if len(limbs) % 2:
    limbs.append(zero)
  words = [zero] + [limbs[j] | (limbs[j + 1] << CARRY_BITS) for j in range(0, len(limbs), 2)]
  # The leading word (index >= 1; word 0 is a zero below the lowest) and the word under it.
  lead, under, index = words[1], zero, jnp.ones(zero.shape, jnp.int32)
  sticky = below = jnp.zeros(zero.shape, bool)  # below: some word under words[j - 1] is non-zero
  for j in range(2, len(words)):
    below = below | (words[j - 2] != 0)
    take = words[j] != 0
    lead = jnp.where(take, words[j], lead)
    under = jnp.where(take, words[j - 1], under)
    index = jnp.where(take, j, index)
    sticky = jnp.where(take, below, sticky)
  bits = 32 - jax.lax.clz(lead)  # 1 to 24 (0 for the value 0)
  shift = jnp.maximum(bits, 1)  # bits of `under` below the significand
  significand = (lead << (24 - shift)) | (under >> shift)
  rest = under & ((1 << shift) - 1)
  half = 1 << (shift - 1)
  up = (rest > half) | ((rest == half) & (sticky | ((significand & 1) == 1)))
  significand = significand + up.astype(jnp.int32)
  exponent = shift + 24 * (index - 2) + CARRY_BITS * base
  scale = jax.lax.bitcast_convert_type((exponent + 127) << 23, jnp.float32)  # 2^exponent
  return significand.astype(jnp.float32) * scale


def combine(values: jax.Array, num_digits: int) -> jax.Array:
  """Sum of digit columns [..., num_digits] weighted by 256^-(j+1).

  Adds the least significant digit first, so the float32 result carries a
  relative error of a few ulp.
  """
  total = jnp.zeros(values.shape[:-1], jnp.float32)
  for j in reversed(range(num_digits)):
    total = total + values[..., j] * (_DIGIT_BASE ** -(j + 1))
  return total
