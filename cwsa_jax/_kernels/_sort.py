"""Sorting with the fastest primitive of each backend.

XLA sorts well on GPUs and TPUs, but on CPU ``lax.sort`` is slower than
NumPy's ``np.sort``. So on the CPU backend the sorts here run NumPy on the
host (``_host_*``: through ``jax.experimental.buffer_callback``, which hands
NumPy XLA's own buffers to sort in place, or :func:`jax.pure_callback` on
older JAX, which copies them), and everywhere else they are plain
``lax.sort`` (``_device_*``); ``_dispatch.Kernels.pick`` (by default
:func:`jax.lax.platform_dependent`) picks the branch when the computation is
lowered, so a GPU program never contains the callback. Both branches return
identical values (integer keys sort exactly; ties are broken as documented per
function), so results do not depend on the backend. The callbacks are pure, and batched with
``vmap_method="expand_dims"`` (NumPy sorts along the last axis), so the
functions stay ``jit``- and ``vmap``-able. They have no derivative (integer
keys); callers sort integer keys derived from the data and gather
differentiable values by the returned order.

Stable orders (ties in input order) sort 64-bit words, the key above the
position, with NumPy's ``np.sort`` in XLA's buffer. Where NumPy's AVX-512
sort is slow (AMD Zen 4, :func:`_avx512_sort_is_slow`) they take a two-pass
radix sort of 16-bit digits instead; either way the order is the same. The
unstable ``sort`` of int32 keys has no faster NumPy form there: on Zen 4 it
runs several times faster when NumPy is started with
``NPY_DISABLE_CPU_FEATURES=X86_V4`` (its AVX2 sort), a choice for the user's
process that a library cannot make after NumPy is imported.

Order statistics need no sort: :func:`order_statistics` is a radix select
in plain XLA (on CUDA GPUs, whose scatter-adds contend, one ``lax.sort``).

Measured in ``benchmarks/bench_vs_numpy.py`` (the AURC family, the
risk-coverage curve, equal-mass calibration bins), with either NumPy dispatch.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _mesh

try:  # in-place host callbacks (newer JAX): no copies of the data in or out
  from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # pragma: no cover - older JAX: jax.pure_callback
  _buffer_callback = None


def _host(fill, result_shapes, *args, aliases=None):
  """Runs ``fill(outs, *ins)`` on the host: NumPy views of the inputs, and outputs to fill in place.

  Samples are on the last axis; under ``vmap`` both carry leading batch axes.
  An output aliased to an input (``aliases``: {input index: output index})
  arrives holding that input. With ``jax.experimental.buffer_callback``
  (newer JAX) the views are XLA's own buffers, so nothing is copied;
  otherwise ``jax.pure_callback`` copies the data in and out. Inside a
  ``shard_map`` the outputs vary over the inputs' manual mesh axes, as
  the ``lax.sort`` branch's do.
  """
  aliases = aliases or {}
  shapes = result_shapes if isinstance(result_shapes, tuple) else (result_shapes,)
  if _buffer_callback is not None:
    def callback(ctx, out, *ins):
      del ctx
      outs = out if isinstance(out, (tuple, list)) else (out,)
      fill([np.asarray(o) for o in outs], *(np.asarray(x) for x in ins))
    return _mesh.vary_like(_buffer_callback(callback, result_shapes, vmap_method="expand_dims",
                                            input_output_aliases=aliases)(*args), args)

  def function(*ins):
    ins = [np.asarray(x) for x in ins]
    batch = ins[0].shape[:-1]
    outs = [np.empty(batch + tuple(r.shape[-1:]), r.dtype) for r in shapes]
    for i, o in aliases.items():
      outs[o][...] = ins[i]
    fill(outs, *ins)
    return tuple(outs) if isinstance(result_shapes, tuple) else outs[0]

  return _mesh.vary_like(
      jax.pure_callback(function, result_shapes, *args, vmap_method="expand_dims"), args)


def _per_backend(host, device, *args, kernels: _dispatch.Kernels, **static):
  """``host(*args, **static)`` when lowered for CPU, ``device(*args, **static)`` otherwise."""
  return kernels.pick("sort", *args, cpu=functools.partial(host, **static),
                      default=functools.partial(device, **static))


def _padded(x: jax.Array, length: int | None, fill) -> jax.Array:
  if length is None or length == x.shape[-1]:
    return x
  tail = jnp.full(x.shape[:-1] + (length - x.shape[-1],), fill, x.dtype)
  return jnp.concatenate([x, tail], axis=-1)


def _shape(x: jax.Array, length: int, dtype=None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(x.shape[:-1] + (length,), x.dtype if dtype is None else dtype)


def _host_sort(keys, length, fill):
  n = keys.shape[-1]

  def sort_in_place(outs, padded):
    del padded  # outs[0] is the same buffer
    outs[0][..., :n].sort(axis=-1)

  # XLA pads (fused with whatever computed the keys); NumPy sorts that buffer in place.
  return _host(sort_in_place, _shape(keys, length), _padded(keys, length, fill), aliases={0: 0})


def _device_sort(keys, length, fill):
  return _padded(lax.sort(keys), length, fill)


def sort(keys: jax.Array, *, length: int | None = None, fill: int = 0,
         kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """Ascending sort of integer ``keys`` [n] (``np.sort`` on CPU, ``lax.sort`` elsewhere).

  With ``length`` (static, >= n) the result is [length]: the sorted keys,
  then ``fill``.
  """
  length = keys.shape[-1] if length is None else length
  return _per_backend(_host_sort, _device_sort, keys, length=length, fill=fill, kernels=kernels)


def cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
  """The fields of the first processor in the text of Linux's ``/proc/cpuinfo``."""
  first = cpuinfo.split("\n\n")[0]
  return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}


