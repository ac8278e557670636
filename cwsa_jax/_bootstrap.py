"""Bootstrap confidence intervals for any metric, and a paired bootstrap test.

Resample b (b = 0, ..., B - 1) draws n indices with replacement,
I_b = (i_{b1}, ..., i_{bn}) with i_{bj} uniform on {0, ..., n - 1}, and
evaluates the metric on the resampled data:

.. math::

  \\hat\\theta = f(c, \\kappa), \\qquad
  \\theta^*_b = f(c_{I_b}, \\kappa_{I_b}),

and the percentile interval at level 1 - alpha is
[Q_{alpha/2}, Q_{1 - alpha/2}] of the theta*_b.

``fn`` is ``jax.vmap``-ed over a chunk of at most ``chunk_size`` resamples and
the chunks run one after another (``jax.lax.map``), so the resampled data held
at once is ``chunk_size * n`` values, never ``B * n``; only the B metric values
are kept. The chunks run in blocks of about ``BLOCK_ELEMENTS`` resampled values,
one jitted call per block in a host loop (well under a second each at the
command line's sizes): Python sees a Ctrl-C only between calls into XLA, and
:func:`reporting` can show progress. Called under a transformation (``jit``,
``vmap``), everything is one call. The values do not depend on the blocks.

Random indices. Resample b uses the seed (s_0, s_1) = 64 random bits of
``jax.random.fold_in(key, b)``, so its indices depend on (key, b, n) only: not
on ``chunk_size`` or ``num_resamples`` (the first 100 resamples of a
1000-resample run are those of a 100-resample run). Index j of the
resample is

.. math::

  (w_0, w_1) = \\mathrm{Threefry2x32\\text{-}20}_{(s_0, s_1)}(0, j), \\qquad
  i_{bj} = \\left\\lfloor \\frac{(2^{32} w_0 + w_1)\\, n}{2^{64}} \\right\\rfloor,

where Threefry-2x32 with 20 rounds is the counter-based generator behind
``jax.random``'s default keys (Salmon et al., SC 2011), and the 64-bit
multiply-shift map (Lemire, 2019) gives every index probability 1/n to
within a relative n/2^64. Computing the bits here, unrolled, one Threefry
block per index, is cheaper on CPU than ``jax.random.randint`` (two blocks per
index, in a rolled loop); ``benchmarks/bench_bootstrap.py`` measures it.
:func:`_resample_indices` returns the indices, for tests.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import math
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax import lax

from cwsa_jax import _calibration
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax import _risk_coverage
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation

# Elements (chunk_size * n) per chunk when chunk_size is None: resamples of a
# small test set are batched, one of n >= 65536 samples runs alone.
DEFAULT_CHUNK_ELEMENTS = 1 << 16
# Resampled values per jitted call of the host loop (whole chunks, at least one).
BLOCK_ELEMENTS = 1 << 20
# bootstrap_evaluation's cheaper resamples: more per call, so that the buffers of
# one call serve several resamples of a large test set (Poisson: its int8
# multiplicities, one byte per resampled value, are held for the whole block).
EVALUATION_BLOCK_ELEMENTS = 1 << 26
POISSON_BLOCK_ELEMENTS = 1 << 24
# Blocks of resamples computed at once, on host threads: two cores' worth.
BLOCKS_IN_FLIGHT = 2

# The programs that draw resamples ask XLA:CPU for 512-bit vector code (its default is 256):
# the random bits are 32-bit integer rounds, faster on CPUs with AVX-512 (docs/performance.md);
# elsewhere the vectorizer keeps to the registers the CPU has.
# Other backends ignore the option.
_RESAMPLING = dict(compiler_options={"xla_cpu_prefer_vector_width": 512})

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


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


def _poisson_from_seed(seed: jax.Array, index: jax.Array) -> jax.Array:
  """Poisson(1) multiplicities [n] int32 of the samples with row numbers ``index`` [n] uint32."""
  w, _ = _threefry2x32(seed[0], seed[1], jnp.zeros((), jnp.uint32), index)
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

  with (s_0, s_1) the seed of resample b as in the module docstring: Poisson(1)
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


def _as_float(x: jax.Array) -> jax.Array:
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


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


_REPORT: contextvars.ContextVar[Callable[[int], Any] | None] = contextvars.ContextVar(
    "cwsa_jax_bootstrap_report", default=None)


@contextlib.contextmanager
def reporting(callback: Callable[[int], Any]) -> Iterator[None]:
  """Calls ``callback(k)`` each time k more resamples are done by a bootstrap in this block
  (the command line's progress bars)."""
  token = _REPORT.set(callback)
  try:
    yield
  finally:
    _REPORT.reset(token)


def _traced(*values: Any) -> bool:
  return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def _run_blocks(block: Callable, num_resamples: int, chunk_size: int, n: int, *,
                block_elements: int | None = None):
  """``block(start, size, num_chunks)`` over the resamples, joined [B, ...].

  The chunks (``size`` resamples each, as in :func:`_map_resamples`) are grouped
  in blocks of about ``BLOCK_ELEMENTS`` resampled values. Up to
  :data:`BLOCKS_IN_FLIGHT` blocks run at once on host threads (each block's
  loop over its chunks is sequential, so two use two cores); blocks start in
  order and are joined in order, so the result does not depend on the timing,
  and a KeyboardInterrupt is raised within about one block.
  """
  num_chunks = -(-num_resamples // chunk_size)
  size = -(-num_resamples // num_chunks)
  per_block = max(1, min(num_chunks, (block_elements or BLOCK_ELEMENTS) // (size * n)))
  report = _REPORT.get()
  starts = list(range(0, num_chunks, per_block))
  # (The host threads run with the caller's 64-bit mode: JAX's settings are per thread.)
  run = _public.in_caller_mode(
      lambda first: jax.block_until_ready(block(jnp.uint32(first * size), size, per_block)))
  parts, done = [], 0

  def collect(future) -> None:  # the oldest block, in order
    nonlocal done
    parts.append(future.result())
    if report is not None:
      now = min(num_resamples, len(parts) * per_block * size)
      report(now - done)
      done = now

  with concurrent.futures.ThreadPoolExecutor(BLOCKS_IN_FLIGHT) as pool:
    pending = collections.deque()
    try:
      for first in starts:
        pending.append(pool.submit(run, first))
        if len(pending) == BLOCKS_IN_FLIGHT:
          collect(pending.popleft())
      while pending:
        collect(pending.popleft())
    except BaseException:
      for future in pending:
        future.cancel()
      raise
  return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:num_resamples], *parts)


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


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _samples_jit(fn, confidences, correct, key, num_resamples, chunk_size):
  return _map_resamples(fn, (confidences, correct), key, num_resamples, chunk_size)


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _ci_jit(fn, confidences, correct, key, level, num_resamples, chunk_size):
  estimate = fn(confidences, correct)
  samples = _map_resamples(fn, (confidences, correct), key, num_resamples, chunk_size)
  return BootstrapResult(estimate, *_percentiles(samples, level))


def _pair_fn(fn: Callable, same_dtype: bool) -> Callable:
  """(c_a, k_a, c_b, k_b) -> (fn(a), fn(b)).

  When the two models' arrays share dtypes, fn is vmapped over the stacked
  pair: both run the same compiled code, so identical models give exactly
  identical values (two separate calls may round differently after fusion).
  """
  def pair(ca, ka, cb, kb):
    if same_dtype:
      out = jax.vmap(fn)(jnp.stack([ca, cb]), jnp.stack([ka, kb]))
      out = jax.tree.map(lambda x: x[0], out), jax.tree.map(lambda x: x[1], out)
    else:
      out = fn(ca, ka), fn(cb, kb)
    return out
  return pair


def _subtract(x: jax.Array, y: jax.Array) -> jax.Array:
  """x - y, exactly 0 where x == y: XLA may fuse the metrics' last multiply into the
  subtraction as a fused multiply-add, and a*c - b*c with a == b then comes out as an ulp."""
  x, y = _as_float(x), _as_float(y)
  return jnp.where(x == y, jnp.zeros((), x.dtype), x - y)


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _paired_jit(fn, c_a, k_a, c_b, k_b, key, level, num_resamples, chunk_size):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)
  est_a, est_b = pair(c_a, k_a, c_b, k_b)
  difference = jax.tree.map(_subtract, est_a, est_b)

  def diff(*arrays):
    return jax.tree.map(_subtract, *pair(*arrays))

  samples = _map_resamples(diff, (c_a, k_a, c_b, k_b), key, num_resamples, chunk_size)
  low, high = _percentiles(samples, level)
  return PairedBootstrapResult(est_a, est_b, difference, low, high, jax.tree.map(_p_value, samples))


# One jitted call per block (the host loop); _samples_jit, _ci_jit and
# _paired_jit compute the same values in one call (under a transformation).

@functools.partial(jax.jit, static_argnames=("fn",))
def _estimate_jit(fn, confidences, correct):
  return fn(confidences, correct)


@functools.partial(jax.jit, static_argnames=("fn", "size", "num_chunks"), **_RESAMPLING)
def _block_jit(fn, confidences, correct, key, start, size, num_chunks):
  return _map_block(fn, (confidences, correct), key, start, size, num_chunks)


@jax.jit
def _interval_jit(samples, level):
  return _percentiles(samples, level)


@functools.partial(jax.jit, static_argnames=("fn",))
def _paired_estimate_jit(fn, c_a, k_a, c_b, k_b):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)
  est_a, est_b = pair(c_a, k_a, c_b, k_b)
  return est_a, est_b, jax.tree.map(_subtract, est_a, est_b)


@functools.partial(jax.jit, static_argnames=("fn", "size", "num_chunks"), **_RESAMPLING)
def _paired_block_jit(fn, c_a, k_a, c_b, k_b, key, start, size, num_chunks):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)

  def diff(*arrays):
    return jax.tree.map(_subtract, *pair(*arrays))

  return _map_block(diff, (c_a, k_a, c_b, k_b), key, start, size, num_chunks)


