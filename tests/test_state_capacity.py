"""Mergeable states stay exact to 2^53 samples and refuse to go past it (never a wrapped number).

Self-merging a state doubles every exact sum, so every ratio the metrics are made
of is unchanged: coverage, selective accuracy, CWSA, CWSA+ and the ECE family
must come out bit for bit equal at every doubling, and the binned AURC within
rounding. Before the sums were widened to (top, hi, lo), they wrapped silently
from about 6.6e9 samples.
"""

from __future__ import annotations

import dataclasses
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cwsa_jax as cw
from cwsa_jax import _exact
from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState, process_merge

BASE = 4096  # 2^12 samples: 40 doublings reach 2^52
THRESHOLDS = np.array([0.0, 0.3, 0.5, 0.5, 0.9, 0.99], np.float32)


def _data(graded: bool = False):
  rng = np.random.default_rng(7)
  c = np.round(rng.random(BASE), 3).astype(np.float32)
  c[:4] = [0.0, 1.0, 0.5, 0.99]
  ok = rng.random(BASE).astype(np.float32) if graded else rng.random(BASE) < c
  return c, ok


def _values(state) -> np.ndarray:
  """The exact integers ``top 2^36 + hi 2^12 + lo`` of a state's sums (Python ints)."""
  top, hi, lo = (np.asarray(x).astype(object) for x in (state.top, state.hi, state.lo))
  return top * (1 << 36) + hi * (1 << 12) + lo


def _equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


_double = jax.jit(lambda s: s.merge(s))
_merge = jax.jit(lambda a, b: a.merge(b))
_reduce = jax.jit(lambda s: s.reduce())


@pytest.mark.parametrize("graded", [False, True])
def test_sweep_state_doubled_40_times_keeps_every_metric_bit_for_bit(graded):
  c, ok = _data(graded)
  Sweep = SweepState.configure(thresholds=THRESHOLDS, graded=graded)
  state = Sweep.from_batch(c, ok)
  want = state.compute()
  want_all = cw.sweep(c, ok, THRESHOLDS, normalize="all")
  assert _equal(want, cw.sweep(c, ok, THRESHOLDS))
  base = _values(state)
  for step in range(1, 41):
    state = _double(state)
    assert np.all(_values(state) == base * (1 << step)), step
    assert _equal(state.compute(), want), step
    assert _equal(state.compute(normalize="all"), want_all), step
  assert int(np.asarray(state.top).max()) > 0  # the top limbs did the carrying


def test_calibration_state_doubled_40_times_keeps_the_ece_family_and_bins():
  c, ok = _data()
  state = CalibrationState.from_batch(c, ok, num_bins=15)
  want = {norm: float(state.compute(norm=norm)) for norm in ("l1", "l2", "max")}
  assert want["l1"] == float(cw.ece(c, ok))
  bins = state.bins()
  base = _values(state)
  for step in range(1, 41):
    state = _double(state)
    assert np.all(_values(state) == base * (1 << step)), step
    for norm, value in want.items():
      assert float(state.compute(norm=norm)) == value, (step, norm)
    got = state.bins()
    np.testing.assert_array_equal(got.mean_confidence, bins.mean_confidence)
    np.testing.assert_array_equal(got.accuracy, bins.accuracy)
    count = np.asarray(bins.count).astype(np.int64) << step
    np.testing.assert_array_equal(got.count, np.where(count < 2**31, count, -1))


def test_risk_coverage_state_doubled_40_times_keeps_the_binned_aurc():
  c, ok = _data()
  state = RiskCoverageState.from_batch(c, ok, mantissa_bits=2)  # 1,009 bins, the same code
  want = state.compute()
  count = np.asarray(_values(state))[:, 0]
  for step in range(1, 41):
    state = _double(state)
    assert np.all(np.asarray(_values(state))[:, 0] == count * (1 << step)), step
    got = state.compute()
    # Every field is a ratio of the doubled sums but aurc_high, whose min(1, E / (K + 1)) per
    # bin moves with K: it only has to stay a bound.
    for field in ("aurc", "aurc_low", "augrc", "augrc_low", "augrc_high", "exact"):
      np.testing.assert_allclose(np.asarray(getattr(got, field), np.float64),
                                 np.asarray(getattr(want, field), np.float64), rtol=1e-6,
                                 err_msg=f"doubling {step}: {field}")
    assert float(got.aurc) <= float(got.aurc_high)


