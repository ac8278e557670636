"""cwsa_jax._kernels._sort (host and device halves, on CPU) and the exact conversions of cwsa_jax._exact."""

from __future__ import annotations

import fractions
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import _exact
from cwsa_jax._kernels import _dispatch, _sort

RNG = np.random.default_rng(0)
KEYS = RNG.integers(-40, 40, (3, 500)).astype(np.int32)  # many ties
FLAGS = RNG.integers(0, 2, (3, 500)).astype(np.int32)


def _without_buffer_callback(fn):
  """``fn`` through the jax.pure_callback fallback: as with an older JAX, which has no
  buffer_callback (the installed JAX simulated, not a choice of the kit's)."""
  def call(*args, **kwargs):
    saved = _sort._buffer_callback
    _sort._buffer_callback = None
    try:
      return fn(*args, **kwargs)
    finally:
      _sort._buffer_callback = saved
  return call


def _radix_order(fn, radix: bool):
  """The host form ``fn`` with its stable order found by the radix passes (True) or NumPy's
  sort of 64-bit words (False), whichever this CPU would pick (``_sort._RADIX_ORDER``)."""
  return functools.partial(fn, radix=radix)


def _both(host, device, *, stable: bool = True):
  """The public function's branches, each runnable on CPU (the host one is what CPU lowers),
  the host one of a stable sort with either way of finding a stable order."""
  hosts = ({"host_radix": _radix_order(host, True), "host_words": _radix_order(host, False)}
           if stable else {"host": host})
  impls = {**hosts, **{f"{k}_pure_callback": _without_buffer_callback(f) for k, f in hosts.items()},
           "device": device}
  return pytest.mark.parametrize("impl", list(impls.values()), ids=list(impls))


@pytest.mark.parametrize("radix", [True, False])
def test_stable_sorts_take_the_configured_order(radix):
  """``Kernels.stable_by_radix`` picks the host's way to a stable order (NumPy's sort of
  64-bit words builds them as uint32 pairs; the radix passes read the int32 keys): the same
  order either way."""
  kernels = _dispatch.Kernels(stable_by_radix=radix)
  for fn in (lambda k: _sort.sort_with_order(k, kernels=kernels),
             lambda k: _sort.stable_flag_counts(k, FLAGS[0], kernels=kernels)):
    assert ("ui32" in jax.jit(fn).lower(KEYS[0]).as_text()) == (not radix)
  keys, order = _sort.sort_with_order(KEYS[0], kernels=kernels)
  np.testing.assert_array_equal(order, np.argsort(KEYS[0], kind="stable"))
  np.testing.assert_array_equal(
      _sort.stable_flag_counts(KEYS[0], FLAGS[0], kernels=kernels),
      np.cumsum(FLAGS[0][np.argsort(KEYS[0], kind="stable")]))


@_both(_sort._host_sort, _sort._device_sort, stable=False)
def test_sort_padded_and_vmapped(impl):
  got = jax.jit(jax.vmap(functools.partial(impl, length=503, fill=99)))(KEYS)
  np.testing.assert_array_equal(got[:, :500], np.sort(KEYS, axis=-1))
  np.testing.assert_array_equal(got[:, 500:], 99)


@_both(_sort._host_sort_with_order, _sort._device_sort_with_order)
def test_sort_with_order_is_stable(impl):
  keys, order = jax.jit(jax.vmap(functools.partial(impl, length=502, fill=99)))(KEYS)
  np.testing.assert_array_equal(order[:, :500], np.argsort(KEYS, axis=-1, kind="stable"))
  np.testing.assert_array_equal(keys[:, :500], np.sort(KEYS, axis=-1))
  np.testing.assert_array_equal(order[:, 500:], 500)
  np.testing.assert_array_equal(keys[:, 500:], 99)


@_both(_sort._host_stable_flag_counts, _sort._device_stable_flag_counts)
def test_stable_flag_counts(impl):
  got = jax.jit(jax.vmap(impl))(KEYS, FLAGS)
  order = np.argsort(KEYS, axis=-1, kind="stable")
  np.testing.assert_array_equal(got, np.cumsum(np.take_along_axis(FLAGS, order, axis=-1), axis=-1))


@pytest.mark.parametrize("radix", [True, False])
def test_stable_orders_of_extreme_keys_and_a_large_batch(radix):
  # Keys at both ends of int32 (the word's high half flips the sign bit) and more
  # than 2^16 samples (both radix digits and the word's position bits in use).
  keys = RNG.integers(-2**31, 2**31 - 1, (2, 70_000), dtype=np.int64).astype(np.int32)
  keys[:, :5] = [-2**31, 2**31 - 1, 0, -1, -2**31]
  keys[:, 5000:9000] = keys[:, :4000]  # ties across the array
  flags = RNG.integers(0, 2, keys.shape).astype(np.int32)
  order = np.argsort(keys, axis=-1, kind="stable")
  got_keys, got_order = jax.jit(jax.vmap(_radix_order(
      functools.partial(_sort._host_sort_with_order, length=70_000, fill=0), radix)))(keys)
  np.testing.assert_array_equal(got_order, order)
  np.testing.assert_array_equal(got_keys, np.sort(keys, axis=-1))
  counts = jax.jit(jax.vmap(_radix_order(_sort._host_stable_flag_counts, radix)))(keys, flags)
  np.testing.assert_array_equal(counts, np.cumsum(np.take_along_axis(flags, order, axis=-1), axis=-1))


ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\nprocessor\t: 1\n"