@jax.jit
def _paired_interval_jit(samples, level):
  low, high = _percentiles(samples, level)
  return low, high, jax.tree.map(_p_value, samples)


# --- validation -------------------------------------------------------------

def _check_key(key: Any) -> jax.Array:
  """A typed PRNG key (``jax.random.key``) or a legacy uint32 [2] key (``jax.random.PRNGKey``)."""
  dtype = getattr(key, "dtype", None)
  shape = getattr(key, "shape", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if shape != ():
      raise ValueError(f"key must be a single PRNG key, got a key array of shape {shape}")
    return key
  if dtype == jnp.uint32 and shape == (2,):
    return jax.random.wrap_key_data(key, impl="threefry2x32")
  raise ValueError(
      f"key must be a JAX PRNG key, e.g. jax.random.key(0), got {type(key).__name__}"
      + (f" with dtype {dtype} and shape {shape}" if dtype is not None else ""))


def _check_level(level: Any) -> Any:
  if isinstance(level, jax.core.Tracer):
    return level
  try:
    value = float(level)
  except (TypeError, ValueError):
    raise ValueError(f"level must be a number in (0, 1), got {level!r}") from None
  if not 0.0 < value < 1.0:  # also rejects NaN
    raise ValueError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {value!r}")
  return value


def _check_data(confidences: Any, correct: Any, suffix: str = ""):
  c = _validation.as_float_array(confidences, f"confidences{suffix}")
  k = _validation.correct_array(correct, f"correct{suffix}")
  if c.ndim != 1 or k.ndim != 1:
    raise ValueError(f"confidences{suffix} and correct{suffix} must be 1-D [n], got shapes "
                     f"{c.shape} and {k.shape}")
  try:
    invalid = _validation.check_samples(c, k, names=(f"confidences{suffix}", f"correct{suffix}"))
  except ValueError as e:
    raise ValueError(f"{e} (model {suffix[1:]})" if suffix else str(e)) from None
  # Traced invalid data (inside a user's jit/vmap): every confidence becomes NaN,
  # so the estimate and every resample are NaN, whatever ``fn`` computes.
  return _validation.poison(c, rows=invalid), _validation.convert_correct(k)


def _check_fn(fn: Any) -> None:
  if not callable(fn):
    raise ValueError(f"fn must be a function (confidences, correct) -> metric, got {type(fn).__name__}")


def _check_common(key: Any, num_resamples: Any, chunk_size: Any, n: int):
  """Validated (key, num_resamples, chunk_size), the chunk size defaulted and capped at B."""
  key = _check_key(key)
  num_resamples = _validation.positive_int(num_resamples, "num_resamples")
  if chunk_size is None:
    chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // n)
  chunk_size = min(_validation.positive_int(chunk_size, "chunk_size"), num_resamples)
  return key, num_resamples, chunk_size


# --- public API -------------------------------------------------------------

@_public.entry
def bootstrap_samples(fn: Callable, confidences, correct, *, key, num_resamples: int = 1000,
                      chunk_size: int | None = None):
  """The B resampled values theta*_b = fn(c[I_b], kappa[I_b]) of a metric.

  The raw material of :func:`bootstrap_ci`: same resamples for the same
  ``key`` (and the same as :func:`paired_bootstrap`'s, so the differences of
  two models' samples are its resampled differences, up to float rounding).

  Args:
    fn, confidences, correct, key, num_resamples, chunk_size: as in
      :func:`bootstrap_ci`.

  Returns:
    A pytree with the structure of ``fn``'s output whose leaves have a leading
    resample axis [num_resamples, ...].

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import coverage
    >>> s = bootstrap_samples(lambda c, k: coverage(c, 0.5), jnp.array([0.9, 0.2, 0.7, 0.4]),
    ...                       jnp.array([1, 0, 1, 1]), key=jax.random.key(0), num_resamples=5)
    >>> s.shape
    (5,)
  """
  c, k = _check_data(confidences, correct)
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  if _traced(c, k, key):
    return _samples_jit(fn, c, k, key, num_resamples, chunk_size)
  return _run_blocks(lambda start, size, chunks: _block_jit(fn, c, k, key, start, size, chunks),
                     num_resamples, chunk_size, c.shape[0])


@_public.entry
def bootstrap_ci(fn: Callable, confidences, correct, *, key, num_resamples: int = 1000,
                 level: float = 0.95, chunk_size: int | None = None) -> BootstrapResult:
  """Percentile bootstrap confidence interval of any metric, including a whole sweep.

  With theta-hat = fn(c, kappa) and B resamples theta*_b = fn(c[I_b],
  kappa[I_b]) (n indices drawn with replacement, see the module docstring),
  alpha = 1 - level:

  .. math::

    [\\mathrm{low}, \\mathrm{high}] = \\left[ Q_{\\alpha/2}(\\theta^*),
    Q_{1-\\alpha/2}(\\theta^*) \\right],

  Q_q being NumPy's default ("linear", Hyndman-Fan type 7) quantile over the
  m resampled values that are not NaN: with x_(0) <= ... <= x_(m-1) and
  h = (m - 1) q, Q_q = x_(floor h) + (h - floor h)(x_(floor h + 1) - x_(floor h)).
  NaN resampled values (e.g. selective accuracy when a resample retains no
  sample) are left out rather than poisoning the interval; if every value is
  NaN, the bounds are NaN. Each element of an array-valued metric gets its own
  interval (pointwise, not simultaneous).

  ``fn`` must be traceable by JAX: it is vmapped over chunks of
  ``chunk_size`` resamples and jitted with the rest (compiled once per ``fn``
  object: define it once and reuse it). Memory holds ``chunk_size * n``
  resampled values at a time. ``fn`` = :func:`~cwsa_jax.ece` itself (or a
  ``functools.partial`` of it with equal-width bins, at most 64) with boolean
  correctness is bucketed once: each resample gathers one packed word per
  draw and sums it into the bins (the same exact sums, so the same values,
  bit for bit). So is a keyword-only ``functools.partial`` of
  :func:`~cwsa_jax.sweep` with its ``thresholds`` (and ``normalize``), as
  :func:`bootstrap_sweep` does it: the same exact sums per resample, values
  equal to float32 rounding (a final division may differ by an ulp, since a
  lambda's thresholds are compile-time constants). ``fn`` =
  :func:`~cwsa_jax.aurc`, :func:`~cwsa_jax.augrc`, :func:`~cwsa_jax.eaurc` or
  :func:`~cwsa_jax.risk_coverage_summary` (or a keyword-only partial with a
  ``"step"`` or ``"trapezoid"`` convention) with boolean correctness is
  sorted once: each resample is a multiplicity per sample over that order
  (the evaluation bootstrap's area scan), the areas equal to float32 rounding
  of their sums. A lambda around any of them takes the generic path: each
  resample recomputes ``fn`` from its gathered samples.

  Args:
    fn: ``(confidences [n], correct [n]) -> metric``, where the metric is a
      scalar, an array or any pytree of them (e.g. :class:`~cwsa_jax.SweepResult`).
    confidences: [n] confidences in [0, 1].
    correct: [n] bool or 0/1 correctness, or graded correctness in [0, 1].
    key: a JAX PRNG key (``jax.random.key(seed)``; legacy
      ``jax.random.PRNGKey`` keys work too).
    num_resamples: B >= 1.
    level: confidence level in (0, 1).
    chunk_size: resamples evaluated at once (>= 1); default
      max(1, 65536 // n). It changes speed and memory, not the resamples
      (the values are bitwise equal for this library's metrics, whose sums
      are exact; other metrics may round differently under ``vmap``).

  Returns:
    :class:`BootstrapResult` ``(estimate, low, high)``, each with the
    structure of ``fn``'s output (``low``/``high`` leaves are floating).

  Raises:
    ValueError: on a bad key, level, num_resamples, chunk_size or fn, or on
      inputs that are not 1-D, differ in shape, are empty, or hold NaN or
      values outside [0, 1].

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import cwsa
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0])
    >>> r = bootstrap_ci(lambda c, k: cwsa(c, k, 0.5), c, ok, key=jax.random.key(0),
    ...                  num_resamples=200)
    >>> print(f"{float(r.estimate):.3f} [{float(r.low):.3f}, {float(r.high):.3f}]")
    0.250 [-0.100, 0.551]
  """
  c, k = _check_data(confidences, correct)
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  level = _check_level(level)
  if _traced(c, k, key, level):
    return _ci_jit(fn, c, k, key, jnp.float32(level), num_resamples, chunk_size)
  estimate = _estimate_jit(fn, c, k)
  area = _area_options(fn, k)
  if area is not None:  # sort once
    samples = _area_samples(*area, (c, k), key=key, num_resamples=num_resamples)
    return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))
  form = _fast_form(fn, c, k)
  if form is not None:  # bucket once
    block = lambda start, size, chunks: _fast_block_jit(form, key, start, size, chunks)  # noqa: E731
  else:
    block = lambda start, size, chunks: _block_jit(fn, c, k, key, start, size, chunks)  # noqa: E731
  samples = _run_blocks(block, num_resamples, chunk_size, c.shape[0])
  return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))


