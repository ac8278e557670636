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
Traced scores are left as they are: their order is decided under ``jit``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

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


def _concrete(scores: Any) -> np.ndarray | None:
  """``scores`` as a finite, non-empty NumPy array, or None (tracers, and input the
  checks will refuse and name)."""
  if isinstance(scores, jax.core.Tracer):
    return None
  try:
    x = np.asarray(scores)
  except (TypeError, ValueError):  # ragged or not numeric: the checks name it
    return None
  if x.ndim == 0 or x.shape[-1] == 0 or x.dtype.kind not in "fiu":
    return None
  if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
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


def host_ranked(fn: Callable) -> Callable:
  """``fn(scores, ...)`` with :func:`wide_ranks` applied to the scores first, before the kit's
  entry (``_public.entry``) rounds 64-bit JAX arrays to 32 bits."""
  @functools.wraps(fn)
  def wrapper(scores, *args, **kwargs):
    return fn(wide_ranks(scores), *args, **kwargs)

  return wrapper


def stood_in(fn: Callable) -> Callable:
  """``fn(scores, ...)`` with the scores replaced by :func:`stand_ins` where they need them
  (before the kit's entry, as :func:`host_ranked`)."""
  @functools.wraps(fn)
  def wrapper(scores, *args, **kwargs):
    return fn(stand_ins(scores)[0], *args, **kwargs)

  return wrapper
