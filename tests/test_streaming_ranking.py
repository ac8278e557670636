"""RiskCoverageState.ranking: AUROC, FPR@TPR and average precision from the binned state.

Exact (the float64 reference and the one-shot functions) where every bin holds one distinct
confidence, guaranteed bounds otherwise (attained where the formulas say so), merged splits
equal one pass, jit, batch axes, edge cases and graded correctness refused.
"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
import reference
from cwsa_jax.streaming import BinnedRanking, RiskCoverageState, confidence_key

# One length, the default bins, a mask on every batch and one tpr shape: few compiled programs.
N = 200
TARGETS = np.array([0.5, 0.95], np.float32)
SLACK = 2.0**-22  # fpr_at_tpr's documented slack on TPR >= q
# Under jit, always on states of two rows [2, N] (one more compiled program).
RANKED = jax.jit(lambda state, tpr: state.ranking(tpr))


# ------------------------------------------------------------------ float64 references


def references(c, k):
  """(AUROC, FPR at each target, AP, AP-error) of the float64 references."""
  return (reference.auroc(c, k), [reference.fpr_at_tpr(c, k, q, SLACK) for q in TARGETS],
          reference.average_precision(c, k), reference.average_precision(c, k, "error"))


def one_shot(c, k):
  """The same four from the package's one-shot functions."""
  return (float(cw.auroc(c, k)), np.asarray(cw.fpr_at_tpr(c, k, TARGETS)).tolist(),
          float(cw.average_precision(c, k)), float(cw.average_precision(c, k, positive="error")))


def estimates(r: BinnedRanking):
  return (float(r.auroc), np.asarray(r.fpr_at_tpr).tolist(), float(r.average_precision),
          float(r.average_precision_error))


def assert_close(got, want, atol=1e-6):
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), atol=atol,
                               rtol=0)


# ------------------------------------------------------------------ data


def grid_data(seed, n=N, accuracy=None):
  """Confidences on a grid of 41 values 1/40 apart (each in a bin of its own), real ties."""
  rng = np.random.default_rng(seed)
  c = (rng.integers(0, 41, n) / 40).astype(np.float32)
  k = rng.uniform(size=n) < (c if accuracy is None else accuracy)
  return c, k


def spread_data(seed, n=N):
  """Confidences in 12 clusters, each inside one bin: many distinct values per bin."""
  rng = np.random.default_rng(seed)
  centers = rng.uniform(0.02, 0.98, 12)
  c = (centers[rng.integers(0, 12, n)] * (1 + rng.uniform(-1e-4, 1e-4, n))).astype(np.float32)
  c[:20] = c[20]  # a tie group inside a bin
  return c, rng.uniform(size=n) < c


def state_of(c, k, mask=None):
  return RiskCoverageState.from_batch(c, k, mask=np.ones(len(c), bool) if mask is None else mask)


def rows_of(c, k):
  """A state with a batch axis: rows [2, N]."""
  return RiskCoverageState.from_batch(c, k, mask=np.ones(c.shape, bool))


def split_merged(c, k, seed, parts=4):
  """A random split into masked states, merged in a random order."""
  rng = np.random.default_rng(seed)
  assign = rng.integers(0, parts, len(c))
  states = [state_of(c, k, assign == j) for j in rng.permutation(parts)]
  total = states[0]
  for state in states[1:]:
    total = total.merge(state)
  return total


def bins_of(c, mantissa_bits=8):
  return np.asarray(confidence_key(jnp.asarray(c))) >> (23 - mantissa_bits)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_confidence_per_bin_is_exact(seed):
  c, k = grid_data(seed)
  merged = split_merged(c, k, seed)
  r = merged.ranking(TARGETS)
  assert bool(r.exact)
  assert_close(estimates(r), references(c, k))
  assert_close(estimates(r), one_shot(c, k))
  for name in ("auroc", "fpr_at_tpr", "average_precision", "average_precision_error"):
    value = np.asarray(getattr(r, name))
    np.testing.assert_array_equal(np.asarray(getattr(r, name + "_low")), value, err_msg=name)
    np.testing.assert_array_equal(np.asarray(getattr(r, name + "_high")), value, err_msg=name)
  # Merged splits give the one-pass state's result bit for bit.
  one_pass = state_of(c, k).ranking(TARGETS)
  for name in BinnedRanking._fields:
    np.testing.assert_array_equal(np.asarray(getattr(r, name)), np.asarray(getattr(one_pass, name)))


