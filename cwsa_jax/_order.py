"""Scores whose order float32 cannot hold, ranked on the host.

The rank metrics sort float32 keys. Two kinds of concrete input lose their
order on the way: 64-bit scores finer than float32 (``1 - 1e-9`` and
``1 - 1e-10`` round to the same float32, so distinct scores become a tie),
and real-valued scores outside [0, 1] (a logit, an energy), which the [0, 1]
keys would clip. Such scores are replaced, per row, by their dense ranks
(:func:`dense_ranks`; equal values share a rank) before the jitted kernels
run, so the order the metrics see is the input's own.

Two forms of the ranks: int32 ranks (``_ranking``'s keys), and float32
*stand-ins* in (0, 1) whose bits are ``2^23 + rank`` (normal floats, ordered
like the ranks, no flushing of subnormals) for the kernels that read [0, 1]
confidences (``_risk_coverage``): they order and tie exactly like the scores.

Traced scores (inside a user's ``jit`` or ``vmap``) get the same stand-ins in the
program (:func:`traced_stand_ins`): one sort of int32 order keys per row gives
the dense ranks. The program takes that branch at run time, only where some
finite score lies outside [0, 1] (``lax.cond`` on that predicate, over every row
of the call), so [0, 1] scores run the program they always ran, bit for bit;
under ``vmap`` the predicate is batched and the ``cond`` becomes a ``select``:
both branches run (the sort included) and each mapped row takes its own. NaN
and infinite scores are kept as they are, for the checks to flag (NaN results).
Inside ``jit`` the order is float32's (64-bit tracers are rounded first, as the
kit's entry rounds them); int32 and narrower integers keep their own order.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _mesh
from cwsa_jax import _public
from cwsa_jax._kernels import _dispatch
from cwsa_jax._kernels import _sort

# Dtypes whose order float32 (or int32) cannot hold.
WIDE = frozenset(np.dtype(d) for d in (np.float64, np.longdouble, np.int64, np.uint32,
                                       np.uint64))
_SMALLEST_NORMAL_BITS = 1 << 23  # float32 2^-126
# Stand-ins stay below 1.0 (bits 0x3F800000): at most this many distinct scores per row.
MAX_DISTINCT = 0x3F800000 - _SMALLEST_NORMAL_BITS


def dense_ranks(x: np.ndarray) -> np.ndarray:
  """int32 dense ranks of ``x`` [..., n] along its last axis (equal values, -0.0 and 0.0
  included, share a rank)."""
  return _ranked(x)[0]


def _ranked(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(ranks, ordered, sorted_ranks)`` from one sort of ``x`` [..., n]: the dense ranks
  (:func:`dense_ranks`), ``x`` sorted per row and the rank at each sorted position."""
  order = np.argsort(x, axis=-1)
  ordered = np.take_along_axis(x, order, axis=-1)
  new = ordered[..., 1:] != ordered[..., :-1]
  sorted_ranks = np.zeros(x.shape, np.int32)
  np.cumsum(new, axis=-1, dtype=np.int32, out=sorted_ranks[..., 1:])
  ranks = np.empty_like(sorted_ranks)
  np.put_along_axis(ranks, order, sorted_ranks, axis=-1)
  return ranks, ordered, sorted_ranks


def _real(dtype: Any) -> bool:
  """Whether ``dtype`` holds real numbers (NumPy's kinds, and ml_dtypes' floats such as
  bfloat16, whose kind is "V")."""
  dtype = np.dtype(dtype)
  return dtype.kind in "fiu" or bool(jnp.issubdtype(dtype, jnp.floating))


def _concrete(scores: Any) -> np.ndarray | None:
  """``scores`` as a finite, non-empty NumPy array, or None (tracers, and input the
  checks will refuse and name)."""
  if isinstance(scores, jax.core.Tracer):
    return None
  try:
    x = np.asarray(scores)
  except (TypeError, ValueError):  # ragged or not numeric: the checks name it
    return None
  if x.ndim == 0 or x.shape[-1] == 0 or not _real(x.dtype):
    return None
  if x.dtype.kind not in "iu" and not np.all(np.isfinite(x)):
    return None
  return x


def wide_ranks(scores: Any) -> Any:
  """Concrete scores of a :data:`WIDE` dtype as int32 dense ranks; anything else as it is."""
  if isinstance(scores, jax.Array) and np.dtype(scores.dtype) not in WIDE:
    return scores  # no copy to the host and finiteness scan for what needs no ranks
  x = _concrete(scores)
  if x is None or x.dtype not in WIDE:
    return scores
  return dense_ranks(x)


def needs_stand_ins(x: np.ndarray) -> bool:
  """Whether float32 [0, 1] keys would lose the order of concrete scores ``x``: a wide dtype,
  or values outside [0, 1]."""
  return x.dtype in WIDE or bool(np.any(x < 0) or np.any(x > 1))


def _in_unit_interval(x: jax.Array) -> bool:
  """Whether a concrete JAX array's values all lie in [0, 1] or are NaN (left for the
  checks): one reduction where the array lives, no copy to the host."""
  with jax.ensure_compile_time_eval():  # also for a constant of a user's jit
    low, high = float(jax.numpy.nanmin(x)), float(jax.numpy.nanmax(x))
  return not (low < 0 or high > 1)