@_public.entry
def paired_bootstrap(fn: Callable, confidences_a, correct_a, confidences_b, correct_b, *, key,
                     num_resamples: int = 1000, level: float = 0.95,
                     chunk_size: int | None = None) -> PairedBootstrapResult:
  """Paired bootstrap of the difference fn(A) - fn(B) of two models on the same test set.

  Both models must be scored on the same n samples in the same order; every
  resample uses the same indices I_b for both, so the variation the test set
  shares cancels. With d-hat = fn(a) - fn(b) and
  d*_b = fn(a[I_b]) - fn(b[I_b]) over the B resamples, [low, high] is the
  percentile interval of the d*_b (as in :func:`bootstrap_ci`) and the
  two-sided p-value of H0: difference = 0 is

  .. math::

    p = \\min\\left(1,\\; 2 \\min\\left(
      \\frac{1 + \\#\\{b : d^*_b \\le 0\\}}{1 + B},\\;
      \\frac{1 + \\#\\{b : d^*_b \\ge 0\\}}{1 + B} \\right)\\right),

  so p >= 2/(1 + B) is never 0 and p = 1 when the models agree on every
  resample. NaN differences are left out of the quantiles and of the counts
  (B then counts the non-NaN ones); all-NaN gives NaN. The forms of ``fn``
  that :func:`bootstrap_ci` buckets or sorts once are bucketed or sorted once
  per model here.

  Args:
    fn: as in :func:`bootstrap_ci`.
    confidences_a, correct_a: model A's [n] confidences and correctness.
    confidences_b, correct_b: model B's, on the same samples in the same order.
    key, num_resamples, level, chunk_size: as in :func:`bootstrap_ci`.

  Returns:
    :class:`PairedBootstrapResult` ``(estimate_a, estimate_b, difference,
    low, high, p_value)``, each with the structure of ``fn``'s output.

  Raises:
    ValueError: as :func:`bootstrap_ci`, and when the models' n differ.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import cwsa
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0])
    >>> r = paired_bootstrap(lambda c, k: cwsa(c, k, 0.5), c, ok, c, jnp.ones(8, bool),
    ...                      key=jax.random.key(0), num_resamples=200)
    >>> print(f"{float(r.difference):.3f} [{float(r.low):.3f}, {float(r.high):.3f}] "
    ...       f"p = {float(r.p_value):.3f}")
    -0.250 [-0.576, -0.025] p = 0.050
  """
  c_a, k_a = _check_data(confidences_a, correct_a, "_a")
  c_b, k_b = _check_data(confidences_b, correct_b, "_b")
  if c_a.shape != c_b.shape:
    raise ValueError(
        f"models a and b must be scored on the same samples: got n = {c_a.shape[0]} and "
        f"n = {c_b.shape[0]}")
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c_a.shape[0])
  level = _check_level(level)
  if _traced(c_a, k_a, c_b, k_b, key, level):
    return _paired_jit(fn, c_a, k_a, c_b, k_b, key, jnp.float32(level), num_resamples, chunk_size)
  estimates = _paired_estimate_jit(fn, c_a, k_a, c_b, k_b)
  area = _area_options(fn, k_a) if _area_options(fn, k_b) is not None else None
  if area is not None:  # sort each model once
    samples = _area_samples(*area, (c_a, k_a), (c_b, k_b), key=key, num_resamples=num_resamples)
    return PairedBootstrapResult(*estimates, *_paired_interval_jit(samples, jnp.float32(level)))
  form_a, form_b = _fast_form(fn, c_a, k_a), _fast_form(fn, c_b, k_b)
  if form_a is not None and form_b is not None:  # bucket each model once
    block = lambda start, size, chunks: _fast_paired_block_jit(  # noqa: E731
        form_a, form_b, key, start, size, chunks)
  else:
    block = lambda start, size, chunks: _paired_block_jit(  # noqa: E731
        fn, c_a, k_a, c_b, k_b, key, start, size, chunks)
  samples = _run_blocks(block, num_resamples, chunk_size, c_a.shape[0])
  return PairedBootstrapResult(*estimates, *_paired_interval_jit(samples, jnp.float32(level)))


# --- the sweep's fast path ----------------------------------------------------