@pytest.mark.parametrize("seed", [3, 4])
def test_many_confidences_per_bin_are_bounded(seed):
  c, k = spread_data(seed)
  assert len(np.unique(c)) > 2 * len(np.unique(bins_of(c)))
  r = split_merged(c, k, seed).ranking(TARGETS)
  assert not bool(r.exact)
  exact = references(c, k)
  fields = (("auroc",), ("fpr_at_tpr",), ("average_precision",), ("average_precision_error",))
  for (name,), true in zip(fields, exact):
    low, est, high = (np.asarray(getattr(r, name + s), np.float64) for s in ("_low", "", "_high"))
    assert np.all(low - 1e-6 <= np.asarray(true)) and np.all(np.asarray(true) <= high + 1e-6), name
    assert np.all(low <= est) and np.all(est <= high), name
  assert float(r.auroc_high) > float(r.auroc_low)
  # AUROC's estimate is the midpoint of its bounds (within-bin pairs count 1/2).
  assert float(r.auroc) == pytest.approx((float(r.auroc_low) + float(r.auroc_high)) / 2, abs=1e-6)


def test_bounds_are_attained_by_the_extreme_orders_inside_the_bins():
  # Two distinct confidences per bin; the same counts per bin put the correct samples on the
  # upper one ("up") or the lower one ("down"): one state, and the one-shot values of the two
  # orders are the bounds the docstring says they attain.
  rng = np.random.default_rng(5)
  edges = np.array([0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 0.97], np.float32)
  low_c, high_c = edges * (1 - 1e-5), edges * (1 - 1e-6)  # same bin, distinct values
  which = rng.integers(0, len(edges), N)
  k = rng.uniform(size=N) < edges[which]
  up = np.where(k, high_c[which], low_c[which]).astype(np.float32)
  down = np.where(k, low_c[which], high_c[which]).astype(np.float32)
  assert np.array_equal(bins_of(low_c), bins_of(high_c)) and np.all(low_c < high_c)
  r, r_down = state_of(up, k).ranking(TARGETS), state_of(down, k).ranking(TARGETS)
  assert not bool(r.exact)
  for name in BinnedRanking._fields:
    np.testing.assert_array_equal(np.asarray(getattr(r, name)), np.asarray(getattr(r_down, name)))
  a_up, fpr_up, ap_up, ape_up = references(up, k)
  a_down, fpr_down, ap_down, ape_down = references(down, k)
  assert_close([r.auroc_high, r.fpr_at_tpr_low, r.average_precision_high,
                r.average_precision_error_high], [a_up, fpr_up, ap_up, ape_up])
  assert_close([r.auroc_low, r.fpr_at_tpr_high], [a_down, fpr_down])
  assert float(r.average_precision_low) <= ap_down + 1e-6
  assert float(r.average_precision_error_low) <= ape_down + 1e-6


def test_counts_beyond_int32_are_exact():
  # Doubling every count (a state merged with itself) leaves every metric unchanged, and the
  # scaling by a power of two is exact in float32: the same bits at 2^40 times the counts,
  # where P N reaches 2^94 and the AUROC numerator is a sum of products beyond int64.
  c, k = grid_data(6)
  state = state_of(c, k)
  big = state
  for _ in range(40):
    big = big.merge(big)
  r, r_big = state.ranking(TARGETS), big.ranking(TARGETS)
  for name in BinnedRanking._fields:
    np.testing.assert_array_equal(np.asarray(getattr(r_big, name)), np.asarray(getattr(r, name)),
                                  err_msg=name)
  assert_close(estimates(r_big), references(c, k))


def test_jit_and_batch_axes():
  c, k = grid_data(7, n=2 * N)
  c, k = c.reshape(2, N), k.reshape(2, N)
  c[1] = spread_data(7)[0]  # row 1: many confidences per bin
  rows = rows_of(c, k)
  r = RANKED(rows, TARGETS)
  assert r.auroc.shape == (2,) and r.fpr_at_tpr.shape == (2, 2) and r.exact.shape == (2,)
  assert r.exact.tolist() == [True, False]
  for i in range(2):  # each row: its own state's eager result
    row = state_of(c[i], k[i]).ranking(TARGETS)
    for name in BinnedRanking._fields:
      np.testing.assert_allclose(np.asarray(getattr(r, name))[i], np.asarray(getattr(row, name)),
                                 rtol=2e-7, atol=0, err_msg=name)
  assert_close([r.auroc[0], r.fpr_at_tpr[0], r.average_precision[0],
                r.average_precision_error[0]], references(c[0], k[0]))
  whole = rows.reduce().ranking(TARGETS)  # the rows merged
  both = references(c.reshape(-1), k.reshape(-1))
  fields = ("auroc", "fpr_at_tpr", "average_precision", "average_precision_error")
  for name, true in zip(fields, both):
    low, high = (np.asarray(getattr(whole, name + s), np.float64) for s in ("_low", "_high"))
    assert np.all(low - 1e-6 <= true) and np.all(true <= high + 1e-6), name
  assert inspect.signature(RiskCoverageState.ranking).parameters["tpr"].default == 0.95


