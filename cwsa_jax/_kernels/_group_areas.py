"""AURC and AUGRC areas of sorted binary outcomes on NVIDIA GPUs: one Pallas pass, no XLA scans.

After the sort, the tie-grouped areas ("step" and "trapezoid") need, at every
group end ``p`` (1-based position in decreasing confidence order), the errors
so far ``E_p``, the group's first position ``s`` and, for "trapezoid", the
errors before it ``B = E_{s-1}``:

.. math::

  n\\,\\mathrm{AURC} = \\sum_{\\text{ends } p} (p - s + 1)\\, r, \\qquad
  n^2\\,\\mathrm{AUGRC} = \\sum_{\\text{ends } p} (p - s + 1)\\, g,

with ``r = E_p / p`` and ``g = E_p`` ("step"), or their means with the previous
group's ``B / (s - 1)`` and ``B`` ("trapezoid"; ``r`` itself when ``s = 1``).
On a GPU, XLA computes ``E`` and ``s`` as whole-array prefix sums and running
maxima, several passes over n values each. Here one byte per sample (its
error, whether it starts a group, whether it ends one; computed by XLA from the
sorted keys, fused with the sort's output) is read by one kernel, in tiles of
``_ROWS x 32`` samples:

* ``E``: prefix sums along each row of 32 and down the row totals;
* ``s``: within a row, the highest set bit of the running sum of
  ``start << column`` (the bits are distinct, so the sum is their OR:
  ``31 - clz``); across the rows of a tile, a masked maximum over an
  [rows, rows] table (``s`` only grows); ``B`` the same way, by the population
  count of the row's error bits below the start;
* across tiles: per tile the error count, last start and errors before it
  (XLA reductions of the same bytes), carried by exclusive prefix sums and
  maxima over the tiles, a few thousand values.

Integers are exact; each tile sums its terms in float32 and XLA sums the tiles
(the parallel path's values to float32 rounding). Tests run the kernel on the
CPU through Pallas' interpreter (``Kernels(interpret=True)``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _mesh

# Samples per tile: _ROWS rows of 32 (one int32 of bits per row).
_COLUMNS = 32
_ROWS = 64
TILE = _ROWS * _COLUMNS
_NUM_WARPS = 4
CONVENTIONS = ("step", "trapezoid")

# Bits of a sample's byte: its error (bit 0), and whether it starts (bit 1) or ends (bit 2)
# a tie group.
_START_SHIFT, _END_SHIFT = 1, 2


def applies(confidences: jax.Array, correct: jax.Array, convention: str, *,
            kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> bool:
  """Whether the CUDA form takes these samples (static: dtype, length, convention, mesh axes;
  and ``kernels.group_areas``).

  Samples that vary over the mesh axes of an enclosing ``shard_map`` keep the
  scans, as in ``_dense``: the kernel has not been run on a GPU there.
  """
  return (kernels.group_areas and correct.dtype == jnp.bool_
          and confidences.shape[-1] >= 1 and convention in CONVENTIONS and not _mesh.manual_axes(confidences))


def flags(keys: jax.Array, errors: jax.Array, n: int) -> jax.Array:
  """int8 [tiles * TILE]: per sorted sample its error, group start and group end bits.

  ``keys`` [n + 1] are the sorted confidence keys and a padding key that differs
  from every key; ``errors`` [n + 1] the 0/1 errors. Positions past n hold 0.
  """
  key = keys[:n]
  start = jnp.concatenate([jnp.ones((1,), bool), key[1:] != key[:-1]])
  end = key != keys[1:n + 1]
  byte = (errors[:n] | (start.astype(jnp.int32) << _START_SHIFT)
          | (end.astype(jnp.int32) << _END_SHIFT))
  size = -(-n // TILE) * TILE
  return jnp.pad(byte.astype(jnp.int8), (0, size - n))


def error_and_start(byte: jax.Array) -> tuple[jax.Array, jax.Array]:
  """int32 0/1 error and group-start flags of :func:`flags`' bytes."""
  byte = byte.astype(jnp.int32)
  return byte & 1, (byte >> _START_SHIFT) & 1


def _bits_below(bits: jax.Array, local: jax.Array) -> jax.Array:
  """Number of set bits of ``bits`` in columns below ``local`` (0..31)."""
  below = lax.shift_left(jnp.ones_like(local), local) - 1  # 1 << 31 wraps; minus 1 gives 2^31 - 1
  return lax.population_count(bits & below)


def _highest(bits: jax.Array) -> jax.Array:
  """Column (0..31) of the highest set bit of ``bits``; -1 for 0."""
  return 31 - lax.clz(bits)