def _avx512_sort_is_slow(avx512_dispatched: bool, cpuinfo: str) -> bool:
  """True where NumPy sorts with AVX-512 (``avx512_dispatched``) on an AMD Zen 4 CPU.

  NumPy's AVX-512 sort (x86-simd-sort) writes each partition with the
  memory-destination form of the compress instructions, which Zen 4 runs in
  microcode: there its int32 and int64 sorts are several times slower than
  its own AVX2 ones (``NPY_DISABLE_CPU_FEATURES=X86_V4``) and than the radix
  order below (``benchmarks/bench_vs_numpy.py`` records which NumPy dispatch a
  run had). Zen 5 (family 26) and Intel CPUs run it fast. ``cpuinfo``: the
  text of Linux's ``/proc/cpuinfo`` (empty elsewhere: assumed fast).
  """
  info = cpuinfo_fields(cpuinfo)
  return (avx512_dispatched and info.get("vendor_id") == "AuthenticAMD"
          and info.get("cpu family") == "25")


def numpy_cpu_features() -> dict[str, bool]:
  """The CPU features NumPy dispatches to in this process (after NPY_DISABLE_CPU_FEATURES)."""
  try:
    from numpy._core._multiarray_umath import __cpu_features__ as features
  except ImportError:  # pragma: no cover - NumPy 1.x
    from numpy.core._multiarray_umath import __cpu_features__ as features
  return dict(features)


def read_cpuinfo() -> str:
  """The text of ``/proc/cpuinfo`` (its first 8 KiB; empty where there is none)."""
  try:
    with open("/proc/cpuinfo") as f:
      return f.read(8192)
  except OSError:  # pragma: no cover - not Linux
    return ""


# How the host finds a stable order: NumPy's sort of 64-bit words (key, position),
# or, where that sort is slow (above), a two-pass radix sort of 16-bit digits.
_RADIX_ORDER = _avx512_sort_is_slow(bool(numpy_cpu_features().get("AVX512_SKX")),
                                    read_cpuinfo())


def _numpy_stable_order(keys: np.ndarray) -> np.ndarray:
  """Input positions of int32 ``keys`` [..., n] in stable ascending order (a two-pass radix sort).

  The keys, mapped to uint32 in order, are sorted by their low then their
  high 16 bits with NumPy's stable sort of 16-bit integers (itself a radix
  sort): ties keep their input order, and it is faster than the int64
  (key, position) sort that would otherwise make a stable order.
  """
  unsigned = keys.view(np.uint32) ^ np.uint32(0x80000000)
  first = np.argsort((unsigned & 0xFFFF).astype(np.uint16), axis=-1, kind="stable")
  high = np.take_along_axis((unsigned >> 16).astype(np.uint16), first, axis=-1)
  return np.take_along_axis(first, np.argsort(high, axis=-1, kind="stable"), axis=-1)


def _words(keys: jax.Array, low: jax.Array) -> jax.Array:
  """uint32 [..., 2n]: each sample's 64-bit word, ``(keys ^ 2^31) * 2^32 + low``, in memory order.

  Built by XLA in one pass; NumPy sorts it in place as uint64 (unsigned order
  of the words = order of the int32 keys, ties by ``low``).
  """
  high = lax.bitcast_convert_type(keys, jnp.uint32) ^ jnp.uint32(0x80000000)
  pair = (low, high) if np.little_endian else (high, low)
  return jnp.stack(pair, axis=-1).reshape(keys.shape[:-1] + (2 * keys.shape[-1],))


