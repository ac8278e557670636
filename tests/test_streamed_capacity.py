"""The streamed bootstrap stays exact to 2^53 samples and refuses to go past it.

A resample's state (``_streamed._RangeState``) is its exact bucket sums as wide
(top, hi, lo) sums and its area scan's wide carry (K, E, the last risk and the
float32 areas). 2^53 rows cannot be streamed in a test, so the states here are
built from a small range and scaled: multiplying every multiplicity by 2^j
multiplies every sum, K and E by 2^j and the n AURC and n^2 AUGRC sums by 2^j
and 4^j, so every metric but E-AURC (whose oracle has harmonic sums) must come
out bit for bit equal at every doubling, and E-AURC as its float64 formula. A
range is also scanned from carries at and around the limbs' boundaries, and
checked against exact integers and a float64 loop. Before the sums were
widened the streamed bootstrap was capped at 2^30 samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cwsa_jax import _exact
from cwsa_jax._bootstrap import _area_scan, _streamed
from cwsa_jax._bootstrap._bucket_sums import _Plan, _prepare_evaluation
from cwsa_jax._bootstrap._sampler import _poisson_block_jit
from cwsa_jax._bootstrap._streamed import StreamedEvaluationBootstrap

BASE = 4096  # 2^12 samples: 40 doublings reach 2^52
GRID = np.array([0.0, 0.3, 0.5, 0.9, 0.99], np.float32)
NUM_BINS = 10
KEY = jax.random.key(5)
B = 6


def _data(n: int = BASE, seed: int = 3):
  rng = np.random.default_rng(seed)
  c = np.round(rng.random(n), 3).astype(np.float32)  # ties
  c[:3] = [0.0, 1.0, 0.5]
  return c, rng.random(n) < c


def _ints(w) -> np.ndarray:
  """The exact integers ``top 2^36 + hi 2^12 + lo`` of wide sums (Python ints)."""
  top, hi, lo = (np.asarray(x).astype(object) for x in w)
  return top * (1 << 36) + hi * (1 << 12) + lo


def _wide(values) -> tuple:
  """Canonical wide sums (int32 limbs) of non-negative Python ints."""
  values = np.asarray(values, object)
  limbs = [values >> 36, (values >> 12) & ((1 << 24) - 1), values & 4095]
  return tuple(jnp.asarray(np.asarray(x, np.int64), jnp.int32) for x in limbs)


def _scaled(state: _streamed._RangeState, j: int) -> _streamed._RangeState:
  """The state of the same resample with every multiplicity times 2^j (exactly)."""
  carry = state.carry
  scale = np.float32(2.0**j)
  return _streamed._RangeState(
      _wide(_ints(state.sums) * (1 << j)),
      carry._replace(k=_wide(_ints(carry.k) * (1 << j)), e=_wide(_ints(carry.e) * (1 << j)),
                     area=carry.area * scale, generalized=carry.generalized * scale * scale))


def _filled(convention: str) -> StreamedEvaluationBootstrap:
  c, ok = _data()
  boot = StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B, num_bins=NUM_BINS,
                                     aurc_convention=convention)
  for hi, lo in ((2.0, 0.5), (0.5, -1.0)):
    rows = np.flatnonzero((c < hi) & (c >= lo))
    boot.add_range(c[rows], ok[rows], rows)
  return boot


def _metrics(boot, state) -> dict:
  args = (*boot._grid, boot._t, boot._order, boot._plan)
  return {k: np.asarray(v) for k, v in _streamed._range_metrics_jit(state, *args).items()}


def _harmonic64(r: int, n: int) -> float:
  """H_n - H_r in float64: the sum of a few terms, else the asymptotic series (its truncation
  error below 1/(252 r^6))."""
  if n - r <= 256:
    return math.fsum(1.0 / p for p in range(r + 1, n + 1))

  def tail(x):  # H_x - ln x - gamma
    return 0.5 / x - 1.0 / (12.0 * x * x) + 1.0 / (120.0 * x**4)

  if r >= 256:
    return math.log1p((n - r) / r) + tail(n) - tail(r)
  return math.log(n) + tail(n) + 0.5772156649015329 - math.fsum(1.0 / p for p in range(1, r + 1))


def _eaurc64(state, convention: str) -> np.ndarray:
  """E-AURC of every resample of ``state`` from its exact K, E and float32 area, in float64."""
  ks, es = _ints(state.carry.k).reshape(-1), _ints(state.carry.e).reshape(-1)
  areas = np.asarray(state.carry.area, np.float64).reshape(-1)
  out = []
  for k, e, area in zip(ks, es, areas):
    aurc = area / k
    if convention == "step":
      oracle = (e - (k - e) * _harmonic64(k - e, k)) / k
    else:
      oracle = 0.5 * (e / k) ** 2
    out.append(0.0 if e in (0, k) else max(aurc - oracle, 0.0))
  return np.array(out)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_states_scaled_40_times_keep_every_metric(convention):
  """Every doubling up to 2^40 times a resample of 4096 rows (2^52 rows): the metrics of
  ratios bit for bit, E-AURC as its float64 formula of the exact counts."""
  boot = _filled(convention)
  states = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), boot._estimate, boot._state)
  # Every doubling at once (one program): [41 doublings x (estimate + B resamples)].
  scaled = [_scaled(states, j) for j in range(41)]
  for state in scaled:
    assert not bool(jnp.any(_exact.over_capacity(state.sums[0])))
  got = _metrics(boot, jax.tree.map(lambda *x: jnp.concatenate(x), *scaled))
  want = {name: value[:B + 1] for name, value in got.items()}  # 2^0: the state itself
  for j, state in enumerate(scaled):
    part = slice(j * (B + 1), (j + 1) * (B + 1))
    for name, value in got.items():
      if name != "eaurc":
        np.testing.assert_array_equal(value[part], want[name], err_msg=f"2^{j}: {name}")
    np.testing.assert_allclose(got["eaurc"][part], _eaurc64(state, convention), rtol=2e-5,
                               atol=2e-7, err_msg=f"2^{j}: eaurc")
  # The largest: K of the estimate is exactly 2^52.
  assert int(_ints(_scaled(states, 40).carry.k)[0]) == BASE << 40


# --- a range scanned from large carries --------------------------------------------------


def _range(convention: str, n: int = 3000, seed: int = 4):
  c, ok = _data(n, seed)
  sorted_t = np.sort(GRID)
  data, num_buckets = _prepare_evaluation(c, ok, sorted_t, NUM_BINS, "poisson",
                                          rows=np.arange(n), padded=4096)
  plan = _Plan(num_buckets, GRID.shape[0], NUM_BINS, "l1", convention, "retained", "poisson")
  m = np.asarray(_poisson_block_jit(data.source, jnp.int32(n), KEY, jnp.uint32(0), 1)[0],
                 np.int32)
  return data, plan, m


_update = jax.jit(_streamed._range_update, static_argnames=("plan",))


def _reference_scan(m, correct, group_end, k0: int, e0: int, r0: float, convention: str):
  """(K, E, area sum, generalized sum) of the scan from a carry (K0, E0, r0), float64."""
  k = k0 + np.cumsum(m.astype(np.int64))
  e = e0 + np.cumsum(np.where(correct, 0, m).astype(np.int64))
  ends = np.flatnonzero(group_end)
  kg, eg = k[ends], e[ends]
  k_prev = np.concatenate([[k0], kg[:-1]])  # the last point's K at each group end
  e_prev = np.concatenate([[e0], eg[:-1]])
  point = kg > k_prev
  width = (kg - k_prev).astype(np.float64)
  risk = eg / np.maximum(kg, 1).astype(np.float64)
  if convention == "step":
    a, g = width * risk, width * eg
  else:
    r_prev = np.concatenate([[r0], risk[:-1]])
    r_prev = np.where(k_prev > 0, r_prev, risk)
    a, g = width * (r_prev + risk) / 2, width * (np.where(k_prev > 0, e_prev, 0) + eg) / 2
  return int(k[-1]), int(e[-1]), float(np.sum(a[point])), float(np.sum(g[point]))


# K0 at and around every limb boundary of the wide counts and of the scan's 2^30 frames.
_EDGES = [0, 1, 4095, 4096, (1 << 30) - 1, 1 << 30, (1 << 31) - 3000, (1 << 31) - 1, 1 << 31,
          (1 << 36) - 1, 1 << 36, (1 << 48) - 1, 1 << 48, (1 << 53) - 5000, 1 << 53]


def _check_scan(convention, k0: int, e0: int, data, plan, m, sums0=None):
  zero = _streamed._RangeState(tuple(jnp.zeros((plan.num_buckets, 6), jnp.int32)
                                     for _ in range(3)), _area_scan._wide_area_carry_zero())
  r0 = e0 / k0 if k0 else 0.0
  carry = zero.carry._replace(k=_wide(k0), e=_wide(e0), r_last=jnp.float32(r0))
  state = zero._replace(carry=carry) if sums0 is None else zero._replace(sums=sums0,
                                                                          carry=carry)
  out = _update(jnp.asarray(m), data, state, plan)
  correct, group_end = np.asarray(data.correct), np.asarray(data.group_end)
  k, e, area, generalized = _reference_scan(m, correct, group_end, k0, e0, r0, convention)
  assert int(_ints(out.carry.k)) == k and int(_ints(out.carry.e)) == e
  np.testing.assert_allclose(float(out.carry.area), area, rtol=2e-5)
  np.testing.assert_allclose(float(out.carry.generalized), generalized, rtol=2e-5)
  return out, _update(jnp.asarray(m), data, zero, plan)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_a_range_scanned_from_carries_at_the_limb_boundaries(convention):
  data, plan, m = _range(convention)
  for k0 in _EDGES:
    for e0 in sorted({0, k0 // 3, k0}):
      out, alone = _check_scan(convention, k0, e0, data, plan, m)
      # The bucket sums are the range's own, added exactly.
      assert np.array_equal(_ints(out.sums), _ints(alone.sums))


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_carries_below_int32_scan_as_the_in_memory_loop_bit_for_bit(convention):
  """Where K + the range's size stays below 2^31 the streamed scan is the int32 one."""
  data, plan, m = _range(convention)
  for k0, e0 in ((0, 0), (12345, 999), ((1 << 31) - 3000, 1 << 30)):
    r0 = np.float32(e0 / k0 if k0 else 0.0)
    old = _area_scan._area_loop(jnp.asarray(m), data.correct, data.group_end,
                                _area_scan._AreaCarry(*(jnp.int32(x) for x in (k0, e0, k0, e0)),
                                                      r0, jnp.float32(7.5), jnp.float32(1e6)),
                                convention)
    carry = _area_scan._WideAreaCarry(_wide(k0), _wide(e0), r0, jnp.float32(7.5),
                                      jnp.float32(1e6))
    total = jnp.int32(int(m.sum()))
    new = jax.jit(_area_scan._wide_area_scan, static_argnames=("convention", "kernels"))(
        jnp.asarray(m), data.correct, data.group_end, carry, total, convention)
    assert int(_ints(new.k)) == int(old.k) and int(_ints(new.e)) == int(old.e)
    for field in ("r_last", "area", "generalized"):
      assert np.asarray(getattr(new, field)) == np.asarray(getattr(old, field)), field
    assert _area_scan._areas_from_wide_carry(new, convention) == pytest.approx(
        _area_scan._areas_from_carry(old, convention), rel=0, abs=0)