def _kernel(byte_ref, carry_ref, aurc_ref, augrc_ref, *, convention):
  tile = pl.program_id(0)
  carry = carry_ref[...]  # [4]: errors before the tile, latest start before it, errors before that
  lane = lax.broadcasted_iota(jnp.int32, (4,), 0)
  pick = lambda j: jnp.sum(jnp.where(lane == j, carry, 0))  # noqa: E731 (no scalar indexing)
  errors_in, start_in, before_in = pick(0), pick(1), pick(2)
  byte = byte_ref[...].astype(jnp.int32)  # [_ROWS, 32]
  (error, start), end = error_and_start(byte), (byte >> _END_SHIFT) & 1
  column = lax.broadcasted_iota(jnp.int32, (_ROWS, _COLUMNS), 1)
  row = lax.broadcasted_iota(jnp.int32, (_ROWS, _COLUMNS), 0)
  row_first = tile * TILE + lax.broadcasted_iota(jnp.int32, (_ROWS,), 0) * _COLUMNS + 1
  position = tile * TILE + row * _COLUMNS + column + 1
  # E_p: prefix sums along the rows and down the row totals.
  row_errors = jnp.sum(error, axis=1)
  errors_before_row = errors_in + jnp.cumsum(row_errors) - row_errors  # [_ROWS]
  cum = errors_before_row[:, None] + jnp.cumsum(error, axis=1)
  # s: the latest start at or before p, within the row (bits), in earlier rows, earlier tiles.
  start_bits = lax.shift_left(start, column)
  local = _highest(jnp.cumsum(start_bits, axis=1))
  error_bits = jnp.sum(lax.shift_left(error, column), axis=1)  # [_ROWS]
  row_local = _highest(jnp.sum(start_bits, axis=1))  # [_ROWS]: the row's last start
  row_start = jnp.where(row_local >= 0, row_first + row_local, 0)
  row_before = jnp.where(row_local >= 0,
                         errors_before_row + _bits_below(error_bits, jnp.maximum(row_local, 0)), 0)
  earlier = (lax.broadcasted_iota(jnp.int32, (_ROWS, _ROWS), 1)
             < lax.broadcasted_iota(jnp.int32, (_ROWS, _ROWS), 0))  # [row, earlier row]
  start_rows = jnp.max(jnp.where(earlier, row_start[None, :], 0), axis=1)
  here = local >= 0
  group_start = jnp.maximum(jnp.maximum(start_in, start_rows)[:, None],
                            jnp.where(here, row_first[:, None] + local, 0))
  width = (position - group_start + 1).astype(jnp.float32)
  cumf = cum.astype(jnp.float32)
  risk = cumf / position.astype(jnp.float32)
  closes = end > 0
  zero = jnp.float32(0.0)
  if convention == "step":
    aurc_terms = jnp.where(closes, width * risk, zero)
    augrc_terms = jnp.where(closes, width * cumf, zero)
  else:
    before_rows = jnp.max(jnp.where(earlier, row_before[None, :], 0), axis=1)
    before_here = (errors_before_row[:, None]
                   + _bits_below(error_bits[:, None], jnp.maximum(local, 0)))
    before = jnp.maximum(jnp.maximum(before_in, before_rows)[:, None],
                         jnp.where(here, before_here, 0))
    previous_end = group_start - 1
    beforef = before.astype(jnp.float32)
    previous_risk = jnp.where(previous_end > 0,
                              beforef / jnp.maximum(previous_end, 1).astype(jnp.float32), risk)
    aurc_terms = jnp.where(closes, width * (previous_risk + risk) * 0.5, zero)
    augrc_terms = jnp.where(closes, width * (beforef + cumf) * 0.5, zero)
  aurc_ref[...] = jnp.full((1,), jnp.sum(aurc_terms), jnp.float32)
  augrc_ref[...] = jnp.full((1,), jnp.sum(augrc_terms), jnp.float32)


def _carries(byte: jax.Array) -> jax.Array:
  """int32 [tiles, 4]: per tile the errors, latest start and errors before it, all before the tile."""
  error, start = error_and_start(byte.reshape(-1, TILE))
  index = lax.broadcasted_iota(jnp.int32, error.shape, 1)
  errors = jnp.sum(error, axis=1)
  last = jnp.max(jnp.where(start > 0, index, -1), axis=1)  # the tile's last start, -1 if none
  before_last = jnp.sum(jnp.where(index < last[:, None], error, 0), axis=1)
  errors_in = jnp.cumsum(errors) - errors
  first = lax.iota(jnp.int32, error.shape[0]) * TILE + 1
  exclusive_max = lambda x: jnp.concatenate([jnp.zeros((1,), x.dtype), lax.cummax(x)[:-1]])  # noqa: E731
  start_in = exclusive_max(jnp.where(last >= 0, first + last, 0))
  before_in = exclusive_max(jnp.where(last >= 0, errors_in + before_last, 0))
  return jnp.stack([errors_in, start_in, before_in, jnp.zeros_like(errors)], axis=1)


def area_sums(byte: jax.Array, *, convention: str,
              kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> tuple[jax.Array, jax.Array]:
  """(n AURC, n^2 AUGRC), float32, of :func:`flags`' bytes, ``convention`` "step" or "trapezoid"
  (``kernels.interpret``: through Pallas' interpreter)."""
  from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415 (GPU module, on use)
  if convention not in CONVENTIONS:
    raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
  num_tiles = byte.shape[0] // TILE
  aurc_parts, augrc_parts = pl.pallas_call(
      functools.partial(_kernel, convention=convention),
      out_shape=(jax.ShapeDtypeStruct((num_tiles,), jnp.float32),) * 2,
      grid=(num_tiles,),
      in_specs=[pl.BlockSpec((_ROWS, _COLUMNS), lambda t: (t, 0)),
                pl.BlockSpec((None, 4), lambda t: (t, 0))],
      out_specs=(pl.BlockSpec((1,), lambda t: (t,)),) * 2,
      compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=2),
      interpret=kernels.interpret,
      name="cwsa_group_areas",
  )(byte.reshape(-1, _COLUMNS), _carries(byte))
  return jnp.sum(aurc_parts), jnp.sum(augrc_parts)