def stand_ins(scores: Any, *, with_values: bool = False) -> tuple[Any, np.ndarray | None]:
  """``(stand-ins, values)``: float32 stand-ins [..., n] in (0, 1) that order and tie like
  concrete ``scores`` that need them, and with ``with_values`` (the curve, which maps its
  thresholds back) ``values`` [..., n], the scores as float32 in increasing order per row
  (where stand-in ``2^23 + r`` has value ``values[..., r]``), else None;
  ``(scores, None)`` for anything else (left for the checks and the kernels)."""
  if (isinstance(scores, jax.Array) and not isinstance(scores, jax.core.Tracer)
      and np.dtype(scores.dtype) not in WIDE and scores.size
      and jax.numpy.issubdtype(scores.dtype, jax.numpy.floating)
      and _in_unit_interval(scores)):
    return scores, None  # the common case: checked where it lives
  x = _concrete(scores)
  if x is None or x.dtype.kind == "b" or not needs_stand_ins(x):
    return scores, None
  ranks, ordered, sorted_ranks = _ranked(x)
  if ranks.size and int(ranks.max()) >= MAX_DISTINCT:
    raise ValueError(f"scores take at most {MAX_DISTINCT} distinct values per row, got "
                     f"{int(ranks.max()) + 1}")
  bits = ranks + np.int32(_SMALLEST_NORMAL_BITS)
  values = _values_by_rank(ordered, sorted_ranks) if with_values else None
  return bits.view(np.float32), values


def _values_by_rank(ordered: np.ndarray, sorted_ranks: np.ndarray) -> np.ndarray:
  """float32 [..., n]: entry r of a row is its r-th smallest distinct value (the rest repeat
  the largest), from the sorted scores and the rank at each sorted position (:func:`_ranked`).
  A group holding both -0.0 and 0.0 takes the zero the sort put last (they compare equal)."""
  out = np.empty(ordered.shape, np.float32)
  out[...] = ordered[..., -1:].astype(np.float32)
  np.put_along_axis(out, sorted_ranks, ordered.astype(np.float32), axis=-1)
  return out


def values_of(stand_in: np.ndarray, values: np.ndarray) -> np.ndarray:
  """The scores' float32 values at ``stand_in`` [..., m] (stand-ins of the same rows)."""
  rank = np.asarray(stand_in, np.float32).view(np.int32) - _SMALLEST_NORMAL_BITS
  return np.take_along_axis(values, np.clip(rank, 0, values.shape[-1] - 1), axis=-1)


# --------------------------------------------------------------------------
# Traced scores: the same stand-ins, in the program
# --------------------------------------------------------------------------


def order_keys(scores: jax.Array) -> jax.Array:
  """int32 keys that order like ``scores`` [..., n] (any finite values; ties stay ties).

  Integers up to 32 bits are their own keys. Float32: the bit pattern, which
  orders non-negative floats like their values; for negative ones the low 31
  bits are flipped so that a larger magnitude gives a smaller key; -0.0 is
  0.0 first; subnormals keep their order. No derivative (the results are step
  functions of the scores).
  """
  if scores.dtype == jnp.uint32:
    return lax.bitcast_convert_type(scores ^ jnp.uint32(1 << 31), jnp.int32)
  if jnp.issubdtype(scores.dtype, jnp.integer):
    return scores.astype(jnp.int32)
  bits = lax.bitcast_convert_type(lax.stop_gradient(scores).astype(jnp.float32), jnp.int32)
  # On the bits, not the values: XLA:CPU flushes subnormals, so ``x == 0`` would tie them with 0.
  bits = jnp.where(bits == jnp.int32(-2**31), 0, bits)  # -0.0
  return jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


class TracedStandIns(NamedTuple):
  """Traced scores as the rank kernels take them (:func:`traced_stand_ins`).

  Attributes:
    scores: float32 [..., n]: the stand-ins where ``taken``, else the scores as float32
      (unchanged for float32 scores); NaN and infinite scores as they are in both.
    values: float32 [..., n] (with ``with_values``, else None): entry r of a row is its r-th
      smallest distinct score, where ``taken`` (stand-in ``2^23 + r`` has value ``values[r]``).
    taken: bool [] (batched under ``vmap``): whether the stand-ins were taken.
  """
  scores: jax.Array
  values: jax.Array | None
  taken: jax.Array