def _pack(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """One int32 per sample: the bit pattern of c >= 0, boolean correctness in the sign bit."""
  bits = lax.bitcast_convert_type(confidences.astype(jnp.float32), jnp.int32) & 0x7FFFFFFF
  return bits | (correct.astype(jnp.int32) << 31)


def _unpack(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(confidences, correct) of :func:`_pack`."""
  return lax.bitcast_convert_type(packed & 0x7FFFFFFF, jnp.float32), packed < 0


def _sweep_per_sample(confidences, correct, thresholds):
  """What each resample gathers, found once, and the invalid-input flag. Binary samples
  with at most ``_sweep.PACKED_MAX_BUCKETS`` buckets: one word each, their segment and
  1 - c (:func:`~cwsa_jax._sweep.pack_samples`); more buckets: the bucket and (c, correct)
  packed in one int32; graded: the bucket, c and kappa."""
  invalid = _stats.invalid_inputs(confidences, correct)
  sorted_t = _sweep.sorted_thresholds(thresholds)[1]
  buckets = _sweep.bucket_ids(confidences, sorted_t)
  if correct.dtype != jnp.bool_:
    return (buckets, confidences, correct), invalid
  if sorted_t.shape[0] + 1 <= _sweep.PACKED_MAX_BUCKETS:
    return (_sweep.pack_samples(confidences, correct, buckets),), invalid
  return (buckets, _pack(confidences, correct)), invalid


def _sweep_metrics(thresholds, invalid, normalize: str) -> Callable:
  """The sweep of one (resampled) ``per_sample`` tuple: the sweep's own bucket-and-sum
  pipeline from the known buckets, without the value checks (done once for all data)."""
  order, sorted_t = _sweep.sorted_thresholds(thresholds)

  def metrics(*arrays):
    if len(arrays) == 1:
      hi, lo = _sweep.packed_bucket_sums(arrays[0], sorted_t.shape[0] + 1)
    else:
      buckets, *arrays = arrays
      c, k = _unpack(arrays[0]) if len(arrays) == 1 else arrays
      hi, lo = _sweep.bucket_sums(c, k, sorted_t, buckets=buckets)
    result = _sweep.result_from_bucket_sums(hi, lo, thresholds, order, invalid)
    return _stats.renormalize(result, normalize)  # per resample, before the quantiles

  return metrics


@functools.partial(jax.jit, static_argnames=("num_resamples", "chunk_size", "normalize"))
def _sweep_ci_jit(confidences, correct, thresholds, key, level, num_resamples, chunk_size,
                  normalize):
  per_sample, invalid = _sweep_per_sample(confidences, correct, thresholds)
  metrics = _sweep_metrics(thresholds, invalid, normalize)
  estimate = metrics(*per_sample)
  samples = _map_resamples(metrics, per_sample, key, num_resamples, chunk_size)
  return BootstrapResult(estimate, *_percentiles(samples, level))


@functools.partial(jax.jit, static_argnames=("normalize",))
def _sweep_estimate_jit(confidences, correct, thresholds, normalize):
  per_sample, invalid = _sweep_per_sample(confidences, correct, thresholds)
  metrics = _sweep_metrics(thresholds, invalid, normalize)
  return metrics(*per_sample), per_sample, invalid


_sweep_per_sample_jit = jax.jit(_sweep_per_sample)


def _sweep_options(fn: Callable) -> tuple[jax.Array, str] | None:
  """(thresholds, normalize) when ``fn`` is a keyword-only ``functools.partial`` of
  :func:`~cwsa_jax.sweep` with its thresholds; else None."""
  keywords = _keywords(fn, _sweep.sweep, {"thresholds", "normalize"})
  if keywords is None or "thresholds" not in keywords:
    return None
  # The options are valid here: bootstrap_ci computes the estimate, the sweep itself, first.
  return _validation.as_thresholds(keywords["thresholds"]), keywords.get("normalize", "retained")


@_public.entry
def bootstrap_sweep(confidences, correct, thresholds, *, key, num_resamples: int = 1000,
                    level: float = 0.95, chunk_size: int | None = None,
                    normalize: str = "retained") -> BootstrapResult:
  """:func:`bootstrap_ci` of a whole :func:`~cwsa_jax.sweep`, faster.

  The same resamples and the same interval as
  ``bootstrap_ci(lambda c, k: sweep(c, k, thresholds), ...)`` for the same
  ``key``, but the inputs are checked and bucketed once, not once per
  resample. With boolean correctness and at most 63 thresholds a resample
  gathers one int32 word per draw, the sample's segment (its bucket and
  correctness) and ``1 - c`` in units of 2^-24 (``_sweep.pack_samples``), and
  sums the words' fields (``_sweep.packed_bucket_sums``); otherwise it
  gathers the bucket and the confidence (boolean correctness in its sign bit;
  graded: c and kappa) into the sweep's own sums (``_sweep.bucket_sums``).
  The per-resample sums are the same exact integers, so the resampled values
  agree with the generic path to float32 rounding of the final divisions.

  Args:
    confidences, correct, key, num_resamples, level, chunk_size: as in
      :func:`bootstrap_ci`.
    thresholds: [T] thresholds in [0, 1).
    normalize: as in :func:`~cwsa_jax.sweep`.

  Returns:
    :class:`BootstrapResult` whose fields are :class:`~cwsa_jax.SweepResult`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0], bool)
    >>> r = bootstrap_sweep(c, ok, jnp.array([0.5, 0.8]), key=jax.random.key(0), num_resamples=200)
    >>> print(f"{float(r.estimate.cwsa[0]):.3f} [{float(r.low.cwsa[0]):.3f}, {float(r.high.cwsa[0]):.3f}]")
    0.250 [-0.100, 0.551]
  """
  _stats.check_normalize(normalize)
  c, k = _check_data(confidences, correct)
  t = _validation.as_thresholds(thresholds)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  level = _check_level(level)
  # Resamples gather exact integer columns: no derivative (an error, not a zero).
  no_gradient = ("bootstrap_sweep resamples exact integer sums and has no derivative; use "
                 "bootstrap_ci(lambda c, k: sweep(c, k, thresholds), ...) to differentiate")
  c = _validation.refuse_gradient(c.astype(jnp.float32), no_gradient)
  k = _validation.refuse_gradient(k, no_gradient)
  if _traced(c, k, t, key, level):
    return _sweep_ci_jit(c, k, t, key, jnp.float32(level), num_resamples, chunk_size, normalize)
  estimate, per_sample, invalid = _sweep_estimate_jit(c, k, t, normalize)
  form = _FastForm(("sweep", normalize), per_sample, (t,), invalid)
  samples = _run_blocks(lambda start, size, chunks: _fast_block_jit(form, key, start, size, chunks),
                        num_resamples, chunk_size, c.shape[0])
  return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))


# --- bootstrap_ci(ece): bucket once --------------------------------------------------------


def _keywords(fn: Callable, metric: Callable, allowed: set[str]) -> dict | None:
  """The keywords of ``fn`` when it is ``metric`` or a keyword-only ``functools.partial``
  of it with keywords among ``allowed``; else None."""
  keywords = {}
  if isinstance(fn, functools.partial) and not fn.args:
    fn, keywords = fn.func, dict(fn.keywords)
  return keywords if fn is metric and set(keywords) <= allowed else None


def _ece_options(fn: Callable) -> tuple[int, str] | None:
  """(num_bins, norm) when ``fn`` is :func:`~cwsa_jax.ece`, or a keyword-only
  ``functools.partial`` of it, with equal-width bins that fit a packed word; else None."""
  keywords = _keywords(fn, _calibration.ece, {"num_bins", "norm", "binning"})
  if keywords is None:
    return None
  # The options are valid here: bootstrap_ci computes the estimate, ece itself, first.
  num_bins, norm = keywords.get("num_bins", 15), keywords.get("norm", "l1")
  if keywords.get("binning", "width") != "width" or num_bins > _sweep.PACKED_MAX_BUCKETS:
    return None
  return int(num_bins), norm


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _ece_words(confidences, correct, num_bins):
  """Each sample's bin and correctness with 1 - c, one int32 word (``_sweep.pack_samples``)."""
  bins = _calibration.bin_index(confidences, _calibration.width_edges(num_bins))
  return _sweep.pack_samples(confidences, correct, bins)


def _ece_of_words(num_bins: int, norm: str) -> Callable:
  """The ECE of a resample's packed words: ``ece``'s exact per-bin sums and formula."""
  def metric(words):
    hi, lo = _sweep.packed_bucket_sums(words, num_bins)  # [B, 2 segments x 3 columns]
    hi, lo = _stats.calibration_canonical(hi.reshape(-1, 3), lo.reshape(-1, 3), graded=False)
    return _calibration.error_from_totals(_stats.calibration_totals(hi, lo), norm)
  return metric


# --- the forms bucketed once, for bootstrap_ci, paired_bootstrap and bootstrap_sweep ---------


@jax.tree_util.register_pytree_node_class
class _FastForm:
  """A metric of samples found once: ``spec`` (static: ``("ece", num_bins, norm)`` or
  ``("sweep", normalize)``), the per-sample ``arrays`` each resample gathers, ``shared``
  operands (the sweep's thresholds) and the ``invalid`` flag of the data."""

  def __init__(self, spec: tuple, arrays: tuple, shared: tuple, invalid: jax.Array):
    self.spec, self.arrays, self.shared, self.invalid = spec, tuple(arrays), tuple(shared), invalid

  def tree_flatten(self):
    return (self.arrays, self.shared, self.invalid), self.spec

  @classmethod
  def tree_unflatten(cls, spec, children):
    return cls(spec, *children)

  def metric(self, invalid: jax.Array | None = None) -> Callable:
    """The metric of one resample's gathered ``arrays`` (``invalid``: another model's flag)."""
    invalid = self.invalid if invalid is None else invalid
    if self.spec[0] == "ece":
      return _ece_of_words(*self.spec[1:])
    return _sweep_metrics(self.shared[0], invalid, self.spec[1])


def _fast_form(fn: Callable, confidences: jax.Array, correct: jax.Array) -> _FastForm | None:
  """``fn``'s per-sample form when it is one :func:`bootstrap_ci` buckets once: ``ece``
  (or a keyword-only partial, equal-width bins, boolean correctness) and a keyword-only
  partial of ``sweep`` with its thresholds; else None."""
  ece_options = _ece_options(fn)
  if ece_options is not None and correct.dtype == jnp.bool_:
    words = _ece_words(confidences, correct, ece_options[0])
    return _FastForm(("ece", *ece_options), (words,), (), jnp.zeros((), jnp.bool_))
  sweep_options = _sweep_options(fn)
  if sweep_options is not None:
    t, normalize = sweep_options
    per_sample, invalid = _sweep_per_sample_jit(confidences.astype(jnp.float32), correct, t)
    return _FastForm(("sweep", normalize), per_sample, (t,), invalid)
  return None


@functools.partial(jax.jit, static_argnames=("size", "num_chunks"), **_RESAMPLING)
def _fast_block_jit(form, key, start, size, num_chunks):
  return _map_block(form.metric(), form.arrays, key, start, size, num_chunks)


@functools.partial(jax.jit, static_argnames=("size", "num_chunks"), **_RESAMPLING)
def _fast_paired_block_jit(form_a, form_b, key, start, size, num_chunks):
  """Differences of the two models' metrics per resample (the same indices for both).

  Forms of one layout are stacked and the metric vmapped over the pair, as
  :func:`_pair_fn` does: identical models give exactly identical values.
  """
  k = len(form_a.arrays)
  same = (jax.tree.structure(form_a) == jax.tree.structure(form_b)
          and all(x.dtype == y.dtype for x, y in zip(form_a.arrays, form_b.arrays)))

  def diff(*arrays):
    a, b = arrays[:k], arrays[k:]
    if same:
      out = jax.vmap(lambda invalid, *xs: form_a.metric(invalid)(*xs))(
          jnp.stack([form_a.invalid, form_b.invalid]),
          *(jnp.stack([x, y]) for x, y in zip(a, b)))
      out_a, out_b = (jax.tree.map(lambda x, i=i: x[i], out) for i in (0, 1))
    else:
      out_a, out_b = form_a.metric()(*a), form_b.metric()(*b)
    return jax.tree.map(_subtract, out_a, out_b)

  return _map_block(diff, (*form_a.arrays, *form_b.arrays), key, start, size, num_chunks)


# --- every metric of the evaluation report, from one sort ---------------------------------
#
# Each resample is evaluated in two parts that share nothing with a sort:
#
# * the samples are sorted once by decreasing confidence, and resample b is
#   the vector of multiplicities m_i = #{j : i_bj = i} over that order (a
#   count of its indices);
# * the sweep and the equal-width calibration bins are sums over the buckets
#   of the merged grid of thresholds and bin edges: each sample's bucket is
#   found once (``_sweep.bucket_ids``), and a resample's exact bucket sums
#   (the sweep's binary layout) are sums of m and of m times the digits of
#   1 - c, in streaming order; the retained set of each threshold and each
#   bin is then a range of buckets;
# * the risk-coverage points of the resample are at the tie-group ends, at
#   K = the prefix sum of m and E = the prefix sum of m (1 - kappa): one
#   sequential pass, no sort.