@pytest.mark.parametrize("make", [
    lambda: SweepState.from_batch(*_data(), THRESHOLDS),
    lambda: CalibrationState.from_batch(*_data()),
    lambda: RiskCoverageState.from_batch(*_data(), mantissa_bits=2),
])
def test_past_capacity_raises_eagerly_and_gives_nan_under_jit(make):
  state = make()
  for _ in range(41):  # 2^53 samples: within capacity
    state = _double(state)
  doublings = 41
  while not bool(_exact.over_capacity(_double(state).top)):
    state, doublings = _double(state), doublings + 1
    assert doublings < 50
  with pytest.raises(ValueError, match="capacity"):
    state.merge(state)  # eagerly: refused
  over = _double(state)  # under jit: marked, for good
  assert bool(_exact.over_capacity(_merge(over, make()).top))
  with pytest.raises(ValueError, match="capacity"):
    over.compute()
  result = jax.jit(lambda s: s.compute())(over)
  if isinstance(result, cw.SweepResult):
    result = result._replace(thresholds=np.nan)
  leaves = jax.tree.leaves(result)
  assert all(np.all(np.isnan(np.asarray(x))) for x in leaves if np.asarray(x).dtype.kind == "f")


def _limbs(draw_value: int) -> tuple[int, int, int]:
  return draw_value >> 36, (draw_value >> 12) & ((1 << 24) - 1), draw_value & 4095


# Values near the limbs' boundaries (lo and hi full or empty, tops of a few bits).
_EDGES = [0, 1, 4095, 4096, (1 << 36) - 1, 1 << 36, (1 << 36) + 4095, (1 << 48) - 1, 1 << 48,
          (5 << 57) - 1, 5 << 57]
_value = st.one_of(st.sampled_from(_EDGES), st.integers(0, 5 << 57))


def _state_of(values: list[int]):
  empty = SweepState.empty(np.array([0.5], np.float32))
  limbs = np.array([_limbs(v) for v in values], np.int64).reshape(2, 6, 3)
  top, hi, lo = (jnp.asarray(limbs[..., j], jnp.int32) for j in range(3))
  return dataclasses.replace(empty, top=top, hi=hi, lo=lo)


@settings(max_examples=60, deadline=None)
@given(st.lists(_value, min_size=36, max_size=36))
def test_merge_is_exact_associative_and_commutative_near_limb_boundaries(values):
  a, b, c = (_state_of(values[12 * i:12 * i + 12]) for i in range(3))
  ab_c, a_bc = _merge(_merge(a, b), c), _merge(a, _merge(b, c))
  assert _equal(ab_c, a_bc)
  assert _equal(_merge(a, b), _merge(b, a))
  want = np.array(values[:12], object) + np.array(values[12:24], object) + np.array(values[24:], object)
  assert np.all(_values(ab_c).reshape(-1) == want)
  stacked = jax.tree.map(lambda *x: jnp.stack(x), a, b, c)
  assert _equal(_reduce(stacked), ab_c)  # the reduction over a stacked axis: the same integers


def test_reduce_adds_many_large_states_exactly():
  state = SweepState.from_batch(*_data(), THRESHOLDS)
  for _ in range(36):
    state = _double(state)
  stacked = jax.tree.map(lambda x: jnp.stack([x] * 8), state)
  reduced = stacked.reduce()  # 8 states of 2^48 samples each
  assert np.all(_values(reduced) == _values(state) * 8)
  assert _equal(reduced.compute(), state.compute())


