"""The random resamples: multinomial indices and Poisson(1) multiplicities from unrolled
Threefry-2x32 rounds (the formulas are in the package docstring), and the maps of a metric
over chunks of resamples."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax._bootstrap._checks import _check_key

# The programs that draw resamples ask XLA:CPU for 512-bit vector code (its default is 256):
# the random bits are 32-bit integer rounds, faster on CPUs with AVX-512 (docs/performance.md);
# elsewhere the vectorizer keeps to the registers the CPU has.
# Other backends ignore the option.
_RESAMPLING = dict(compiler_options={"xla_cpu_prefer_vector_width": 512})

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, r: int) -> jax.Array:
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array):
  """Threefry-2x32 with 20 rounds (Random123), unrolled: uint32 key and counter words."""
  ks = (k0, k1, k0 ^ k1 ^ _PARITY)
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = _rotl(x1, r) ^ x0
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def _mulhi(a: jax.Array, b: jax.Array) -> jax.Array:
  """High 32 bits of the 64-bit product of uint32 ``a`` and ``b`` (16-bit limbs, no x64)."""
  a_lo, a_hi = a & np.uint32(0xFFFF), a >> np.uint32(16)
  b_lo, b_hi = b & np.uint32(0xFFFF), b >> np.uint32(16)
  hi_lo = a_hi * b_lo
  cross = ((a_lo * b_lo) >> np.uint32(16)) + (hi_lo & np.uint32(0xFFFF)) + a_lo * b_hi
  return (hi_lo >> np.uint32(16)) + (cross >> np.uint32(16)) + a_hi * b_hi


def _scale(w0: jax.Array, w1: jax.Array, n: int) -> jax.Array:
  """floor((2^32 w0 + w1) n / 2^64) as int32: a uniform index in [0, n)."""
  m = np.uint32(n)
  a_lo = w0 * m
  s = a_lo + _mulhi(w1, m)
  return (_mulhi(w0, m) + (s < a_lo).astype(jnp.uint32)).astype(jnp.int32)


def _indices_from_seed(seed: jax.Array, n: int) -> jax.Array:
  """The n indices [n] int32 of one resample with seed uint32 [2]."""
  # Two halves joined by a concatenate: the concatenate is materialised, so
  # XLA computes the Threefry rounds once in a vectorised loop instead of
  # fusing (and duplicating) them into each gather that consumes the indices
  # (much slower on CPU).
  half = (n + 1) // 2
  parts = []
  for start, size in ((0, half), (half, n - half)):
    if size:
      counter = jnp.arange(start, start + size, dtype=jnp.uint32)
      w0, w1 = _threefry2x32(seed[0], seed[1], jnp.zeros((), jnp.uint32), counter)
      parts.append(_scale(w0, w1, n))
  return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def _seed(key: jax.Array, b: jax.Array) -> jax.Array:
  return jax.random.bits(jax.random.fold_in(key, b), (2,), jnp.uint32)


def _poisson_thresholds() -> np.ndarray:
  """uint32 [12]: round(2^32 P(X <= k)) for X ~ Poisson(1), k = 0, 1, ..., while below 2^32."""
  out, cdf, k = [], 0.0, 0
  while True:
    cdf += math.exp(-1.0) / math.factorial(k)
    t = round(cdf * 2.0 ** 32)
    if t >= 1 << 32:
      return np.asarray(out, np.uint32)
    out.append(t)
    k += 1


_POISSON_THRESHOLDS = _poisson_thresholds()


def _poisson_from_seed(seed: jax.Array, index: jax.Array,
                       high: jax.Array | None = None) -> jax.Array:
  """Poisson(1) multiplicities [n] int32 of the samples with row numbers ``index`` [n] uint32;
  with ``high`` [n] uint32, of the rows ``2^32 high + index`` (Threefry counter (high, index),
  where rows below 2^32 draw from (0, index): the same multiplicities for those)."""
  high = jnp.zeros((), jnp.uint32) if high is None else high
  w, _ = _threefry2x32(seed[0], seed[1], high, index)
  m = jnp.zeros(index.shape, jnp.int32)
  for t in _POISSON_THRESHOLDS:  # m = #{k : w >= t_k}: the inverse CDF
    m = m + (w >= t).astype(jnp.int32)
  return m


def _poisson_multiplicities(key: Any, rows: Any, num_resamples: int) -> jax.Array:
  """The Poisson-bootstrap multiplicities [num_resamples, n] int32 of the rows ``rows`` [n].

  Resample b gives row r (a global row number, so that shards of a file can be
  resampled apart and merged) the multiplicity

  .. math::

    m_{br} = \\#\\{k : w_{br} \\ge t_k\\}, \\qquad
    w_{br} = \\mathrm{Threefry2x32\\text{-}20}_{(s_0, s_1)}(0, r)_0, \\qquad
    t_k = \\mathrm{round}(2^{32} P(X \\le k)),\\ X \\sim \\mathrm{Poisson}(1),

  with (s_0, s_1) the seed of resample b as in the package docstring: Poisson(1)
  with its probabilities rounded to multiples of 2^-32 (values 0 to 12; the tail
  beyond 12, below 1e-10, is folded into 12).
  """
  rows = np.asarray(rows)
  if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer) or (
      rows.size and (rows.min() < 0 or rows.max() >= 1 << 32)):
    raise ValueError("rows must be a 1-D array of row numbers in [0, 2^32)")
  return _poisson_block_jit(jnp.asarray(rows.astype(np.uint32)), jnp.int32(rows.size),
                            _check_key(key), jnp.uint32(0), int(num_resamples)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("n", "num_resamples"))
def _resample_indices_jit(key, n: int, num_resamples: int) -> jax.Array:
  b = jnp.arange(num_resamples, dtype=jnp.uint32)
  return jax.vmap(lambda i: _indices_from_seed(_seed(key, i), n))(b)


def _resample_indices(key: Any, n: int, num_resamples: int) -> jax.Array:
  """The resample indices [num_resamples, n] int32 that every function here draws for ``key``."""
  return _resample_indices_jit(_check_key(key), int(n), int(num_resamples))


def _map_resamples(g: Callable, arrays: tuple, key: jax.Array, num_resamples: int,
                   chunk_size: int):
  """Stacked g(*[a[I_b] for a in arrays]) over the resamples b: a pytree with leading axis B."""
  n = arrays[0].shape[0]

  def one(b):
    idx = _indices_from_seed(_seed(key, b), n)
    return g(*[a[idx] for a in arrays])

  # Equal chunks of at most chunk_size; the few padding resamples of the last
  # chunk are computed and dropped (a remainder chunk would compile g twice).
  num_chunks = -(-num_resamples // chunk_size)
  size = -(-num_resamples // num_chunks)
  b = jnp.arange(num_chunks * size, dtype=jnp.uint32).reshape(num_chunks, size)
  if size == 1:  # no vmap over a batch of one (its batched form costs more)
    return jax.lax.map(one, b[:, 0])
  out = jax.lax.map(jax.vmap(one), b)
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[:num_resamples], out)


def _map_block(g: Callable, arrays: tuple, key: jax.Array, start: jax.Array, size: int,
               num_chunks: int):
  """As :func:`_map_resamples` for the resamples start, ..., start + num_chunks * size - 1."""
  n = arrays[0].shape[0]

  def one(b):
    idx = _indices_from_seed(_seed(key, b), n)
    return g(*[a[idx] for a in arrays])

  b = (start + jnp.arange(num_chunks * size, dtype=jnp.uint32)).reshape(num_chunks, size)
  if size == 1:
    return jax.lax.map(one, b[:, 0])
  out = jax.lax.map(jax.vmap(one), b)
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)


@functools.partial(jax.jit, static_argnames=("num_chunks",), **_RESAMPLING)
def _poisson_block_jit(source, length, key, start, num_chunks):
  """int8 [num_chunks, n] Poisson multiplicities of the rows ``source`` (0 from ``length``
  on) in resamples start, start + 1, ...

  A call of its own: computed in the same XLA program as the area scan, the random
  bits are fused into the scan's sequential loop and computed sample by sample on
  CPU (several times slower).
  """
  real = jnp.arange(source.shape[0]) < length
  return jax.vmap(lambda b: jnp.where(real, _poisson_from_seed(_seed(key, b), source),
                                      0).astype(jnp.int8))(
      start + jnp.arange(num_chunks, dtype=jnp.uint32))