_SCAN_BLOCK = 1024
_DIGIT_BITS = 6
_SUM_BLOCK = 1024  # samples per block of the bucket sums' variadic reduction
RESAMPLING = ("multinomial", "poisson")
# The most samples of an evaluation bootstrap. Multinomial: 63 n < 2^31 keeps a block's
# digit sums exact int32 (a multiplicity may be as large as n). Poisson: multiplicities are at
# most 12 and every block's sum is split into (hi, lo) before the prefix sums, whose lo parts
# (below 4096 per block of 1024 samples) stay below 2^31 for n <= 2^29. A streamed bootstrap
# sums each range apart, so only its resample sizes limit it: counted in int32 by the area
# scan, they exceed 2n < 2^31 with probability below e^-(0.38 n).
_MAX_EVALUATION_N = {"multinomial": 1 << 25, "poisson": 1 << 29}
_MAX_STREAMED_N = 1 << 30


class EvaluationMetrics(NamedTuple):
  """The metrics of ``cwsa-jax evaluate`` with an interval (scalars, and [T] sweep fields)."""
  accuracy: Any
  ece: Any
  aurc: Any
  eaurc: Any
  augrc: Any
  coverage: Any
  selective_accuracy: Any
  cwsa: Any
  cwsa_plus: Any


class _Evaluation(NamedTuple):
  """The data of one evaluation bootstrap, prepared once (per sample: in sorted order)."""
  rank: jax.Array | None   # [n] sorted position of input sample i (None: the input is sorted)
  source: jax.Array | None  # [n] uint32 input row of each sorted position (Poisson scheme only)
  run_start: jax.Array     # [R + 1] where each run of one bucket starts in sorted order (and n)
  run_bucket: jax.Array    # [R] the bucket of the merged grid of each run
  digits: jax.Array        # [4, n] 6-bit digits of the binary layout's columns u_hi, u_lo
  correct: jax.Array       # [n] bool
  group_end: jax.Array     # [n] bool: last sample of its tie group
  retained: jax.Array      # [T] bucket where the retained set of each sorted threshold starts
  bins: jax.Array          # [B + 1] bucket where each bin starts (and G + 1)


class _Plan(NamedTuple):
  """Static choices of one evaluation bootstrap."""
  num_buckets: int  # of the merged grid of thresholds and bin edges
  num_thresholds: int
  num_bins: int
  ece_norm: str
  convention: str
  normalize: str
  scheme: str  # "multinomial" or "poisson"


def _sum_float(x: jax.Array) -> jax.Array:
  """float32 sum in two levels (blocks of 1024, then the block sums): small rounding error."""
  size = 1024
  padded = jnp.pad(x, (0, -x.shape[-1] % size))
  return jnp.sum(jnp.sum(padded.reshape(-1, size), axis=-1))


_SMALL_HARMONIC = np.cumsum(np.concatenate([[0.0], 1.0 / np.arange(1, 8)])).astype(np.float32)


def _harmonic_difference(r: jax.Array, n: jax.Array) -> jax.Array:
  """H_n - H_r = sum_{k = r + 1}^{n} 1/k (float32) of int32 0 <= r <= n, in O(1) memory.

  With f(x) = ln x + 1/(2x) - 1/(12 x^2) + 1/(120 x^4), H_x = f(x) + gamma + O(x^-6):
  for r >= 8 the difference f(n) - f(r), its logarithm as log1p((n - r) / r) (a
  truncation error below 2e-8 relative); for r < 8 the exact H_r, and H_n from f(n)
  when n >= 8.
  """
  def tail(x):  # f(x) - ln x
    return 0.5 / x - 1.0 / (12.0 * x * x) + 1.0 / (120.0 * x * x * x * x)

  small = jnp.asarray(_SMALL_HARMONIC)
  rf, nf = jnp.maximum(r, 8).astype(jnp.float32), jnp.maximum(n, 8).astype(jnp.float32)
  large = jnp.log1p((n - r).astype(jnp.float32) / rf) + tail(nf) - tail(rf)
  h_n = jnp.where(n < 8, small[jnp.clip(n, 0, 7)], jnp.log(nf) + np.float32(np.euler_gamma)
                  + tail(nf))
  return jnp.where(r >= 8, large, h_n - small[jnp.clip(r, 0, 7)])


@jax.jit
def _buckets_and_digits(confidences: jax.Array, grid: jax.Array):
  """Each sample's bucket of ``grid`` and the [4, n] 6-bit digits (int8) of the binary
  layout's 12-bit columns (u_hi, u_lo) of 1 - c."""
  u_hi, u_lo = _exact.grid_columns(1.0 - jnp.clip(confidences, 0.0, 1.0))
  mask = (1 << _DIGIT_BITS) - 1
  digits = jnp.stack([u_hi >> _DIGIT_BITS, u_hi & mask, u_lo >> _DIGIT_BITS, u_lo & mask])
  return _sweep.bucket_ids(confidences, grid), digits.astype(jnp.int8)


def _digit_columns(m: jax.Array, correct: jax.Array, digits: jax.Array) -> list[jax.Array]:
  """The 10 int32 columns of the bucket sums: (wrong, correct) x (m, m d_0, ..., m d_3)."""
  m = m.astype(jnp.int32)
  right = jnp.where(correct, m, 0)
  wrong = m - right
  out = [wrong, right]
  for d in digits:
    d = d.astype(jnp.int32)
    out += [wrong * d, right * d]
  return out


def _weighted_bucket_sums(m: jax.Array, data: _Evaluation, num_buckets: int):
  """Exact per-bucket sums (hi, lo) [G + 1, 6] (the sweep's binary layout) of the resample
  with multiplicities ``m``: sums of m and of m times the 6-bit digits, wrong and correct.

  The samples are sorted, so each bucket is one run of positions [p_r, p_{r+1}) and its
  sums are differences of prefix sums S(p) at the run starts: S(p) = the sums of the
  whole blocks of ``_SUM_BLOCK`` samples before p (one pass of a variadic reduction:
  every column at once, no scatter) plus the part of p's block before p. Every block or
  partial sum is at most 63 n (the digits are below 64 and multinomial multiplicities add
  up to n; Poisson ones are at most 12: 756 per sample), an exact int32 for n < 2^25, and
  is split into (hi, lo) = (s >> 12, s & 4095) before the prefix sums; two digits d, d'
  give the column 64 d + d'.
  """
  n = m.shape[0]
  size = _SUM_BLOCK
  whole = n // size * size
  columns = [x[:whole].reshape(-1, size) for x in _digit_columns(m, data.correct, data.digits)]
  zero = jnp.zeros((), jnp.int32)
  blocks = jnp.stack(lax.reduce(columns, [zero] * len(columns),
                                lambda a, b: [x + y for x, y in zip(a, b)], (1,)), -1)  # [nb, 10]
  prefix = [jnp.concatenate([jnp.zeros((1, blocks.shape[1]), jnp.int32),
                             lax.associative_scan(jnp.add, x, axis=0)])
            for x in _exact.split(blocks)]  # [nb + 1, 10]
  # The part of each run start's block before it: a window of one block, masked.
  q = data.run_start // size
  at = q[:, None] * size + jnp.arange(size, dtype=jnp.int32)
  before = at < data.run_start[:, None]
  at = jnp.minimum(at, n - 1)
  window = _digit_columns(jnp.where(before, m[at], 0), data.correct[at], data.digits[:, at])
  part = jnp.stack([jnp.sum(x, axis=1) for x in window], -1)  # [R + 1, 10]
  part_hi, part_lo = _exact.split(part)
  s_hi, s_lo = prefix[0][q] + part_hi, prefix[1][q] + part_lo
  run_hi, run_lo = _exact.canonical(s_hi[1:] - s_hi[:-1], s_lo[1:] - s_lo[:-1])  # [R, 10]
  # [R runs] -> [G + 1 buckets] (empty runs add 0) -> [2 (G + 1) segments (2 bucket +
  # correct), 5 columns]
  hi, lo = (jnp.zeros((num_buckets, 10), jnp.int32).at[data.run_bucket].add(x)
            .reshape(num_buckets, 5, 2).transpose(0, 2, 1).reshape(2 * num_buckets, 5)
            for x in (run_hi, run_lo))

  def column(j):  # 64 d_j + d_{j+1}, exactly, as (hi, lo)
    low = (lo[:, j] << _DIGIT_BITS) + lo[:, j + 1]  # < 2^19
    return _exact.canonical((hi[:, j] << _DIGIT_BITS) + hi[:, j + 1] + (low >> 12), low & 4095)

  count, u_hi, u_lo = (hi[:, 0], lo[:, 0]), column(1), column(3)
  # [2 (G + 1) segments, 3 columns] -> [G + 1 buckets, 6]
  return (jnp.stack([count[0], u_hi[0], u_lo[0]], -1).reshape(num_buckets, -1),
          jnp.stack([count[1], u_hi[1], u_lo[1]], -1).reshape(num_buckets, -1))