@pytest.mark.parametrize("case", ["all_correct", "all_wrong", "one_correct", "one_wrong"])
def test_edge_cases_match_one_shot(case):
  c, k = grid_data(8)
  k = {"all_correct": np.ones(N, bool), "all_wrong": np.zeros(N, bool),
       "one_correct": np.arange(N) == 3, "one_wrong": np.arange(N) != 3}[case]
  r = state_of(c, k).ranking(TARGETS)
  want = references(c, k)
  assert_close(estimates(r), want)
  assert_close(estimates(r), one_shot(c, k))
  if case == "all_correct":  # AUROC and FPR undefined (P N = 0): NaN, as cw.auroc; AP 1
    assert np.isnan(float(r.auroc)) and np.isnan(float(r.auroc_low))
    assert np.all(np.isnan(np.asarray(r.fpr_at_tpr)))
    assert float(r.average_precision) == 1.0 and np.isnan(float(r.average_precision_error))
  if case == "all_wrong":
    assert np.isnan(float(r.auroc)) and np.isnan(float(r.average_precision))
    assert float(r.average_precision_error) == 1.0


def test_single_sample_and_empty_state():
  c, k = grid_data(8)
  r = state_of(c, k, np.arange(N) == 3).ranking(TARGETS)  # one sample, the rest masked out
  assert np.isnan(float(r.auroc)) and np.all(np.isnan(np.asarray(r.fpr_at_tpr)))
  # Its own class's AP is 1, the other's undefined.
  ap, ap_error = float(r.average_precision), float(r.average_precision_error)
  if k[3]:
    assert ap == 1.0 and np.isnan(ap_error)
  else:
    assert np.isnan(ap) and ap_error == 1.0
  assert bool(r.exact)
  empty = RiskCoverageState.empty().ranking(TARGETS)
  assert all(np.all(np.isnan(np.asarray(getattr(empty, f)))) for f in BinnedRanking._fields[:-1])
  assert not bool(empty.exact)


def test_graded_correctness_is_refused():
  c, _ = grid_data(9)
  kappa = np.random.default_rng(9).uniform(0, 1, N).astype(np.float32)
  state = state_of(c, kappa)
  with pytest.raises(ValueError, match="graded correctness"):
    state.ranking(TARGETS)
  # Under jit: NaN for the graded row, no exception.
  r = RANKED(rows_of(np.stack([c, c]), np.stack([(c > 0.5).astype(np.float32), kappa])), TARGETS)
  for f in BinnedRanking._fields[:-1]:
    value = np.asarray(getattr(r, f))
    assert np.all(np.isfinite(value[0])) and np.all(np.isnan(value[1])), f
  assert r.exact.tolist() == [True, False]
  # A 0/1 state merged with one graded sample is graded too.
  one = state_of(c, kappa, np.arange(N) == 0)
  assert 0 < kappa[0] < 1
  with pytest.raises(ValueError, match="graded"):
    state_of(c, c > 0.5).merge(one).ranking(TARGETS)
  # Float 0/1 correctness is not graded.
  k = (c > 0.5).astype(np.float32)
  assert_close(estimates(state_of(c, k).ranking(TARGETS)), references(c, k))


def test_bad_targets_and_invalid_states():
  state = state_of(*grid_data(10))
  for bad in (0.0, 1.5, np.nan):
    with pytest.raises(ValueError, match="tpr"):
      state.ranking(np.float32([0.5, bad]))
  c, k = grid_data(10, n=2 * N)
  r = RANKED(rows_of(c.reshape(2, N), k.reshape(2, N)), jnp.array([0.5, 0.0], jnp.float32))
  fpr = np.asarray(r.fpr_at_tpr)
  assert np.all(np.isfinite(fpr[:, 0])) and np.all(np.isnan(fpr[:, 1]))
  assert np.all(np.isfinite(np.asarray(r.auroc)))  # only the bad target's FPR is NaN
  # A state marked invalid (as from_batch marks one under jit) stays NaN through merges.
  invalid = dataclasses.replace(state, invalid=jnp.array(True))
  r = invalid.merge(state).ranking(TARGETS)
  assert all(np.all(np.isnan(np.asarray(getattr(r, f)))) for f in BinnedRanking._fields[:-1])


def test_nnx_risk_coverage_metric_ranking_is_the_states():
  from cwsa_jax import nnx as cwnnx
  rng = np.random.default_rng(7)
  c = rng.uniform(0, 1, 64).astype(np.float32)
  ok = rng.uniform(0, 1, 64) < c
  metric = cwnnx.RiskCoverageMetric()
  metric.update(confidences=c[:40], correct=ok[:40])
  metric.update(confidences=c[40:], correct=ok[40:])
  got = metric.ranking()
  want = metric.streaming_state().ranking()
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_allclose(float(got.auroc), float(cw.auroc(c, ok)), atol=1e-6)