def _sorted_words(keys: jax.Array, low: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(high, low) uint32 [..., n] of :func:`_words`, sorted by NumPy in XLA's buffer."""
  def sort_in_place(outs, words):
    del words  # outs[0] is the same buffer
    outs[0].view(np.uint64).sort(axis=-1)

  words = _words(keys, low)
  words = _host(sort_in_place, _shape(words, words.shape[-1]), words, aliases={0: 0})
  pair = words.reshape(keys.shape + (2,))
  high, low = (pair[..., 1], pair[..., 0]) if np.little_endian else (pair[..., 0], pair[..., 1])
  return high, low


def _unsigned_key(high: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(high ^ jnp.uint32(0x80000000), jnp.int32)


def _stable_by_radix(kernels: _dispatch.Kernels) -> bool:
  return _RADIX_ORDER if kernels.stable_by_radix is None else kernels.stable_by_radix


def _host_sort_with_order(keys, length, fill, *, radix: bool):
  n = keys.shape[-1]
  if not radix:
    high, position = _sorted_words(keys, lax.iota(jnp.uint32, n))
    return (_padded(_unsigned_key(high), length, fill),
            _padded(lax.bitcast_convert_type(position, jnp.int32), length, n))

  def sort_with_order(outs, keys):
    out_keys, order = outs
    stable = _numpy_stable_order(keys)
    out_keys[..., :n] = np.take_along_axis(keys, stable, axis=-1)
    order[..., :n] = stable
    out_keys[..., n:], order[..., n:] = fill, n

  return _host(sort_with_order, (_shape(keys, length), _shape(keys, length, jnp.int32)), keys)


def _device_sort_with_order(keys, length, fill):
  n = keys.shape[-1]
  keys, order = lax.sort((keys, lax.iota(jnp.int32, n)), num_keys=1, is_stable=True)
  return _padded(keys, length, fill), _padded(order, length, n)


def sort_with_order(keys: jax.Array, *, length: int | None = None, fill: int = 0,
                    kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> tuple[jax.Array, jax.Array]:
  """Stable ascending sort of int32 ``keys`` [n]: the sorted keys and the input position of each.

  Tied keys keep their input order. With ``length`` (static, >= n) both are
  [length], the keys padded with ``fill`` and the positions with n (out of
  range: ``jnp.take(x, order, mode="fill")`` gives the fill value there).
  Gathering values by ``order`` keeps them differentiable.
  """
  if keys.dtype != jnp.int32:
    raise TypeError(f"sort_with_order needs int32 keys, got {keys.dtype}")
  length = keys.shape[-1] if length is None else length
  host = functools.partial(_host_sort_with_order, radix=_stable_by_radix(kernels))
  return _per_backend(host, _device_sort_with_order, keys, length=length, fill=fill,
                      kernels=kernels)


def _host_stable_flag_counts(keys, flags, *, radix: bool):
  if not radix:  # each flag rides in the low bit, below the position
    low = (lax.iota(jnp.uint32, keys.shape[-1]) << 1) | flags.astype(jnp.uint32)
    _, low = _sorted_words(keys, low)
    return _sequential_cumsum(lax.bitcast_convert_type(low & 1, jnp.int32), axis=-1)

  def count(outs, keys, flags):
    # The two-pass radix sort of _numpy_stable_order, with each flag riding
    # along the high digit: two gathers instead of three.
    unsigned = keys.view(np.uint32) ^ np.uint32(0x80000000)
    first = np.argsort((unsigned & 0xFFFF).astype(np.uint16), axis=-1, kind="stable")
    ride = (unsigned >> 15) & np.uint32(0x1FFFE)  # high digit << 1
    ride |= flags.astype(np.uint32)
    ride = np.take_along_axis(ride, first, axis=-1)
    second = np.argsort((ride >> 1).astype(np.uint16), axis=-1, kind="stable")
    ordered = np.take_along_axis(ride, second, axis=-1)
    ordered &= 1
    np.cumsum(ordered, axis=-1, out=outs[0], dtype=np.int32)

  return _host(count, _shape(flags, flags.shape[-1]), keys, flags)


def _device_stable_flag_counts(keys, flags):
  return _device_cumsum(lax.sort((keys, flags), num_keys=1, is_stable=True)[1], axis=-1)


def stable_flag_counts(keys: jax.Array, flags: jax.Array, *,
                       kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """Running count of the 0/1 int32 ``flags`` [n] in the stable ascending order of int32 ``keys``.

  Entry j is the number of flags among the first j + 1 samples when sorted by
  key, ties in input order (inclusive prefix sums; exact integers).
  """
  if keys.dtype != jnp.int32 or flags.dtype != jnp.int32:
    raise TypeError(f"stable_flag_counts needs int32 keys and flags, got {keys.dtype}, {flags.dtype}")
  host = functools.partial(_host_stable_flag_counts, radix=_stable_by_radix(kernels))
  return _per_backend(host, _device_stable_flag_counts, keys, flags, kernels=kernels)


def _sequential_cumsum(x: jax.Array, axis: int) -> jax.Array:
  x = jnp.moveaxis(x, axis, 0)
  step = lambda carry, v: (carry + v, carry + v)
  _, out = lax.scan(step, _mesh.vary_like(jnp.zeros(x.shape[1:], x.dtype), x), x, unroll=8)
  return jnp.moveaxis(out, 0, axis)


def _device_cumsum(x: jax.Array, axis: int) -> jax.Array:
  if jnp.issubdtype(x.dtype, jnp.integer):  # exact in any order: one library scan on GPUs
    return lax.cumsum(x, axis=axis % x.ndim)
  return lax.associative_scan(jnp.add, x, axis=axis)  # float: tree-shaped, error O(log n)


def cumsum(x: jax.Array, axis: int = 0, *,
           kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """Inclusive prefix sums along ``axis``: a sequential loop on CPU, a parallel scan elsewhere.

  XLA:CPU runs ``lax.associative_scan`` and ``jnp.cumsum`` several times
  slower than one sequential pass (and compiles them much more slowly); on
  GPUs a sequential loop would launch a kernel per element.
  """
  return _per_backend(_sequential_cumsum, _device_cumsum, x, axis=axis, kernels=kernels)


def clip_unit(x: jax.Array) -> jax.Array:
  """``clip(x, 0, 1)`` of float32 ``x`` with -0.0 and NaN as +0.0."""
  return jnp.minimum(jnp.where(x > 0, x, jnp.float32(0.0)), jnp.float32(1.0))


def float_key(x: jax.Array) -> jax.Array:
  """int32 key ordering like ``clip(x, 0, 1)`` for float32 ``x`` (-0.0 and NaN as 0).

  The bit patterns of non-negative float32 values order like the values; the
  keys lie in [0, 0x3F800000] (below 2^30).
  """
  return lax.bitcast_convert_type(clip_unit(x), jnp.int32)


def order_statistics(keys: jax.Array, positions: Sequence[int], *, key_bits: int = 31,
                     kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """The sorted ``keys`` [n] at the static ``positions`` (clamped to n - 1).

  A two-level radix select, pure XLA (faster than ``np.partition`` on CPU):
  a histogram of the high bits of every key finds the bucket holding each
  wanted rank and the rank within it; a second histogram of the low bits,
  over the keys of those buckets only, finds the exact key. Two scatter-add
  passes over the data and prefix sums over the histograms. On CUDA GPUs,
  where those scatter-adds contend and ``lax.sort`` is fast, one sort and a
  gather instead (unless ``kernels.select_by_sort`` is False); the values are the same.

  Args:
    keys: [n] int32 keys in [0, 2^key_bits).
    positions: static 0-based ranks, ascending.
    key_bits: static bound on the keys' bits (at most 31).
    kernels: picks the CUDA form or the radix select.
  """
  n = keys.shape[-1]
  positions = np.minimum(np.asarray(positions, np.int64), n - 1)
  if positions.shape[0] == 0:
    return jnp.zeros((0,), keys.dtype)
  select = functools.partial(_radix_select, positions=positions, key_bits=key_bits,
                             kernels=kernels)
  if not kernels.select_by_sort:
    return select(keys)
  return kernels.pick("select", keys, cuda=functools.partial(_sorted_at, positions=positions),
                      default=select)


def _sorted_at(keys: jax.Array, *, positions: np.ndarray) -> jax.Array:
  return lax.sort(keys)[positions]



def _radix_select(keys: jax.Array, *, positions: np.ndarray, key_bits: int,
                  kernels: _dispatch.Kernels) -> jax.Array:
  num = positions.shape[0]
  low_bits = key_bits // 2 - 1
  num_high, num_low = 1 << (key_bits - low_bits), 1 << low_bits
  ones = jnp.ones(keys.shape, jnp.int32)
  high = keys >> low_bits
  hist = jax.ops.segment_sum(ones, high, num_segments=num_high)
  cum = cumsum(hist, kernels=kernels)  # keys in buckets <= b
  rank = jnp.asarray(positions, jnp.int32)
  bucket = jnp.searchsorted(cum, rank, side="right").astype(jnp.int32)
  rank = rank - (cum[bucket] - hist[bucket])  # rank within the bucket
  # One slot per distinct bucket (positions ascending, so buckets are too).
  slot = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), jnp.int32),
                                     (bucket[1:] != bucket[:-1]).astype(jnp.int32)]))
  table = jnp.full((num_high,), num, jnp.int32).at[bucket].set(slot)  # num: no slot
  ids = table[high] * num_low + (keys & (num_low - 1))  # keys of other buckets: out of range
  low_hist = jax.ops.segment_sum(ones, ids, num_segments=num * num_low).reshape(num, num_low)
  low_cum = cumsum(low_hist, axis=1, kernels=kernels)[slot]
  low = jax.vmap(lambda row, r: jnp.searchsorted(row, r, side="right"))(low_cum, rank)
  return (bucket << low_bits) | low.astype(keys.dtype)