def _sweep_and_calibration(bucket_sums, retained, bins, thresholds, order, plan):
  """The sweep and the ECE of a resample's exact per-bucket sums (hi, lo) [G + 1, 6]."""
  hi, lo = _sweep.suffix_sums(*bucket_sums)  # [G + 1, 6]
  hi = jnp.concatenate([hi, jnp.zeros_like(hi[:1])])  # suffix from G + 1: nothing
  lo = jnp.concatenate([lo, jnp.zeros_like(lo[:1])])
  out = {}
  rows = jnp.concatenate([jnp.zeros((1,), jnp.int32), retained])  # entry 0: everything
  sums = _stats.sums_from_columns(_exact.to_float(hi[rows], lo[rows]), False)
  out["accuracy"] = sums.correct[0] / sums.count[0]  # exact counts below 2^24
  result = _stats.renormalize(
      _sweep.result_from_sums(sums, thresholds, order, jnp.zeros((), bool)), plan.normalize)
  out.update({f: getattr(result, f) for f in _sweep.METRIC_FIELDS})
  start_hi, start_lo = hi[bins], lo[bins]
  bin_hi, bin_lo = _exact.canonical(start_hi[:-1] - start_hi[1:], start_lo[:-1] - start_lo[1:])
  # Per bin -> per segment (2 bin + correct), the calibration pipeline's binary layout.
  width = len(_stats.BINARY_COLUMNS)
  totals = _stats.calibration_totals(*_stats.calibration_canonical(
      bin_hi.reshape(-1, width), bin_lo.reshape(-1, width), False))
  out["ece"] = _calibration.error_from_totals(totals, plan.ece_norm)
  return out


class _AreaCarry(NamedTuple):
  """The state of the area scan after some samples (int32 counts, float32 sums)."""
  k: Any        # multiplicities so far (the resample's size at the end)
  e: Any        # errors so far
  k_last: Any   # K and E of the last point (group end with K > K')
  e_last: Any
  r_last: Any   # its risk E'/K' (trapezoid)
  area: Any     # n AURC so far
  generalized: Any  # n^2 AUGRC so far


def _area_carry_zero(shape=()) -> _AreaCarry:
  i0, f0 = jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32)
  return _AreaCarry(i0, i0, i0, i0, f0, f0, f0)


def _area_scan(m, correct, group_end, carry: _AreaCarry, convention: str) -> _AreaCarry:
  """The area scan over multiplicities ``m`` [n] (sorted order), from ``carry``: a sequential
  loop on CPU (:func:`_area_loop`), prefix sums on accelerators (:func:`_area_prefix`), where
  a loop of n steps runs one step per kernel launch."""
  return _area_by_platform(m, correct, group_end, carry,
                           cpu=functools.partial(_area_loop, convention=convention),
                           default=functools.partial(_area_prefix, convention=convention))


def _area_prefix(m, correct, group_end, carry: _AreaCarry, convention: str) -> _AreaCarry:
  """:func:`_area_loop`'s carry by prefix sums: the same integers, the areas to float32 rounding.

  K and E are prefix sums of m and m (1 - correct). Across group ends with no
  multiplicity neither changes, so the last point before a group end p is the
  previous group end p' (or the carry's, when none is in these samples):
  ``K' = K_{p'}``, ``E' = E_{p'}``; p is a point when ``K_p > K'``.
  """
  step_rule = convention == "step"
  mi = m.astype(jnp.int32)
  k = carry.k + jnp.cumsum(mi)
  e = carry.e + jnp.cumsum(jnp.where(correct, 0, mi))
  position = lax.iota(jnp.int32, m.shape[0])
  # The previous group end of every sample (-1: none here), independent of m.
  latest = lax.cummax(jnp.where(group_end, position, -1))
  previous = jnp.concatenate([jnp.full((1,), -1, jnp.int32), latest[:-1]])
  here = previous >= 0
  at = jnp.maximum(previous, 0)
  k_last = jnp.where(here, k[at], carry.k_last)
  e_last = jnp.where(here, e[at], carry.e_last)
  r_last = carry.r_last if step_rule else jnp.where(
      here, e_last.astype(jnp.float32) / jnp.maximum(k_last, 1).astype(jnp.float32),
      carry.r_last)
  point, a, g, _ = _point_terms(group_end, k, e, k_last, e_last, r_last, step_rule)
  zero = jnp.float32(0.0)
  # K and E never decrease: the last point holds the largest of both.
  any_point = jnp.any(point)
  k_point = jnp.maximum(carry.k_last, jnp.max(jnp.where(point, k, 0)))
  e_point = jnp.maximum(carry.e_last, jnp.max(jnp.where(point, e, 0)))
  r_point = carry.r_last if step_rule else jnp.where(
      any_point, e_point.astype(jnp.float32) / jnp.maximum(k_point, 1).astype(jnp.float32),
      carry.r_last)
  return _AreaCarry(k[-1], e[-1], k_point, e_point, r_point,
                    carry.area + jnp.sum(jnp.where(point, a, zero)),
                    carry.generalized + jnp.sum(jnp.where(point, g, zero)))


def _point_terms(end, k, e, k_last, e_last, r_last, step_rule: bool):
  """(point, n AURC term, n^2 AUGRC term, risk) at samples with K, E and the last point K', E'.

  A group end with K > K' is a point (K/n, E/K); it adds W E/K (step) or
  W (E/K + r')/2 (trapezoid, r' the last point's risk E'/K', or E/K for the
  first point) to n AURC and W E or W (E + E')/2 to n^2 AUGRC, W = K - K'.
  """
  point = end & (k > k_last)
  width = (k - k_last).astype(jnp.float32)
  kf, ef = k.astype(jnp.float32), e.astype(jnp.float32)
  risk = ef / jnp.where(point, kf, 1.0)
  if step_rule:
    return point, width * risk, width * ef, risk
  previous = jnp.where(k_last > 0, r_last, risk)
  return (point, width * (risk + previous) * 0.5,
          width * (ef + e_last.astype(jnp.float32)) * 0.5, risk)


# Picks the area scan's form when the computation is lowered (tests force the prefix form).
_area_by_platform = lax.platform_dependent


def _area_loop(m, correct, group_end, carry: _AreaCarry, convention: str) -> _AreaCarry:
  """The area scan over multiplicities ``m`` [n] (sorted order), from ``carry``, sequentially.

  Carries K and E (count and errors so far) and the last point (K', E');
  every point adds :func:`_point_terms`. float32 sums per block of samples,
  then over the blocks.
  """
  size = min(_SCAN_BLOCK, m.shape[0])
  pad = -m.shape[0] % size
  # m as given (Poisson: int8) and the errors formed in the loop: the scan reads as few
  # bytes per sample as it can (it runs out of the cache at a few million samples).
  xs = [jnp.pad(x, (0, pad)).reshape(-1, size) for x in (m, correct, group_end)]
  step_rule = convention == "step"
  # XLA:CPU compiles the trapezoid's loop body badly when unrolled 8 times (tens of times slower).
  unroll = 8 if step_rule else 2

  def sample(carry, x):
    k, e, k_last, e_last, r_last, area, generalized = carry
    mi, right, end = x
    mi = mi.astype(jnp.int32)
    k, e = k + mi, e + jnp.where(right, 0, mi)
    point, a, g, risk = _point_terms(end, k, e, k_last, e_last, r_last, step_rule)
    area = area + jnp.where(point, a, 0.0)
    generalized = generalized + jnp.where(point, g, 0.0)
    k_last, e_last = jnp.where(point, k, k_last), jnp.where(point, e, e_last)
    r_last = r_last if step_rule else jnp.where(point, risk, r_last)
    return (k, e, k_last, e_last, r_last, area, generalized), None

  def block(carry, x):
    k, e, k_last, e_last, r_last, area, generalized = carry
    zero = jnp.zeros((), jnp.float32)
    (k, e, k_last, e_last, r_last, a, g), _ = lax.scan(
        sample, (k, e, k_last, e_last, r_last, zero, zero), x, unroll=unroll)
    return (k, e, k_last, e_last, r_last, area + a, generalized + g), None

  out, _ = lax.scan(block, tuple(carry), xs)
  return _AreaCarry(*out)


def _areas_from_carry(carry: _AreaCarry, convention: str):
  """AURC, AUGRC and E-AURC of the area scan's final ``carry``."""
  step_rule = convention == "step"
  total, num_errors, area, generalized = carry.k, carry.e, carry.area, carry.generalized
  n = total.astype(jnp.float32)  # the resample's size: sum of m
  aurc, augrc = _risk_coverage.areas(area, generalized, n)
  num_right = total - num_errors
  if step_rule:
    # sum_{k = r + 1}^{n} (k - r)/k / n with r correct: (E - r (H_n - H_r)) / n.
    oracle = _stats.divide((num_errors.astype(jnp.float32)
                            - num_right.astype(jnp.float32) * _harmonic_difference(num_right, total),
                            n))[0]
  else:
    oracle = 0.5 * _stats.divide((num_errors.astype(jnp.float32), n))[0] ** 2
  degenerate = (num_errors == 0) | (num_errors == total)
  eaurc = jnp.where(degenerate, 0.0, jnp.maximum(aurc - oracle, 0.0))
  return {"aurc": aurc, "augrc": augrc, "eaurc": eaurc}