@pytest.mark.parametrize("avx512, cpuinfo, slow", [
    (True, ZEN4, True),
    (False, ZEN4, False),  # NumPy limited to AVX2 (NPY_DISABLE_CPU_FEATURES=X86_V4)
    (True, ZEN4.replace("family\t: 25", "family\t: 26"), False),  # Zen 5
    (True, "vendor_id\t: GenuineIntel\ncpu family\t: 6\n", False),
    (True, "", False),  # no /proc/cpuinfo
])
def test_radix_order_only_where_numpys_avx512_sort_runs_on_zen4(avx512, cpuinfo, slow):
  assert _sort._avx512_sort_is_slow(avx512, cpuinfo) is slow


def test_public_sorts_use_the_host_branch_on_cpu():
  text = jax.jit(_sort.sort).lower(KEYS[0]).as_text()
  assert "callback" in text
  np.testing.assert_array_equal(_sort.sort(KEYS[0]), np.sort(KEYS[0]))


@pytest.mark.parametrize("impl", [_sort._sequential_cumsum, _sort._device_cumsum])
def test_cumsum(impl):
  x = RNG.integers(0, 9, (4, 300)).astype(np.int32)
  for axis in (0, 1):
    np.testing.assert_array_equal(jax.jit(functools.partial(impl, axis=axis))(x),
                                  np.cumsum(x, axis=axis))


@pytest.fixture(params=["radix_select", "cuda_sort"])
def select_form(request):
  """Kernels whose order statistics are the radix select (the CPU's form) or the CUDA form
  (one sort), both forced."""
  return _dispatch.Kernels(platform="cpu" if request.param == "radix_select" else "cuda")


def _sorts(fn, *args) -> bool:
  """Whether ``fn`` sorts (a ``sort`` primitive in its jaxpr): the CUDA form does, the radix
  select does not."""
  return re.search(r"\bsort\[", str(jax.make_jaxpr(fn)(*args))) is not None


@pytest.mark.parametrize("case", ["uniform", "few_values", "confidences", "one"])
def test_order_statistics_equal_sorted_positions(case, select_form):
  n = {"one": 1}.get(case, 3001)
  if case == "uniform":
    keys = RNG.integers(0, 2**30, n)
  elif case == "few_values":  # every rank in a bucket shared with many ties
    keys = RNG.integers(0, 4, n) + 2**29
  else:
    keys = RNG.uniform(0, 1, n).astype(np.float32).view(np.int32)
  keys = keys.astype(np.int32)
  positions = [0, 1, n // 3, n // 3, n // 2, n - 1, n + 5]  # repeats; past the end clamps
  select = lambda k: _sort.order_statistics(  # noqa: E731
      k, positions, key_bits=30, kernels=select_form)
  assert _sorts(select, keys) == (select_form.platform == "cuda")
  got = jax.jit(select)(keys)
  np.testing.assert_array_equal(got, np.sort(keys)[np.minimum(positions, n - 1)])


def test_order_statistics_vmapped(select_form):
  keys = RNG.integers(0, 2**31 - 1, (3, 400)).astype(np.int32)
  select = jax.vmap(lambda k: _sort.order_statistics(k, [0, 17, 399], kernels=select_form))
  assert _sorts(select, keys) == (select_form.platform == "cuda")
  got = select(keys)
  np.testing.assert_array_equal(got, np.sort(keys, axis=-1)[:, [0, 17, 399]])


def test_exact_float_is_the_rounded_exact_integer():
  rng = np.random.default_rng(1)
  for _ in range(300):
    terms, exact = [], fractions.Fraction(0)
    for _ in range(rng.integers(1, 7)):
      sign = int(rng.choice([-1, 1]))
      hi, lo, place = int(rng.integers(0, 10**7)), int(rng.integers(0, 4096)), int(rng.integers(-3, 2))
      terms.append((sign, jnp.int32(hi), jnp.int32(lo), place))
      exact += sign * (hi * 4096 + lo) * fractions.Fraction(4096) ** place
    got = float(_exact.exact_float(terms))
    assert got == pytest.approx(float(exact), rel=4 * 2.0**-24, abs=0.0)
  # Full relative precision after cancellation: 1 - 2^-24 from two sums near 10^7 * 4096.
  terms = [(1, jnp.int32(10**7), jnp.int32(5), 0), (-1, jnp.int32(10**7), jnp.int32(4), 0),
           (-1, jnp.int32(0), jnp.int32(1), -2)]
  assert float(_exact.exact_float(terms)) == 1.0 - 2.0**-24


def test_wide_and_grid_digits_are_exact():
  x = np.concatenate([RNG.random(1000), [0.0, 1.0, 2.0**-12, 0.5]]).astype(np.float32)
  digits = [np.asarray(d, np.float64) for d in _exact.wide_digits(jnp.asarray(x), 3)]
  np.testing.assert_array_equal(sum(d * 4096.0 ** -(j + 1) for j, d in enumerate(digits)),
                                x.astype(np.float64))
  assert digits[0].max() <= 4096 and max(d.max() for d in digits[1:]) <= 4095
  u = (1.0 - x[x >= 0.5]).astype(np.float32)  # multiples of 2^-24
  hi, lo = (np.asarray(d, np.float64) for d in _exact.grid_columns(jnp.asarray(u)))
  np.testing.assert_array_equal((hi * 4096 + lo) * 2.0**-24, u.astype(np.float64))


def test_host_sort_of_batched_rows_in_place():
  x = RNG.integers(-2**31, 2**31 - 1, (3, 70_000), dtype=np.int64).astype(np.int32)
  got = jax.jit(jax.vmap(functools.partial(_sort._host_sort, length=70_002, fill=7)))(x)
  np.testing.assert_array_equal(got[:, :70_000], np.sort(x, axis=-1))
  np.testing.assert_array_equal(got[:, 70_000:], 7)