_value = st.one_of(st.sampled_from(_EDGES), st.integers(0, 1 << 53))


@settings(max_examples=30, deadline=None)
@given(_value, st.floats(0.0, 1.0), st.lists(_value, min_size=6, max_size=6))
def test_scan_and_sums_are_exact_from_any_carry(k0, error_rate, bucket_values):
  """Random carries and bucket sums (values near the limbs' boundaries): K, E and every
  bucket sum are the exact integers after the range."""
  data, plan, m = _RANGE_STEP
  e0 = int(k0 * error_rate)
  sums0 = np.resize(np.array(bucket_values, object), (plan.num_buckets, 6))
  out, alone = _check_scan("step", k0, e0, data, plan, m, sums0=_wide(sums0))
  assert np.array_equal(_ints(out.sums), sums0 + _ints(alone.sums))


_RANGE_STEP = _range("step")


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_wide_areas_past_int32_match_float64(convention):
  """E-AURC's oracle past int32: few correct (the harmonic sum's exact small terms), one
  class (0 exactly), and many of both."""
  for k, e in ((1 << 40, (1 << 40) - 3), (1 << 40, 1 << 40), (1 << 40, 0),
               ((1 << 53) + 12345, 1 << 50), ((1 << 31) + 1, 7)):
    area = np.float32(0.6 * k) if e not in (0, k) else np.float32(e == k) * np.float32(k)
    carry = _area_scan._WideAreaCarry(_wide(k), _wide(e), jnp.float32(0.0), jnp.asarray(area),
                                      jnp.float32(0.0))
    got = jax.jit(_area_scan._areas_from_wide_carry, static_argnames="convention")(
        carry, convention)
    state = _streamed._RangeState(None, jax.tree.map(lambda x: x[None], carry))
    np.testing.assert_allclose(float(got["eaurc"]), _eaurc64(state, convention)[0],
                               rtol=2e-6, atol=1e-7, err_msg=f"K={k} E={e}")
    np.testing.assert_allclose(float(got["aurc"]), float(area) / k, rtol=1e-7)