def _prepare_evaluation(confidences: np.ndarray, correct: np.ndarray,
                        sorted_thresholds: np.ndarray, num_bins: int, scheme: str, *,
                        rows: np.ndarray | None = None,
                        padded: int | None = None) -> tuple[_Evaluation, int]:
  """The one sort (on the host), each sample's bucket of the merged grid of thresholds and
  bin edges, and the buckets where the retained sets and the bins start.

  ``rows``: the samples' row numbers (Poisson multiplicities; default 0, ..., n - 1).
  ``padded``: pad the samples to this length (correct and group_end False) and the
  runs to one per bucket (empty ones at the end), so that data of any n <= padded has
  the same shapes; the padding must get multiplicity 0.
  """
  n = confidences.shape[0]
  bits = confidences.view(np.int32) & np.int32(0x7FFFFFFF)  # orders like the value
  order = np.argsort(-bits, kind="stable")
  c = confidences[order]
  edges = np.asarray(_calibration.width_edges(num_bins))[1:-1]
  grid = np.unique(np.concatenate([sorted_thresholds, edges]).astype(np.float32))
  bucket, digits = _buckets_and_digits(jnp.asarray(c), jnp.asarray(grid))
  bucket = np.asarray(bucket)
  # Bucket b holds the samples with b grid values <= c: c >= g_j is bucket j + 1 and above.
  retained = np.searchsorted(grid, sorted_thresholds) + 1
  bins = np.concatenate([[0], np.searchsorted(grid, edges) + 1, [grid.shape[0] + 1]])
  rank = None
  if scheme == "multinomial" and not np.array_equal(order, np.arange(n)):
    rank = np.empty(n, np.int32)
    rank[order] = np.arange(n, dtype=np.int32)
  sorted_bits = bits[order]
  starts = np.flatnonzero(np.diff(bucket, prepend=-1))  # the runs of one bucket (sorted order)
  run_start, run_bucket = np.append(starts, n), bucket[starts]
  source = (order if rows is None else rows[order]).astype(np.uint32)
  correct, group_end = correct[order], np.append(sorted_bits[1:] != sorted_bits[:-1], True)
  if padded is not None:
    extra = padded - n
    source, correct, group_end = (np.pad(x, (0, extra)) for x in (source, correct, group_end))
    digits = jnp.pad(digits, ((0, 0), (0, extra)))
    empty = grid.shape[0] + 1 - run_bucket.shape[0]
    run_start, run_bucket = np.pad(run_start, (0, empty), mode="edge"), np.pad(run_bucket,
                                                                               (0, empty))
  data = _Evaluation(
      rank=None if rank is None else jnp.asarray(rank),
      source=jnp.asarray(source) if scheme == "poisson" else None,
      run_start=jnp.asarray(run_start.astype(np.int32)),
      run_bucket=jnp.asarray(run_bucket.astype(np.int32)),
      digits=digits, correct=jnp.asarray(correct), group_end=jnp.asarray(group_end),
      retained=jnp.asarray(retained.astype(np.int32)), bins=jnp.asarray(bins.astype(np.int32)))
  return data, grid.shape[0] + 1


def _metrics(bucket_sums, carry: _AreaCarry, retained, bins, thresholds, order, plan):
  """Every metric of a resample from its exact bucket sums and its area scan's final carry."""
  out = _sweep_and_calibration(bucket_sums, retained, bins, thresholds, order, plan)
  out.update(_areas_from_carry(carry, plan.convention))
  return out


def _evaluate(m, data, thresholds, order, plan):
  carry = _area_scan(m, data.correct, data.group_end, _area_carry_zero(), plan.convention)
  return _metrics(_weighted_bucket_sums(m, data, plan.num_buckets), carry, data.retained,
                  data.bins, thresholds, order, plan)


@functools.partial(jax.jit, static_argnames=("plan",))
def _evaluation_estimate_jit(data, thresholds, order, plan):
  m = jnp.ones(data.correct.shape, jnp.int32)
  return _evaluate(m, data, thresholds, order, plan)


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


@functools.partial(jax.jit, static_argnames=("plan",))
def _evaluation_poisson_jit(data, thresholds, order, ms, plan):
  return lax.map(lambda m: _evaluate(m, data, thresholds, order, plan), ms)


def _evaluation_block(data, thresholds, order, key, start, plan, num_chunks):
  """The metrics [num_chunks, ...] of resamples start, start + 1, ..."""
  if plan.scheme == "poisson":
    n = data.correct.shape[0]
    ms = _poisson_block_jit(data.source, jnp.int32(n), key, start, num_chunks)
    return _evaluation_poisson_jit(data, thresholds, order, ms, plan)
  return _evaluation_block_jit(data, thresholds, order, key, start, plan, num_chunks)


@functools.partial(jax.jit, static_argnames=("plan", "num_chunks"), **_RESAMPLING)
def _evaluation_block_jit(data, thresholds, order, key, start, plan, num_chunks):
  n = data.correct.shape[0]
  b = start + jnp.arange(num_chunks, dtype=jnp.uint32)

  def one(b):
    idx = _indices_from_seed(_seed(key, b), n)
    position = idx if data.rank is None else data.rank[idx]
    m = jnp.zeros((n,), jnp.int32).at[position].add(1, mode="promise_in_bounds")
    return _evaluate(m, data, thresholds, order, plan)

  return lax.map(one, b)


def _check_evaluation_options(num_bins, ece_norm, aurc_convention, normalize, resampling) -> int:
  """Checks the options of an evaluation bootstrap; returns ``num_bins`` as an int."""
  _stats.check_normalize(normalize)
  if aurc_convention not in ("step", "trapezoid"):
    raise ValueError(f"aurc_convention must be 'step' or 'trapezoid', got {aurc_convention!r} "
                     "(bootstrap_ci handles the published code's convention)")
  if ece_norm not in ("l1", "l2", "max"):
    raise ValueError(f"ece_norm must be 'l1', 'l2' or 'max', got {ece_norm!r}")
  if resampling not in RESAMPLING:
    raise ValueError(f"resampling must be 'multinomial' or 'poisson', got {resampling!r}")
  return _validation.positive_int(num_bins, "num_bins")


def _check_evaluation_data(confidences, correct, name: str):
  """Concrete [n] confidences in [0, 1] and boolean correctness."""
  c, k = _check_data(confidences, correct)
  if not _validation.is_concrete(c, k):
    raise TypeError(f"{name} runs on the host: call it on concrete arrays")
  if k.dtype != jnp.bool_:
    raise ValueError(f"{name} needs boolean (0/1) correctness")
  return c, k


def bootstrap_evaluation(confidences, correct, thresholds, *, key, num_resamples: int = 1000,
                         level: float = 0.95, num_bins: int = 15, ece_norm: str = "l1",
                         aurc_convention: str = "step", normalize: str = "retained",
                         resampling: str = "multinomial") -> BootstrapResult:
  """Percentile intervals of every metric of the evaluation report, from one sort.

  With ``resampling="multinomial"``, the same resamples as :func:`bootstrap_ci`
  for the same ``key`` (resample b draws the indices I_b of the module
  docstring); with ``"poisson"``, the Poisson bootstrap: resample b gives input
  row r the multiplicity m_br ~ Poisson(1) of :func:`_poisson_multiplicities`,
  independently per row, so the resample's size varies around n and shards of
  the data can be resampled apart (each row's multiplicity depends only on
  ``key``, b and its row number). It needs no gather or scatter of indices,
  and its intervals agree with the multinomial ones as n grows (Hanley and
  MacGibbon, 2006; Chamandy et al., 2012). Each resample is evaluated without sorting
  or binning anything again: the sweep at ``thresholds`` and the equal-width
  ECE family (``num_bins`` bins, ``ece_norm`` as :func:`~cwsa_jax.ece`'s
  ``norm``) come from one pass of the sweep's exact bucket sums over the
  merged grid of thresholds and bin edges, so they equal the values of
  :func:`~cwsa_jax.sweep` and :func:`~cwsa_jax.ece` on the gathered resample
  (to float32 rounding of the last divisions); AURC, AUGRC and E-AURC
  (``"step"`` or ``"trapezoid"``) come from the resample's multiplicities
  over the samples sorted once by decreasing confidence, summed in float32
  (a relative error of a few 1e-7). Each resample costs O(n).

  Args:
    confidences: [n] confidences in [0, 1] (concrete: this runs on the host).
    correct: [n] boolean correctness.
    thresholds: [T] thresholds in [0, 1).
    key, num_resamples, level: as in :func:`bootstrap_ci`.
    num_bins, ece_norm: the ECE's equal-width bins and norm (``"l1"``, ``"l2"``, ``"max"``).
    aurc_convention: ``"step"`` or ``"trapezoid"`` (the published code's
      convention depends on the order of tied samples: use :func:`bootstrap_ci`).
    normalize: the sweep's CWSA normalisation.
    resampling: ``"multinomial"`` (n indices drawn with replacement) or ``"poisson"``.

  Returns:
    :class:`BootstrapResult` whose fields are :class:`EvaluationMetrics`
    (``accuracy``, ``ece``, ``aurc``, ``eaurc``, ``augrc``, and the sweep's
    ``coverage``, ``selective_accuracy``, ``cwsa``, ``cwsa_plus`` [T]).
  """
  run = _EvaluationRun.prepare(confidences, correct, thresholds, num_bins, ece_norm,
                               aurc_convention, normalize, resampling, "bootstrap_evaluation")
  key, num_resamples, _ = _check_common(key, num_resamples, 1, run.n)
  level = _check_level(level)
  estimate = EvaluationMetrics(**run.estimate())
  samples = run.resample(lambda start, chunks: run.block(key, start, chunks), num_resamples)
  low, high = _interval_jit(samples, jnp.float32(level))
  return BootstrapResult(estimate, EvaluationMetrics(**low), EvaluationMetrics(**high))