def _row_stand_ins(x: jax.Array, *, with_values: bool, kernels: _dispatch.Kernels):
  """float32 stand-ins [n] of one row's scores ``x`` [n] (float32 or integer), and with
  ``with_values`` its distinct values by rank [n] (zeros otherwise): one stable sort of the
  order keys; a rank counts the key changes before a sample's sorted position."""
  n = x.shape[-1]
  sorted_keys, order = _sort.sort_with_order(order_keys(x), kernels=kernels)
  new = sorted_keys[1:] != sorted_keys[:-1]
  sorted_ranks = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                                  _sort.cumsum(new.astype(jnp.int32), kernels=kernels)])
  ranks = jnp.zeros((n,), jnp.int32).at[order].set(sorted_ranks, unique_indices=True)
  stand_in = lax.bitcast_convert_type(ranks + jnp.int32(_SMALLEST_NORMAL_BITS), jnp.float32)
  x32 = x.astype(jnp.float32)
  if jnp.issubdtype(x.dtype, jnp.floating):
    stand_in = jnp.where(jnp.isfinite(x32), stand_in, x32)  # left for the checks: NaN results
  if not with_values:
    return stand_in, jnp.zeros((n,), jnp.float32)
  # Each group's first sorted position writes its value at its rank (distinct indices); the
  # entries past the last rank are never read (stand-ins of the row hold ranks below it).
  first = jnp.concatenate([jnp.ones((1,), bool), new])
  slot = jnp.where(first, sorted_ranks, n)
  values = jnp.zeros((n,), jnp.float32).at[slot].set(jnp.take(x32, order), mode="drop",
                                                     unique_indices=True)
  return stand_in, values


@_public.entry
def _in_program(scores: jax.Array, with_values: bool,
                kernels: _dispatch.Kernels) -> TracedStandIns:
  """:func:`traced_stand_ins` in the kit's conventions (64-bit tracers rounded, x64 off)."""
  floating = jnp.issubdtype(scores.dtype, jnp.floating)
  x = scores.astype(jnp.float32) if floating and scores.dtype != jnp.float32 else scores
  outside = (x < 0) | (x > 1)
  if floating:
    outside = outside & jnp.isfinite(x)
  n = x.shape[-1]
  if n > MAX_DISTINCT:
    raise ValueError(f"scores take at most {MAX_DISTINCT} distinct values per row, got rows "
                     f"of {n} samples")

  def stood(x):
    fn = functools.partial(_row_stand_ins, with_values=with_values, kernels=kernels)
    for _ in range(x.ndim - 1):
      fn = jax.vmap(fn)
    return _mesh.vary_like(fn(x), x)

  def plain(x):  # the scores as the checks would convert them (float32 stays as it is)
    x32 = x if x.dtype == jnp.float32 else x.astype(jnp.float32)
    return _mesh.vary_like((x32, jnp.zeros(x.shape, jnp.float32)), x)

  taken = jnp.any(outside)
  stand_in, values = lax.cond(taken, stood, plain, x)
  return TracedStandIns(stand_in, values if with_values else None, taken)


def traced_stand_ins(scores: Any, *, with_values: bool = False,
                     kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> TracedStandIns | None:
  """:class:`TracedStandIns` of traced float or integer ``scores`` [..., n]: in the program,
  the stand-ins of :func:`stand_ins` where some finite score lies outside [0, 1] (one sort per
  row), else the scores; None for anything else (concrete values, other dtypes, shapes the
  checks refuse: left for the checks and :func:`stand_ins`).

  ``lax.cond`` picks the branch at run time, one predicate for the whole array (the eager
  rule); under ``vmap`` it becomes a ``select`` and both branches run.
  """
  if not isinstance(scores, jax.core.Tracer):
    return None
  if not _real(scores.dtype) or scores.ndim == 0 or scores.shape[-1] == 0:
    return None
  return _in_program(scores, with_values, kernels)


def traced_values_of(thresholds: jax.Array, stood: TracedStandIns) -> jax.Array:
  """The scores' float32 values at ``thresholds`` [..., m] (stand-ins of the rows of
  :func:`traced_stand_ins` with ``with_values``) where the stand-ins were taken; the
  thresholds themselves elsewhere, and NaN (an invalid row) stays NaN."""
  values = stood.values
  rank = lax.bitcast_convert_type(thresholds, jnp.int32) - jnp.int32(_SMALLEST_NORMAL_BITS)
  rank = jnp.clip(rank, 0, values.shape[-1] - 1)
  mapped = jnp.take_along_axis(values, rank, axis=-1)
  return jnp.where(stood.taken & ~jnp.isnan(thresholds), mapped, thresholds)


# --------------------------------------------------------------------------
# Decorators
# --------------------------------------------------------------------------


def host_ranked(fn: Callable) -> Callable:
  """``fn(scores, ...)`` with :func:`wide_ranks` applied to the scores first, before the kit's
  entry (``_public.entry``) rounds 64-bit JAX arrays to 32 bits."""
  @functools.wraps(fn)
  def wrapper(scores, *args, **kwargs):
    return fn(wide_ranks(scores), *args, **kwargs)

  return wrapper


def stood_in(fn: Callable) -> Callable:
  """``fn(scores, ...)`` with the scores replaced by :func:`stand_ins` where they need them,
  or for traced scores by :func:`traced_stand_ins` (before the kit's entry, as
  :func:`host_ranked`)."""
  @functools.wraps(fn)
  def wrapper(scores, *args, **kwargs):
    traced = traced_stand_ins(scores)
    return fn(stand_ins(scores)[0] if traced is None else traced.scores, *args, **kwargs)

  return wrapper