# --- past capacity ------------------------------------------------------------------------


def test_past_the_sample_capacity_raises_before_any_work(monkeypatch):
  c, ok = _data(100)
  boot = StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B)
  boot._n = (1 << 53) - 50  # as if 2^53 - 50 rows had been added
  with pytest.raises(ValueError, match=r"2\^53"):
    boot.add_range(c, ok, np.arange(100))
  assert boot.num_samples == (1 << 53) - 50 and boot._state is None
  monkeypatch.setattr(_streamed, "_MAX_RANGE_N", 64)
  with pytest.raises(ValueError, match="range of 100 rows"):
    StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B).add_range(c, ok, np.arange(100))
  with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
    StreamedEvaluationBootstrap(GRID, key=KEY).add_range(c, ok, np.arange(100) - 1)


def test_a_resample_past_capacity_raises_and_keeps_the_state():
  c, ok = _data()
  high = c >= 0.3
  boot = StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B, num_bins=NUM_BINS)
  boot.add_range(c[high], ok[high], np.flatnonzero(high))
  before = (boot.num_samples, boot._state, boot._estimate, boot._lowest)
  # One resample's u_hi column holds more than TOP_CAPACITY tops: the next range is refused.
  top, hi, lo = boot._state.sums
  top = top.at[2, 1, 1].set(_exact.TOP_CAPACITY + 1024)
  boot._state = boot._state._replace(sums=(top, hi, lo))
  with pytest.raises(ValueError, match="capacity"):
    boot.add_range(c[~high], ok[~high], np.flatnonzero(~high))
  assert (boot.num_samples, boot._estimate, boot._lowest) == (before[0], before[2], before[3])
  # Under jit, a marked state gives NaN for every metric, never a number.
  marked = before[1]._replace(sums=(jnp.full_like(before[1].sums[0], _exact.OVER_CAPACITY),
                                    *before[1].sums[1:]))
  assert all(np.all(np.isnan(v)) for v in _metrics(boot, marked).values())
  boot._state = before[1]
  boot.add_range(c[~high], ok[~high], np.flatnonzero(~high))  # within capacity: added
  assert boot.num_samples == BASE


