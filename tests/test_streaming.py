"""cwsa_jax.streaming: mergeable states equal one pass, bit for bit, and the float64 references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from test_calibration import ref_bins, ref_ece
from test_risk_coverage import ref_aurc

from cwsa_jax import aurc, calibration_bins, ece, sweep
from cwsa_jax.streaming import (CalibrationState, RiskCoverageState, SweepState, confidence_key,
                                evaluate_batches)

N = 1500
PARTS = 5
THRESHOLDS = np.array([0.0, 0.25, 0.5, 0.5, 0.7, 0.9, 0.99, 0.3], np.float32)  # a duplicate, unsorted
SWEEP_FIELDS = ("coverage", "selective_accuracy", "cwsa", "cwsa_plus")


def data(seed, graded=False, n=N):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  # Ties at thresholds, the ends of [0, 1] and repeated values.
  special = np.array([0.0, 1.0, 0.5, 0.25, 0.9, 0.7, 0.99], np.float32)
  c[: 7 * 20] = np.repeat(special, 20)
  rng.shuffle(c)
  if graded:
    k = rng.uniform(0, 1, n).astype(np.float32)
    k[:50] = np.round(k[:50])
  else:
    k = rng.uniform(size=n) < c
  return c, k


def split_states(make, c, k, seed, parts=PARTS):
  """States of a random split (masks over the full arrays: one compiled shape), merged in a random order."""
  rng = np.random.default_rng(seed)
  assign = rng.integers(0, parts, len(c))
  states = [make(c, k, mask=assign == j) for j in range(parts)]
  order = rng.permutation(parts)
  total = states[order[0]]
  for j in order[1:]:
    total = total.merge(states[j])
  return total, states


def assert_same(a, b, fields):
  for f in fields:
    np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_state_random_splits_equal_one_pass_and_reference(seed, graded):
  c, k = data(seed, graded)
  make = functools.partial(SweepState.from_batch, thresholds=THRESHOLDS)
  merged, _ = split_states(make, c, k, seed)
  result = merged.compute()
  assert_same(result, sweep(c, k, THRESHOLDS), SWEEP_FIELDS)  # bit for bit
  ref = reference.sweep(c, k, THRESHOLDS)
  for i, f in enumerate(SWEEP_FIELDS):
    np.testing.assert_allclose(np.asarray(getattr(result, f)), ref[:, i], atol=2e-6, err_msg=f)


def test_merge_is_associative_commutative_and_empty_is_identity():
  c, k = data(3)
  make = functools.partial(SweepState.from_batch, thresholds=THRESHOLDS)
  _, (a, b, d, *_) = split_states(make, c, k, 3)
  left = a.merge(b).merge(d)
  right = a.merge(b.merge(d))
  swapped = d.merge(a).merge(b)
  with_empty = SweepState.empty(THRESHOLDS).merge(a).merge(b).merge(d)
  for s in (right, swapped, with_empty):
    np.testing.assert_array_equal(s.hi, left.hi)
    np.testing.assert_array_equal(s.lo, left.lo)


def test_reduce_over_stacked_batches_and_leading_axes():
  c, k = data(4)
  stacked = SweepState.from_batch(c.reshape(3, -1), k.reshape(3, -1), THRESHOLDS)
  assert stacked.hi.shape[0] == 3
  assert_same(stacked.compute(), sweep(c.reshape(3, -1), k.reshape(3, -1), THRESHOLDS),
              SWEEP_FIELDS)
  assert_same(stacked.reduce().compute(), sweep(c, k, THRESHOLDS), SWEEP_FIELDS)


@pytest.mark.parametrize("case", ["one_sample", "all_correct", "all_wrong", "nothing_retained",
                                  "ties_at_threshold", "zero_and_one"])
def test_sweep_state_edge_cases_match_reference(case):
  thresholds = np.array([0.5, 0.9], np.float32)
  c, k = {
      "one_sample": ([0.7], [True]),
      "all_correct": ([0.6, 0.95, 0.5], [True, True, True]),
      "all_wrong": ([0.6, 0.95, 0.5], [False, False, False]),
      "nothing_retained": ([0.1, 0.2, 0.3], [True, False, True]),
      "ties_at_threshold": ([0.5, 0.5, 0.9, 0.9], [True, False, False, True]),
      "zero_and_one": ([0.0, 1.0, 1.0], [False, True, False]),
  }[case]
  c, k = np.array(c, np.float32), np.array(k)
  state = SweepState.from_batch(c[:1], k[:1], thresholds)
  for i in range(1, len(c)):
    state = state.merge(SweepState.from_batch(c[i:i + 1], k[i:i + 1], thresholds))
  result = state.compute()
  ref = reference.sweep(c, k, thresholds)
  for i, f in enumerate(SWEEP_FIELDS):
    np.testing.assert_allclose(np.asarray(getattr(result, f)), ref[:, i], atol=2e-6, err_msg=f)


def test_normalize_all_and_empty_state():
  c, k = data(5)
  state = SweepState.from_batch(c, k, THRESHOLDS)
  np.testing.assert_array_equal(state.compute(normalize="all").cwsa,
                                sweep(c, k, THRESHOLDS, normalize="all").cwsa)
  empty = SweepState.empty(THRESHOLDS).compute()
  assert np.all(np.isnan(empty.coverage)) and np.all(np.asarray(empty.cwsa) == 0)


def test_invalid_values_under_jit_give_nan_and_stay_nan_after_merge():
  c, k = data(6)
  bad = c.copy()
  bad[3] = np.nan
  jitted = jax.jit(SweepState.from_batch)
  state = jitted(bad, k, THRESHOLDS).merge(SweepState.from_batch(c, k, THRESHOLDS))
  assert np.all(np.isnan(np.asarray(state.compute().cwsa)))
  # Padding is never checked or counted, whatever it holds.
  mask = np.ones(N, bool)
  mask[3] = False
  padded = SweepState.from_batch(bad, k, THRESHOLDS, mask=mask)
  keep = np.arange(N) != 3
  assert_same(padded.compute(), sweep(c[keep], k[keep], THRESHOLDS), SWEEP_FIELDS)


def test_bad_input_raises_value_error():
  c, k = data(7)
  state = SweepState.from_batch(c, k, THRESHOLDS)
  with pytest.raises(ValueError, match="different thresholds"):
    state.merge(SweepState.from_batch(c, k, THRESHOLDS + np.float32(0.001)))
  with pytest.raises(ValueError, match="thresholds"):
    state.merge(SweepState.empty(THRESHOLDS[:3]))
  with pytest.raises(ValueError, match="boolean vs graded"):
    state.merge(SweepState.empty(THRESHOLDS, graded=True))
  with pytest.raises(TypeError, match="mask must be a boolean, integer or float"):
    SweepState.from_batch(c, k, THRESHOLDS, mask=np.ones(N, np.complex64))
  with pytest.raises(ValueError, match="mask must be broadcastable to confidences.shape"):
    SweepState.from_batch(c, k, THRESHOLDS, mask=np.ones(3, bool))
  with pytest.raises(ValueError, match="confidences"):
    SweepState.from_batch(c + 1, k, THRESHOLDS)
  with pytest.raises(ValueError, match="thresholds"):
    SweepState.empty([1.5])
  with pytest.raises(ValueError, match="normalize"):
    state.compute(normalize="bogus")


# ------------------------------------------------------------------- calibration


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_calibration_state_equals_ece_and_reference(norm, graded):
  c, k = data(8, graded)
  make = functools.partial(CalibrationState.from_batch, num_bins=10)
  merged, _ = split_states(make, c, k, 8)
  value = float(merged.compute(norm=norm))
  assert value == pytest.approx(ref_ece(c, k, 10, norm), abs=2e-6)
  assert value == pytest.approx(float(ece(c, k, num_bins=10, norm=norm)), abs=2e-6)


def test_calibration_state_bins_match_reference():
  c, k = data(9, graded=True)
  merged, _ = split_states(functools.partial(CalibrationState.from_batch, num_bins=10), c, k, 9)
  bins = merged.bins()
  edges, rows = ref_bins(c, k, 10)
  np.testing.assert_array_equal(np.asarray(bins.edges), calibration_bins(c, k, num_bins=10).edges)
  assert bins.count.tolist() == [cnt for cnt, _, _ in rows]
  for b, (cnt, conf, kap) in enumerate(rows):
    assert float(bins.mean_confidence[b]) == pytest.approx(conf.mean(), abs=2e-6)
    assert float(bins.accuracy[b]) == pytest.approx(kap.mean(), abs=2e-6)
  with pytest.raises(ValueError, match="numbers of bins"):
    merged.merge(CalibrationState.empty(5))


# ---------------------------------------------------------------- risk-coverage


def test_confidence_key_is_strictly_increasing():
  c = np.sort(np.concatenate([
      np.array([0.0, 1e-30, 1e-7, 0.25, 0.49999997, 0.5, 0.50000006, 0.999, 0.99999994, 1.0],
               np.float32),
      np.random.default_rng(0).uniform(0, 1, 1000).astype(np.float32)]))
  c = np.unique(c)
  keys = np.asarray(confidence_key(jnp.asarray(c)))
  assert np.all(np.diff(keys) > 0)


@pytest.mark.parametrize("graded", [False, True])
def test_risk_coverage_state_is_exact_on_a_grid(graded):
  # Confidences on a coarse grid: every bin holds one distinct value (and real ties).
  rng = np.random.default_rng(10)
  c = (rng.integers(0, 41, N) / 40).astype(np.float32)
  k = rng.uniform(0, 1, N).astype(np.float32) if graded else rng.uniform(size=N) < c
  merged, _ = split_states(RiskCoverageState.from_batch, c, k, 10)
  r = merged.compute()
  assert bool(r.exact)
  assert float(r.aurc) == pytest.approx(ref_aurc(c, k, "step"), abs=2e-6)
  assert float(r.augrc) == pytest.approx(ref_aurc(c, k, "step", generalized=True), abs=2e-6)
  assert float(r.aurc_low) == float(r.aurc) == float(r.aurc_high)


@pytest.mark.parametrize("seed", [11, 12])
def test_risk_coverage_state_bounds_contain_exact_value(seed):
  c, k = data(seed)
  merged, _ = split_states(functools.partial(RiskCoverageState.from_batch, mantissa_bits=4),
                           c, k, seed)
  r = merged.compute()
  assert not bool(r.exact)
  exact, exact_g = ref_aurc(c, k, "step"), ref_aurc(c, k, "step", generalized=True)
  assert float(r.aurc_low) - 1e-6 <= exact <= float(r.aurc_high) + 1e-6
  assert float(r.augrc_low) - 1e-6 <= exact_g <= float(r.augrc_high) + 1e-6
  assert float(r.aurc_high) - float(r.aurc_low) < 0.05
  # A finer grid gives a tighter interval.
  fine = RiskCoverageState.from_batch(c, k, mantissa_bits=10).compute()
  assert float(fine.aurc_high - fine.aurc_low) < float(r.aurc_high - r.aurc_low)
  assert float(fine.aurc) == pytest.approx(float(aurc(c, k)), abs=2e-3)


def test_risk_coverage_state_errors():
  with pytest.raises(ValueError, match="mantissa_bits"):
    RiskCoverageState.empty(mantissa_bits=20)
  with pytest.raises(ValueError, match="mantissa_bits"):
    RiskCoverageState.empty(mantissa_bits=4).merge(RiskCoverageState.empty(mantissa_bits=5))
  assert np.isnan(float(RiskCoverageState.empty(mantissa_bits=4).compute().aurc))


# -------------------------------------------------------------- evaluation loop


def test_evaluate_batches_equals_one_pass_with_a_ragged_last_batch():
  c, k = data(13)
  batches = [(c[i:i + 400], k[i:i + 400]) for i in range(0, N, 400)]  # 400, 400, 400, 300
  result = evaluate_batches(iter(batches), THRESHOLDS, num_bins=10, progress=False)
  assert result.num_samples == N
  assert_same(result.sweep, sweep(c, k, THRESHOLDS), SWEEP_FIELDS)
  assert float(result.ece) == pytest.approx(float(ece(c, k, num_bins=10)), abs=2e-6)
  r = result.risk_coverage
  assert float(r.aurc_low) - 1e-6 <= ref_aurc(c, k, "step") <= float(r.aurc_high) + 1e-6


def test_evaluate_batches_bad_input():
  c, k = data(14)
  with pytest.raises(ValueError, match="no samples"):
    evaluate_batches([], THRESHOLDS, progress=False)
  with pytest.raises(ValueError, match="batch 0 is not"):
    evaluate_batches([c], THRESHOLDS, progress=False)
  with pytest.raises(ValueError, match="batch 1: .*confidences"):
    evaluate_batches([(c, k), (c + 2, k)], THRESHOLDS, progress=False)
  with pytest.raises(ValueError, match="equal length"):
    evaluate_batches([(c, k[:5])], THRESHOLDS, progress=False)


@pytest.mark.parametrize("graded", [False, True])
def test_calibration_state_equals_ece_and_bins_bit_for_bit(graded):
  # One binning pipeline (_calibration.bin_sums): any split gives the one-shot values exactly.
  c, k = data(10, graded)
  merged, _ = split_states(functools.partial(CalibrationState.from_batch, num_bins=10), c, k, 10)
  for norm in ("l1", "l2", "max"):
    assert float(merged.compute(norm=norm)) == float(ece(c, k, num_bins=10, norm=norm))
  for got, want in zip(merged.bins(), calibration_bins(c, k, num_bins=10)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
