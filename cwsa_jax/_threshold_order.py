"""Float64 confidences compared with thresholds in their own precision, by float32 stand-ins.

The kernels compare float32 confidences with float32 thresholds. Rounding is
monotone, so ``c >= t`` in float64 implies ``float32(c) >= float32(t)``; the
only decisions float32 gets wrong are the converse ones: ``c < t`` while
``float32(c) = float32(t)`` (``c = 0.5 - 1e-9``, ``t = 0.5``). For concrete
float64 confidences (NumPy arrays, Python lists of floats, JAX arrays under
``jax_enable_x64``) each confidence is therefore replaced, on the host, by a
float32 *stand-in* before the kit's entry rounds it:

.. math::

  m_i = \\#\\{ j : t_j \\le c_i \\}, \\qquad
  s_i = \\mathrm{clip}\\bigl(\\mathrm{f32}(c_i),\\;
        \\mathrm{f32}(t_{(m_i)}),\\;
        \\mathrm{nextafter}(\\mathrm{f32}(t_{(m_i + 1)}), -\\infty)\\bigr)

over the thresholds sorted, ``t`` taken in float64 (a Python float keeps its
value). Then ``s_i >= f32(t_j)`` exactly when ``c_i >= t_j``, for every j, and
``s_i`` differs from ``f32(c_i)`` by at most one float32 ulp. No stand-in
exists when two distinct thresholds round to the same float32 with a
confidence between them: ``ValueError``, naming them.

Equal-mass bin edges are order statistics of the data itself
(:func:`mass_stand_ins`): there the stand-ins only need to keep the float64
bins apart, each bin boundary one float32 step up from the bin below, so a
cluster that float32 merges moves by at most ``num_bins - 1`` ulp.

Float32 (and narrower) confidences are left as they are, whatever the
thresholds' dtype: their results stay bit for bit. Traced values are left as
they are too: inside ``jit`` (x64 off) the inputs are float32 already.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import numpy as np


def wide_floats(x: Any) -> np.ndarray | None:
  """Concrete confidences of a float dtype wider than float32 as a float64 NumPy array
  [..., n] (None for anything else: tracers, float32, integers, input the checks refuse)."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, (np.ndarray, jax.Array, np.generic)):
    dtype = np.dtype(x.dtype)  # no conversion for the usual float32 arrays
    if dtype.kind != "f" or dtype.itemsize <= 4:
      return None
  try:
    v = np.asarray(x)
  except (TypeError, ValueError):  # ragged or not numeric: the checks name it
    return None
  if v.dtype.kind != "f" or v.dtype.itemsize <= 4 or v.ndim == 0 or v.size == 0:
    return None
  v = v.astype(np.float64, copy=False)
  if not (np.all(v >= 0.0) and np.all(v <= 1.0)):  # NaN too: left for the checks
    return None
  return v


def thresholds64(t: Any) -> np.ndarray | None:
  """Concrete thresholds in [0, 1) as float64 (None: traced, or left for the checks)."""
  if isinstance(t, jax.core.Tracer):
    return None
  try:
    v = np.asarray(t, np.float64)
  except (TypeError, ValueError):
    return None
  if v.size == 0 or not (np.all(v >= 0.0) and np.all(v < 1.0)):
    return None
  return v


def stand_ins(c: np.ndarray, t: np.ndarray, *, name: str = "thresholds") -> np.ndarray:
  """float32 stand-ins [..., n] of float64 confidences ``c`` [..., n] for float64 thresholds
  ``t`` ([T] shared, or [..., T] per row): ``s >= float32(t_j)`` exactly when ``c >= t_j``
  (see the module). ``name`` names the thresholds in the error."""
  t = np.sort(np.asarray(t, np.float64), axis=-1)
  t32 = t.astype(np.float32)
  if t.ndim == 1:
    m = np.searchsorted(t, c, side="right")
  else:  # a grid per row (equal-mass edges of a batch)
    flat_t, flat_c = t.reshape(-1, t.shape[-1]), c.reshape(-1, c.shape[-1])
    m = np.stack([np.searchsorted(r, x, side="right") for r, x in zip(flat_t, flat_c)])
    m = m.reshape(c.shape)
  pad = np.ones(t32.shape[:-1] + (1,), np.float32)
  # low[m]: the largest threshold at or below c; high[m]: just below the next one.
  low = np.concatenate([-np.inf * pad, t32], axis=-1)
  high = np.concatenate([np.nextafter(t32, np.float32(-np.inf)), np.inf * pad], axis=-1)
  if t.ndim == 1:
    low, high = low[m], high[m]
  else:
    low = np.take_along_axis(np.broadcast_to(low, c.shape[:-1] + low.shape[-1:]), m, axis=-1)
    high = np.take_along_axis(np.broadcast_to(high, c.shape[:-1] + high.shape[-1:]), m, axis=-1)
  bad = (high < low) | (high < 0)
  if bad.any():
    i = np.unravel_index(np.argmax(bad), bad.shape)
    row = t if t.ndim == 1 else t[i[:-1]]
    j = int(m[i])
    below = f"{float(row[j - 1])!r} and " if j > 0 else "0 and "
    raise ValueError(
        f"confidence {float(c[i])!r} lies between {name} {below}{float(row[j])!r}, which float32 "
        f"rounds to the same value {float(np.float32(row[j]))!r}: the float32 kernels cannot "
        f"keep both comparisons (merge the {name}, or round the inputs to float32 first)")
  return np.clip(c.astype(np.float32), low, high)


