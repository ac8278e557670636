"""Exact int32 sums over many bins: no partial sum wraps, whatever the number of bins.

Whole 12-bit limbs summed over more than 2^19 bins wrap int32 (a RiskCoverageState of 12
mantissa bits has 1,032,193 bins: 4095 in every low limb summed to -68,136,961, and a
state of about 2^31 samples or more gave a wrong AURC). The sums below are crafted with
every limb at its largest where that is the point, and checked against exact integer
references (NumPy int64 where the bounds are asserted, Python integers for totals).
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import _exact
from cwsa_jax._states._risk_coverage_state import num_rc_bins
from cwsa_jax.streaming import RiskCoverageState

MAX_BINS = num_rc_bins(12)  # the largest state: 1,032,193 bins
WHOLE_LIMBS = 1 << 19  # the most entries whole 12-bit limbs are summed over
WIDTH = 4  # a RiskCoverageState's columns (count, three loss digits)

_wide_suffix = jax.jit(_exact.wide_suffix_sums)
_pair_suffix = jax.jit(_exact.suffix_sums)
_pair_total = jax.jit(lambda hi, lo: _exact._carried_sums(
    functools.partial(jnp.sum, axis=0), [lo], hi, hi.shape[0]))


def _crafted_wide(bins: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Canonical (top, hi, lo) [bins, 4] of a state within capacity: column 0 every limb at its
  largest, column 1 random, column 2 the low limb at its largest only, column 3 the upper
  half of hi at its largest; the tops of each column add up to at most TOP_CAPACITY."""
  rng = np.random.default_rng(seed)
  top_max = _exact.TOP_CAPACITY // bins - 1  # + 1 for the carries from hi and lo
  top = np.zeros((bins, WIDTH), np.int64)
  hi = np.zeros((bins, WIDTH), np.int64)
  lo = np.zeros((bins, WIDTH), np.int64)
  top[:, 0], hi[:, 0], lo[:, 0] = top_max, (1 << 24) - 1, 4095
  top[:, 1] = rng.integers(0, top_max + 1, bins)
  hi[:, 1] = rng.integers(0, 1 << 24, bins)
  lo[:, 1] = rng.integers(0, 4096, bins)
  lo[:, 2] = 4095
  hi[:, 3], lo[:, 3] = 0xFFF000, rng.integers(0, 4096, bins)
  return top, hi, lo


def _reverse_cumsum(x: np.ndarray) -> np.ndarray:
  return np.cumsum(x[::-1], axis=0)[::-1]


def _suffix_reference(top, hi, lo):
  """Exact suffix sums as (top, hi, lo), in int64: the 36 low bits and the tops apart."""
  low = _reverse_cumsum(hi * 4096 + lo)  # below 2^36 2^20 = 2^56
  assert low.max() < 1 << 62
  tops = _reverse_cumsum(top) + (low >> 36)
  return tops, (low >> 12) & ((1 << 24) - 1), low & 4095


def _python_total(top, hi, lo, column: int) -> int:
  """The exact column total as a Python integer (each limb's int64 sum is below 2^45)."""
  return (int(np.sum(top[:, column])) << 36) + (int(np.sum(hi[:, column])) << 12) \
      + int(np.sum(lo[:, column]))


def test_piece_bits_bound_every_partial_sum():
  for count in [1, 1000, WHOLE_LIMBS, WHOLE_LIMBS + 1, MAX_BINS, 1 << 25, (1 << 25) + 1, 1 << 30]:
    bits = _exact.piece_bits(count)
    assert 12 % bits == 0 and count * (1 << bits) <= 1 << 31, count
    wider = [w for w in (12, 6, 4, 3, 2, 1) if w > bits]
    assert not wider or count * (1 << min(wider)) > 1 << 31, count
  assert _exact.piece_bits(WHOLE_LIMBS) == 12 and _exact.piece_bits(MAX_BINS) == 6
  with pytest.raises(ValueError, match="2\\^30"):
    _exact.piece_bits((1 << 30) + 1)


@pytest.mark.parametrize("bins", [WHOLE_LIMBS, MAX_BINS])
def test_wide_suffix_sums_are_exact_with_every_limb_at_its_largest(bins):
  top, hi, lo = _crafted_wide(bins, seed=bins)
  got = _wide_suffix(tuple(jnp.asarray(x, jnp.int32) for x in (top, hi, lo)))
  got = [np.asarray(x).astype(np.int64) for x in got]
  want = _suffix_reference(top, hi, lo)
  for name, g, w in zip(("top", "hi", "lo"), got, want):
    np.testing.assert_array_equal(g, w, err_msg=name)
  # The totals (entry 0) as Python integers; column 0 is past 2^31 in the low limbs alone.
  for column in range(WIDTH):
    total = (int(got[0][0, column]) << 36) + (int(got[1][0, column]) << 12) + int(got[2][0, column])
    assert total == _python_total(top, hi, lo, column), column
  assert 4095 * bins == int(got[2][0, 2]) + 4096 * int(got[1][0, 2]) + (int(got[0][0, 2]) << 36)
  assert int(got[0][0, 0]) > bins  # the tops carried, and stayed below int32's limit