def test_a_range_adding_2_30_to_a_resample_is_marked():
  """The scan's int32 counts are relative to a 2^30 frame: a range that adds 2^30 or more to
  a resample's size (never, for Poisson(1) multiplicities of fewer than 2^29 rows) is past
  capacity."""
  def pair(total):
    hi, lo = np.zeros((4, 6), np.int64), np.zeros((4, 6), np.int64)
    hi[0, 0], lo[0, 0] = divmod(total // 2, 4096)
    hi[3, 3], lo[3, 3] = divmod(total - total // 2, 4096)
    return jnp.asarray(hi, jnp.int32), jnp.asarray(lo, jnp.int32)

  for total, over in ((0, False), ((1 << 30) - 1, False), (1 << 30, True),
                      ((1 << 31) + 4097, True), (12 * ((1 << 29) - 1), True)):
    value, marked = _streamed._range_total(pair(total))
    assert bool(marked) == over, total
    if not over:
      assert int(value) == total


# --- row numbers past 2^32 ----------------------------------------------------------------


def test_rows_past_2_32_draw_their_own_multiplicities():
  source = jnp.arange(1000, dtype=jnp.uint32) * 7919
  args = (jnp.int32(990), KEY, jnp.uint32(3), 4)
  low = _poisson_block_jit(source, *args)
  same = _streamed._poisson_block_wide_jit(source, jnp.zeros_like(source), *args)
  np.testing.assert_array_equal(np.asarray(low), np.asarray(same))
  other = _streamed._poisson_block_wide_jit(source, jnp.ones_like(source), *args)
  assert np.mean(np.asarray(other) == np.asarray(low)) < 0.6
  # A range with row numbers past 2^32: the same estimate, its own resamples.
  c, ok = _data(500)
  boots = []
  for offset in (0, 1 << 32):
    boots.append(StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B, num_bins=NUM_BINS))
    boots[-1].add_range(c, ok, np.arange(500, dtype=np.int64) + offset)
  for x, y in zip(jax.tree.leaves(boots[0]._estimate), jax.tree.leaves(boots[1]._estimate)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert not np.array_equal(_ints(boots[0]._state.sums), _ints(boots[1]._state.sums))