def mass_stand_ins(c: np.ndarray, num_bins: int) -> np.ndarray:
  """float32 stand-ins [..., n] of float64 confidences ``c`` whose equal-mass bins (order
  statistics ``e_j = s_(ceil(j n / B))`` as edges, ``e_j <= c < e_{j+1}``) are those of ``c``.

  Sorted per row, a stand-in is ``min(f32(c_i), next stand-in)``, one float32 step lower
  where the next sample lies in a higher float64 bin: a reverse cumulative minimum of
  ``bits(f32(c)) - D`` plus ``D``, with D the number of bin boundaries passed. Ties stay
  ties, the order is kept, and each boundary is a strict float32 step.
  """
  n = c.shape[-1]
  order = np.argsort(c, axis=-1, kind="stable")
  s = np.take_along_axis(c, order, axis=-1)
  # As the kernel's order statistics: ceil(j n / B), clamped to the last sample.
  positions = np.minimum([-(-j * n // num_bins) for j in range(1, num_bins)], n - 1)
  edges = s[..., positions]
  flat_e, flat_s = edges.reshape(-1, edges.shape[-1]), s.reshape(-1, n)
  bins = np.stack([np.searchsorted(e, x, side="right") for e, x in zip(flat_e, flat_s)])
  steps = np.zeros(flat_s.shape, np.int64)
  np.cumsum(bins[:, 1:] != bins[:, :-1], axis=-1, out=steps[:, 1:])
  # + 0.0 makes -0.0 a +0.0, whose int32 bits (0) order with the other non-negative floats.
  bits = (flat_s.astype(np.float32) + np.float32(0)).view(np.int32).astype(np.int64) - steps
  bits = np.minimum.accumulate(bits[:, ::-1], axis=-1)[:, ::-1] + steps
  if (bits < 0).any():
    raise ValueError("confidences below float32's smallest value fall in different equal-mass "
                     "bins: float32 cannot keep them apart (round the inputs to float32 first)")
  out = np.empty(c.shape, np.float32)
  np.put_along_axis(out, order, bits.astype(np.int32).view(np.float32).reshape(c.shape), axis=-1)
  return out


def width_edges(num_bins: int) -> np.ndarray:
  """float64 interior equal-width edges ``j / B``, j = 1..B-1 (the thresholds of width bins)."""
  return np.arange(1, num_bins, dtype=np.float64) / num_bins


def kept(stand_ins_of: Callable[[np.ndarray, dict], np.ndarray | None], *,
         argument: str = "confidences") -> Callable:
  """``fn(confidences, ...)`` with float64 confidences replaced by their stand-ins.

  ``stand_ins_of(c64, arguments)`` gets the float64 values of the first argument (named
  ``argument``) and ``fn``'s bound arguments (defaults applied) and returns float32
  stand-ins, or None to leave them. Outside the kit's entry (``_public.entry``), which
  rounds 64-bit JAX arrays to 32 bits.
  """
  def decorator(fn):
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      c64 = wide_floats(args[0] if args else kwargs.get(argument))
      if c64 is None:
        return fn(*args, **kwargs)
      try:
        bound = signature.bind(*args, **kwargs)
      except TypeError:  # fn names the problem
        return fn(*args, **kwargs)
      bound.apply_defaults()
      new = stand_ins_of(c64, bound.arguments)
      if new is None:
        return fn(*args, **kwargs)
      confidences = bound.arguments[argument]
      if isinstance(confidences, jax.Array):  # back where it was (device, sharding)
        new = jax.device_put(new, confidences.sharding)
      bound.arguments[argument] = new
      return fn(*bound.args, **bound.kwargs)

    return wrapper

  return decorator


def at(name: str, default: Callable[[], Any] | None = None) -> Callable:
  """:func:`kept` for thresholds in argument ``name`` (a scalar or [T]; ``default()`` when
  it is None)."""
  def stand_ins_of(c64, arguments):
    value = arguments.get(name)
    if value is None and default is not None:
      value = default()
    t = thresholds64(value)
    if t is None:
      return None
    return stand_ins(c64, t.reshape(-1), name=name)

  return kept(stand_ins_of)