def test_merging_different_configurations_still_raises():
  c, ok = _data()
  with pytest.raises(ValueError, match="thresholds"):
    SweepState.from_batch(c, ok, THRESHOLDS).merge(SweepState.from_batch(c, ok, THRESHOLDS[1:]))
  with pytest.raises(ValueError, match="boolean vs graded"):
    SweepState.from_batch(c, ok, THRESHOLDS).merge(
        SweepState.from_batch(c, ok.astype(np.float32) * 0.5, THRESHOLDS))
  with pytest.raises(ValueError, match="bins"):
    CalibrationState.from_batch(c, ok).merge(CalibrationState.from_batch(c, ok, num_bins=10))
  with pytest.raises(ValueError, match="mantissa_bits"):
    RiskCoverageState.from_batch(c, ok).merge(RiskCoverageState.from_batch(c, ok, mantissa_bits=6))


def test_process_merge_of_one_process_keeps_a_large_state():
  state = CalibrationState.from_batch(*_data())
  for _ in range(30):
    state = _double(state)
  assert process_merge(state) is state


@pytest.mark.parametrize("state_type", [
    SweepState.configure(thresholds=THRESHOLDS), CalibrationState, RiskCoverageState])
def test_empty_states_can_be_donated(state_type):
  """Every field of a fresh state is a buffer of its own: donating the state works."""
  keep = jax.jit(lambda s: s, donate_argnums=0)
  jax.block_until_ready(keep(state_type.empty()))


def _rounded(value: int, exponent: int) -> np.float32:
  """float32 of value 2^exponent, rounded to nearest with ties to even (Python integers)."""
  if value == 0:
    return np.float32(0.0)
  shift = max(value.bit_length() - 24, 0)
  significand, rest = value >> shift, value & ((1 << shift) - 1)
  if shift and (rest > 1 << (shift - 1) or (rest == 1 << (shift - 1) and significand & 1)):
    significand += 1
  return np.float32(np.ldexp(np.float64(significand), shift + exponent))


def test_wide_sums_convert_to_the_correctly_rounded_float():
  rng = random.Random(3)
  values = []
  for _ in range(4000):
    bits = rng.randint(25, 66)
    head = rng.getrandbits(24) | 1 << 23
    shift = bits - 24
    values.append((head << shift) + rng.choice(
        [1 << (shift - 1), (1 << (shift - 1)) - 1, (1 << (shift - 1)) + 1, 0, rng.getrandbits(shift)]))
    values.append(rng.getrandbits(rng.randint(0, 66)))
    # Ties decided by one low bit under zero words (the sticky bit must see through them).
    low = rng.choice([1, 1 << 11, 1 << 23])
    values.append((head << shift) + (1 << (shift - 1)) * (shift > 24) + low * (shift > 24))
    values.append((((head | 1) << shift) + (1 << (shift - 1))) if shift > 24 else head)
  limbs = np.array([_limbs(v) for v in values], np.int64)
  wide = tuple(jnp.asarray(limbs[:, j], jnp.int32) for j in range(3))
  got = np.asarray(jax.jit(_exact.wide_to_float)(wide))
  want = np.array([_rounded(v, 0) for v in values], np.float32)
  np.testing.assert_array_equal(got, want)
  terms = jax.jit(lambda w: _exact.exact_float(_exact.wide_terms(1, w, -3)))(wide)
  np.testing.assert_array_equal(np.asarray(terms), [_rounded(v, -36) for v in values])


def test_pairs_convert_to_the_correctly_rounded_float():
  """``_exact.to_float`` of (hi, lo) pairs up to hi = 2^31 - 1, ties included (the one-shot
  paths' conversion: the same floats as a state's wide conversion of the same integers)."""
  rng = np.random.default_rng(4)
  hi = rng.integers(0, 2**31 - 1, 20_000)
  hi[:5000] = (rng.integers(1 << 17, 1 << 23, 5000) << 7) | 64  # ties on the dropped bits
  lo = rng.integers(0, 4096, 20_000)
  lo[:2500] = 0
  got = np.asarray(_exact.to_float(jnp.asarray(hi, jnp.int32), jnp.asarray(lo, jnp.int32)))
  np.testing.assert_array_equal(got, [_rounded(int(h) * 4096 + int(l), 0) for h, l in zip(hi, lo)])
  wide = _exact.widen(jnp.asarray(hi, jnp.int32), jnp.asarray(lo, jnp.int32))
  np.testing.assert_array_equal(np.asarray(_exact.wide_to_float(wide)), got)

