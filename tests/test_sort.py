"""cwsa_jax._sort (host and device halves, on CPU) and the exact conversions of cwsa_jax._exact."""

from __future__ import annotations

import fractions
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import _exact, _sort

RNG = np.random.default_rng(0)
KEYS = RNG.integers(-40, 40, (3, 500)).astype(np.int32)  # many ties
FLAGS = RNG.integers(0, 2, (3, 500)).astype(np.int32)


def _with_setting(fn, name: str, value):
  """``fn`` run with ``_sort.<name>`` set to ``value``."""
  def call(*args, **kwargs):
    saved = getattr(_sort, name)
    setattr(_sort, name, value)
    try:
      return fn(*args, **kwargs)
    finally:
      setattr(_sort, name, saved)
  return call


def _without_buffer_callback(fn):
  """``fn`` through the jax.pure_callback fallback (older JAX has no buffer_callback)."""
  return _with_setting(fn, "_buffer_callback", None)


def _radix_order(fn, radix: bool):
  """``fn`` with the host's stable order found by the radix passes (True) or NumPy's sort of
  64-bit words (False), whichever this CPU would pick (``_sort._RADIX_ORDER``)."""
  return _with_setting(fn, "_RADIX_ORDER", radix)


def _both(host, device):
  """The public function's branches, each runnable on CPU (the host one is what CPU lowers),
  the host one with either way of finding a stable order."""
  impls = [_radix_order(host, True), _radix_order(host, False),
           _without_buffer_callback(_radix_order(host, True)),
           _without_buffer_callback(_radix_order(host, False)), device]
  return pytest.mark.parametrize("impl", impls, ids=["host_radix", "host_words", "host_radix_pure_callback",
                                                     "host_words_pure_callback", "device"])


@_both(_sort._host_sort, _sort._device_sort)
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
def select_form(request, monkeypatch):
  """Order statistics by the radix select (CPU and others) or by the CUDA form (one sort)."""
  if request.param == "cuda_sort":
    monkeypatch.setattr(_sort, "_select_by_platform", lambda *a, cuda, default: cuda(*a))
  return request.param


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
  got = jax.jit(lambda k: _sort.order_statistics(k, positions, key_bits=30))(keys)
  np.testing.assert_array_equal(got, np.sort(keys)[np.minimum(positions, n - 1)])


def test_order_statistics_vmapped(select_form):
  keys = RNG.integers(0, 2**31 - 1, (3, 400)).astype(np.int32)
  got = jax.vmap(lambda k: _sort.order_statistics(k, [0, 17, 399]))(keys)
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
