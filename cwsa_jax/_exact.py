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
summed as int32 in chunks of 2^16 samples (so a chunk sum stays below 2^28;
small chunks also keep their buffers in the L2 cache) and carried between
chunks as a (high, low) pair of
int32 with base 2^12. Every sum is therefore an exact integer until the last
step, where it is converted to float32 once (relative error <= 2^-23).

All of this is internal: the public metrics in ``_selective`` and ``_sweep``
call :func:`segment_sums` and :func:`combine`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

_DIGIT_BASE = 256.0
_CARRY_BITS = 12
_CARRY_MASK = (1 << _CARRY_BITS) - 1
CHUNK_SIZE = 1 << 16  # 4096 * CHUNK_SIZE < 2^31; measured 4x faster at n = 1e6 than 2^20


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


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  return x >> _CARRY_BITS, x & _CARRY_MASK


def _normalize(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  return hi + (lo >> _CARRY_BITS), lo & _CARRY_MASK


def _column_sums(cols: jax.Array, ids: jax.Array, num_segments: int) -> jax.Array:
  """Per-segment sums [num_segments, K] of int32 columns [K, C].

  One 1-D scatter-add per column: on CPU, K scalar scatters are about twice
  as fast as one scatter of K-wide rows.
  """
  return jnp.stack([jax.ops.segment_sum(col, ids, num_segments=num_segments) for col in cols],
                   axis=1)


def segment_sums(
    columns_fn: Callable[..., tuple[jax.Array, jax.Array]],
    arrays: Sequence[jax.Array],
    num_segments: int,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[jax.Array, jax.Array]:
  """Exact per-segment sums of small non-negative integer columns.

  Args:
    columns_fn: maps chunks of ``arrays`` (each [C]) to ``(segment_ids [C]
      int32, columns [K, C] int32)`` with every column entry in [0, 4096].
      (Columns are built feature-major, [K, C]: on CPU, stacking K arrays along
      a new last axis is several times slower than along a new first one.)
    arrays: arrays with a leading samples axis of equal length n.
    num_segments: static number of segments.
    chunk_size: samples per chunk; 4096 * chunk_size must stay below 2^31.

  Returns:
    ``(hi, lo)``, int32 arrays [num_segments, K] with the exact sums
    ``hi * 4096 + lo`` (``0 <= lo < 4096``).
  """
  n = arrays[0].shape[0]
  if n <= chunk_size:
    ids, cols = columns_fn(*arrays)
    return _split(_column_sums(cols, ids, num_segments))

  num_chunks = -(-n // chunk_size)
  local = jnp.arange(chunk_size, dtype=jnp.int32)

  def body(i, carry):
    hi, lo = carry
    first = i * chunk_size
    # The last chunk is shifted back to stay in bounds; the samples the
    # previous chunk already counted go to an extra segment that is dropped.
    start = jnp.minimum(first, n - chunk_size)
    chunk = [jax.lax.dynamic_slice_in_dim(a, start, chunk_size) for a in arrays]
    ids, cols = columns_fn(*chunk)
    ids = jnp.where(start + local >= first, ids, num_segments)
    sums = _column_sums(cols, ids, num_segments + 1)[:num_segments]
    s_hi, s_lo = _split(sums)
    return _normalize(hi + s_hi, lo + s_lo)

  k = jax.eval_shape(
      lambda *a: columns_fn(*a)[1],
      *[jax.ShapeDtypeStruct((chunk_size,) + a.shape[1:], a.dtype) for a in arrays]).shape[0]
  zeros = jnp.zeros((num_segments, k), dtype=jnp.int32)
  return jax.lax.fori_loop(0, num_chunks, body, (zeros, zeros))


def add(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Exact sum of two ``(hi, lo)`` pairs, in canonical form (``0 <= lo < 4096``)."""
  return _normalize(a[0] + b[0], a[1] + b[1])


def canonical(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The canonical ``(hi, lo)`` of an exact sum whose ``lo`` may exceed 4096 (e.g. after a psum)."""
  return _normalize(hi, lo)


def suffix_sums(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact reverse cumulative sums along axis 0: out[b] = sum_{b' >= b} in[b']."""
  hi, lo = _normalize(hi, lo)
  rev = lambda x: jnp.flip(jnp.cumsum(jnp.flip(x, 0), axis=0), 0)
  return _normalize(rev(hi), rev(lo))


def to_float(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """float32 value of the exact integer ``hi * 4096 + lo``."""
  return hi.astype(jnp.float32) * float(1 << _CARRY_BITS) + lo.astype(jnp.float32)


def combine(values: jax.Array, num_digits: int) -> jax.Array:
  """Sum of digit columns [..., num_digits] weighted by 256^-(j+1).

  Adds the least significant digit first, so the float32 result carries a
  relative error of a few ulp.
  """
  total = jnp.zeros(values.shape[:-1], jnp.float32)
  for j in reversed(range(num_digits)):
    total = total + values[..., j] * (_DIGIT_BASE ** -(j + 1))
  return total
