"""From resampled values to results: the result types, NumPy's linear percentiles with NaNs
left out, the paired bootstrap's p-value and exact differences."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class BootstrapResult(NamedTuple):
  """Percentile bootstrap interval: every field has the structure of ``fn``'s output."""
  estimate: Any
  low: Any
  high: Any


class PairedBootstrapResult(NamedTuple):
  """Paired bootstrap of fn(a) - fn(b); every field has the structure of ``fn``'s output."""
  estimate_a: Any
  estimate_b: Any
  difference: Any
  low: Any
  high: Any
  p_value: Any


def _as_float(x: jax.Array) -> jax.Array:
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _nanquantiles(x: jax.Array, q: jax.Array) -> jax.Array:
  """NumPy's default ("linear") quantiles [len(q), ...] over axis 0, NaNs left out.

  With the m values that are not NaN sorted, x_(0) <= ... <= x_(m-1), and
  h = (m - 1) q: Q_q = x_(j) + t (x_(j+1) - x_(j)), j = floor h, t = h - j, or
  x_(j+1) - (1 - t)(x_(j+1) - x_(j)) for t >= 1/2, as NumPy interpolates. Unlike
  ``jnp.nanquantile``'s ``(1 - t) x_(j) + t x_(j+1)``, this is exact when
  x_(j) = x_(j+1): a value constant over the resamples (a sweep's thresholds)
  is its own interval, whatever the compiler contracts into fused multiply-adds.
  NaN where every value is NaN.
  """
  s = jnp.sort(x, axis=0)  # NaN last
  m = jnp.sum(~jnp.isnan(x), axis=0)
  last = jnp.maximum(m, 1) - 1  # index of x_(m-1) (0 for an all-NaN column)
  h = last.astype(x.dtype) * q.reshape((-1,) + (1,) * (x.ndim - 1))
  j = jnp.floor(h)
  t = h - j
  j = j.astype(jnp.int32)
  a = jnp.take_along_axis(s, j, axis=0)
  b = jnp.take_along_axis(s, jnp.minimum(j + 1, last), axis=0)
  d = b - a
  value = jnp.where(t >= 0.5, b - d * (1 - t), a + d * t)
  return jnp.where(m > 0, value, jnp.nan)


def _percentiles(samples, level):
  """(low, high) pytrees: nan-aware linear-interpolation quantiles over axis 0."""
  q = jnp.stack([(1.0 - level) / 2.0, (1.0 + level) / 2.0]).astype(jnp.float32)
  bounds = jax.tree.map(lambda s: _nanquantiles(_as_float(s), q), samples)
  low = jax.tree.map(lambda x: x[0], bounds)
  high = jax.tree.map(lambda x: x[1], bounds)
  return low, high


def _p_value(d: jax.Array) -> jax.Array:
  """Two-sided bootstrap p-value of H0: difference = 0 from resampled differences [B, ...]."""
  d = _as_float(d)
  valid = ~jnp.isnan(d)
  num = jnp.sum(valid, axis=0).astype(jnp.float32)
  below = jnp.sum(valid & (d <= 0), axis=0).astype(jnp.float32)
  above = jnp.sum(valid & (d >= 0), axis=0).astype(jnp.float32)
  p = jnp.minimum(1.0, 2.0 * jnp.minimum(1.0 + below, 1.0 + above) / (1.0 + num))
  return jnp.where(num > 0, p, jnp.nan)


def _subtract(x: jax.Array, y: jax.Array) -> jax.Array:
  """x - y, exactly 0 where x == y: XLA may fuse the metrics' last multiply into the
  subtraction as a fused multiply-add, and a*c - b*c with a == b then comes out as an ulp."""
  x, y = _as_float(x), _as_float(y)
  return jnp.where(x == y, jnp.zeros((), x.dtype), x - y)


@jax.jit
def _interval_jit(samples, level):
  return _percentiles(samples, level)


@jax.jit
def _paired_interval_jit(samples, level):
  low, high = _percentiles(samples, level)
  return low, high, jax.tree.map(_p_value, samples)


@jax.jit
def _differences_jit(a, b):
  return jax.tree.map(_subtract, a, b)