def test_pair_suffix_sums_and_chunk_totals_are_exact_over_the_largest_bin_count():
  """(hi, lo) pairs: a sweep of more than 2^19 thresholds (suffix sums over its buckets) and
  the accelerators' sum over more than 2^19 chunks (``_chunks_at_once``)."""
  rng = np.random.default_rng(5)
  hi = rng.integers(0, (1 << 31) // MAX_BINS - 1, (MAX_BINS, WIDTH))  # the total's hi < 2^31
  lo = np.full((MAX_BINS, WIDTH), 4095, np.int64)
  lo[:, 1] = rng.integers(0, 4096, MAX_BINS)
  values = hi * 4096 + lo
  want = _reverse_cumsum(values)
  assert want.max() >> 12 < 1 << 31 and 4095 * MAX_BINS > 1 << 31
  args = (jnp.asarray(hi, jnp.int32), jnp.asarray(lo, jnp.int32))
  s_hi, s_lo = (np.asarray(x).astype(np.int64) for x in _pair_suffix(*args))
  np.testing.assert_array_equal(s_hi, want >> 12)
  np.testing.assert_array_equal(s_lo, want & 4095)
  t_hi, (t_lo,) = _pair_total(*args)
  totals = [sum(int(h) * 4096 + int(x) for h, x in zip(hi[:, j], lo[:, j])) for j in range(WIDTH)]
  assert [int(h) * 4096 + int(x) for h, x in zip(np.asarray(t_hi), np.asarray(t_lo))] == totals
  assert np.all(np.asarray(t_lo) < 4096)


def _rounded(value: Fraction) -> np.float32:
  """float32 of a rational whose denominator is a power of two, to nearest, ties to even."""
  sign, value = (-1 if value < 0 else 1), abs(value)
  if value == 0:
    return np.float32(0.0)
  exponent = value.numerator.bit_length() - value.denominator.bit_length() - 24
  while value / Fraction(2) ** exponent >= 1 << 24:
    exponent += 1
  while value / Fraction(2) ** exponent < 1 << 23:
    exponent -= 1
  scaled = value / Fraction(2) ** exponent
  significand = int(scaled)
  rest = scaled - significand
  if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and significand & 1):
    significand += 1
  return np.float32(sign * np.ldexp(np.float64(significand), exponent))


def test_exact_float_adds_terms_near_int32s_limit_exactly():
  """Several hi near 2^31 at one place (e.g. N - A - U of a one-shot sum of 2^30 samples)."""
  big = (1 << 31) - 1
  cases = [
      [(1, big, big, 0), (1, big, 4095, 0), (1, big - 7, 1, 0)],
      [(-1, big, 4095, 0), (-1, big, 0, 0), (1, 5, 3, 2), (-1, big, big, -1)],
      [(1, 1 << 30, 0, 0), (1, 1 << 30, 0, 0), (-1, 1 << 30, 0, 0), (-1, (1 << 30) - 1, 4095, 0)],
      [(1, big, big, -3), (1, big, big, -2), (1, big, big, -1), (-1, 12345, 678, 1)],
  ]
  for terms in cases:
    want = _rounded(sum(Fraction(s * (h * 4096 + x)) * Fraction(4096) ** p for s, h, x, p in terms))
    got = jax.jit(lambda *a, terms=terms: _exact.exact_float(
        [(s, a[2 * i], a[2 * i + 1], p) for i, (s, _, _, p) in enumerate(terms)]))(
        *[jnp.int32(v) for _, h, x, _ in terms for v in (h, x)])
    assert np.float32(got) == want, (terms, float(got), float(want))


def test_risk_coverage_state_of_twelve_mantissa_bits_with_crafted_sums():
  """compute() of a state of about 2^33 samples over 1,032,193 bins, every count's low limb
  4095 (whole-limb suffix sums wrapped: the counts of the lower bins came out 2^32 short)
  against a float64 reference of the exact integer sums."""
  rng = np.random.default_rng(12)
  bins = MAX_BINS
  count = (rng.integers(0, 3, bins) << 12) | 4095  # 4095 to 12287 samples a bin
  # Errors fall with the confidence (bins ascend in it); loss digits at 2^-12, 2^-24, 2^-36.
  rate = np.linspace(0.9, 0.001, bins)
  errors = (count * rate).astype(np.int64)
  loss = [errors * 4096 + 4095, rng.integers(0, 1 << 24, bins) | 4095,
          rng.integers(0, 1 << 24, bins) | 4095]
  values = np.stack([count] + loss, axis=1)  # [bins, 4], each below 2^36
  top, hi, lo = values >> 36, (values >> 12) & ((1 << 24) - 1), values & 4095
  key = np.arange(bins, dtype=np.int32) << (23 - 12)  # one confidence a bin: exact
  state = dataclasses.replace(
      RiskCoverageState.empty(mantissa_bits=12), top=jnp.asarray(top, jnp.int32),
      hi=jnp.asarray(hi, jnp.int32), lo=jnp.asarray(lo, jnp.int32),
      key_min=jnp.asarray(key), key_max=jnp.asarray(key))
  got = state.compute()

  # float64 reference: m_b, e_b and the suffix sums (bins at or above b) from exact integers.
  m = count.astype(np.float64)
  e = sum(_reverse_cumsum(v).astype(np.float64) * 4096.0 ** -(j + 1) for j, v in enumerate(loss))
  k_incl = _reverse_cumsum(count).astype(np.float64)
  n = k_incl[0]
  assert n > 1 << 32 and int(np.sum(lo[:, 0])) > 1 << 31
  aurc = np.sum(m * e / k_incl) / n
  augrc = np.sum(m * e) / n / n
  assert bool(got.exact)
  for field in ("aurc", "aurc_low", "aurc_high"):
    np.testing.assert_allclose(float(getattr(got, field)), aurc, rtol=2e-5, err_msg=field)
  for field in ("augrc", "augrc_low", "augrc_high"):
    np.testing.assert_allclose(float(getattr(got, field)), augrc, rtol=2e-5, err_msg=field)