class _EvaluationRun(NamedTuple):
  """One model's data of an evaluation bootstrap, sorted and bucketed once."""
  data: _Evaluation
  thresholds: jax.Array
  order: jax.Array  # of the thresholds
  plan: _Plan

  @classmethod
  def prepare(cls, confidences, correct, thresholds, num_bins, ece_norm, aurc_convention,
              normalize, resampling, name: str) -> "_EvaluationRun":
    """Checks the options and data (``name`` in the errors), then sorts and buckets."""
    num_bins = _check_evaluation_options(num_bins, ece_norm, aurc_convention, normalize,
                                         resampling)
    c, k = _check_evaluation_data(confidences, correct, name)
    n = c.shape[0]
    if n >= _MAX_EVALUATION_N[resampling]:
      raise ValueError(f"{name} takes n < {_MAX_EVALUATION_N[resampling]} samples "
                       f"with {resampling} resampling, got {n}: use bootstrap_ci")
    t = _validation.as_thresholds(thresholds)
    order, sorted_t = _sweep.sorted_thresholds(t)
    data, num_buckets = _prepare_evaluation(np.asarray(c, np.float32), np.asarray(k),
                                            np.asarray(sorted_t), num_bins, resampling)
    plan = _Plan(num_buckets, t.shape[0], num_bins, ece_norm, aurc_convention, normalize,
                 resampling)
    return cls(data, t, order, plan)

  @property
  def n(self) -> int:
    return self.data.correct.shape[0]

  def estimate(self) -> dict:
    return _evaluation_estimate_jit(self.data, self.thresholds, self.order, self.plan)

  def block(self, key, start, num_chunks) -> dict:
    """The metrics [num_chunks, ...] of resamples start, start + 1, ..."""
    return _evaluation_block(self.data, self.thresholds, self.order, key, start, self.plan,
                             num_chunks)

  def resample(self, block: Callable, num_resamples: int):
    """``block(start, num_chunks)`` over the resamples in host blocks (:func:`_run_blocks`)."""
    elements = (POISSON_BLOCK_ELEMENTS if self.plan.scheme == "poisson"
                else EVALUATION_BLOCK_ELEMENTS)
    return _run_blocks(lambda start, size, chunks: block(start, chunks), num_resamples, 1,
                       self.n, block_elements=elements)


@jax.jit
def _differences_jit(a, b):
  return jax.tree.map(_subtract, a, b)


def paired_evaluation(confidences_a, correct_a, confidences_b, correct_b, thresholds, *, key,
                      num_resamples: int = 1000, level: float = 0.95, num_bins: int = 15,
                      ece_norm: str = "l1", aurc_convention: str = "step",
                      normalize: str = "retained",
                      resampling: str = "multinomial") -> PairedBootstrapResult:
  """:func:`paired_bootstrap` of every metric of the evaluation report, one sort per model.

  Each model is sorted and bucketed once, as in :func:`bootstrap_evaluation`,
  and both get the same resamples: with ``"multinomial"`` the indices I_b of
  :func:`paired_bootstrap` (each model's multiplicities over its own sorted
  order), with ``"poisson"`` the same multiplicity m_br per input row. With
  theta*_b(a) and theta*_b(b) as :func:`bootstrap_evaluation` computes them,
  d*_b = theta*_b(a) - theta*_b(b) (exactly 0 where they are equal), and the
  interval and p-value are :func:`paired_bootstrap`'s. With multinomial
  resampling the values are those of ``paired_bootstrap`` of the same metrics
  to float32 rounding, at O(n) per resample instead of a sort.

  Args:
    confidences_a, correct_a, confidences_b, correct_b: as in
      :func:`paired_bootstrap` (boolean correctness, concrete arrays).
    thresholds, key, num_resamples, level, num_bins, ece_norm, aurc_convention,
      normalize, resampling: as in :func:`bootstrap_evaluation`.

  Returns:
    :class:`PairedBootstrapResult` whose fields are :class:`EvaluationMetrics`.

  Raises:
    ValueError: as :func:`bootstrap_evaluation`, and when the models' n differ.
  """
  options = (thresholds, num_bins, ece_norm, aurc_convention, normalize, resampling,
             "paired_evaluation")
  run_a = _EvaluationRun.prepare(confidences_a, correct_a, *options)
  run_b = _EvaluationRun.prepare(confidences_b, correct_b, *options)
  if run_a.n != run_b.n:
    raise ValueError(f"models a and b must be scored on the same samples: got n = {run_a.n} "
                     f"and n = {run_b.n}")
  key, num_resamples, _ = _check_common(key, num_resamples, 1, run_a.n)
  level = _check_level(level)
  est_a, est_b = run_a.estimate(), run_b.estimate()
  samples = run_a.resample(
      lambda start, chunks: (run_a.block(key, start, chunks), run_b.block(key, start, chunks)),
      num_resamples)
  d = _differences_jit(*samples)
  low, high, p_value = _paired_interval_jit(d, jnp.float32(level))
  return PairedBootstrapResult(*(EvaluationMetrics(**x) for x in (
      est_a, est_b, _differences_jit(est_a, est_b), low, high, p_value)))


_AREAS = ((_risk_coverage.aurc, "aurc"), (_risk_coverage.augrc, "augrc"),
          (_risk_coverage.eaurc, "eaurc"), (_risk_coverage.risk_coverage_summary, None))


def _area_options(fn: Callable, correct: jax.Array) -> tuple[str | None, str] | None:
  """(area, convention) when ``fn`` is one of the areas (None: the summary of all three),
  or a keyword-only partial of one, with a convention the area scan computes and boolean
  correctness the evaluation bootstrap sums exactly; else None."""
  if correct.dtype != jnp.bool_ or correct.shape[0] >= _MAX_EVALUATION_N["multinomial"]:
    return None
  for metric, name in _AREAS:
    keywords = _keywords(fn, metric, {"convention"})
    if keywords is not None:
      convention = keywords.get("convention", "step")
      return (name, convention) if convention in ("step", "trapezoid") else None
  return None


def _area_samples(name: str | None, convention: str, *models, key, num_resamples: int):
  """The areas [B] of :func:`bootstrap_ci`'s resamples of one model ``(confidences,
  correct)``, or the differences of two models' (:func:`paired_bootstrap`'s), from the
  evaluation bootstrap's one sort per model and area scan (its sweep and bins kept minimal);
  ``name`` None: the summary of all three areas."""
  runs = [_EvaluationRun.prepare(c, k, np.array([0.5], np.float32), 1, "l1", convention,
                                 "retained", "multinomial", "bootstrap_ci") for c, k in models]

  def areas(metrics):
    if name is None:
      return _risk_coverage.RiskCoverageSummary(metrics["aurc"], metrics["augrc"],
                                                metrics["eaurc"])
    return metrics[name]

  def block(start, chunks):
    values = [areas(run.block(key, start, chunks)) for run in runs]
    return values[0] if len(values) == 1 else _differences_jit(*values)

  return runs[0].resample(block, num_resamples)


# --- the Poisson bootstrap fed range by range (out-of-core data) -----------------------------

_MIN_RANGE_LENGTH = 1 << 16  # the smallest padded range length (one compilation per power of 2)


class _RangeState(NamedTuple):
  """Per resample: the exact bucket sums (hi, lo) [B, G + 1, 6] and the area scan's carry."""
  hi: jax.Array
  lo: jax.Array
  carry: _AreaCarry


def _range_update(m, data, state, plan):
  """``state`` after the range ``data`` with multiplicities ``m`` (one resample)."""
  hi, lo = _exact.add((state.hi, state.lo), _weighted_bucket_sums(m, data, plan.num_buckets))
  carry = _area_scan(m, data.correct, data.group_end, state.carry, plan.convention)
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
    self._state = _run_blocks(
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
