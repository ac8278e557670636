"""Threshold selection against a brute-force float64 search over the grid."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference
from cwsa_jax._select import ThresholdChoice, default_thresholds, select_threshold

ATOL = 2e-6
INDEX = {"selective_accuracy": 1, "cwsa": 2, "cwsa_plus": 3}


def brute_force(c, ok, thresholds, metric, min_coverage, max_risk):
  """(best value, index of the smallest threshold reaching it within 1e-9), or None if infeasible."""
  rows = reference.sweep(c, ok, thresholds)
  best, arg = -np.inf, None
  for j in np.argsort(thresholds, kind="stable"):
    cov, acc = rows[j, 0], rows[j, 1]
    if cov == 0:
      continue
    if min_coverage is not None and cov < min_coverage:
      continue
    if max_risk is not None and 1.0 - acc > max_risk:
      continue
    if rows[j, INDEX[metric]] > best + 1e-9:
      best, arg = rows[j, INDEX[metric]], j
  return (best, arg, rows) if arg is not None else None


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    metric=st.sampled_from(["cwsa", "cwsa_plus", "selective_accuracy"]),
    use_coverage=st.booleans(),
    use_risk=st.booleans(),
    graded=st.booleans(),
)
def test_agrees_with_brute_force(seed, metric, use_coverage, use_risk, graded):
  rng = np.random.default_rng(seed)
  n = 200
  c = rng.uniform(0.3, 1, n).astype(np.float32)
  ok = rng.uniform(0, 1, n).astype(np.float32) if graded else rng.uniform(size=n) < c
  thresholds = rng.permutation(default_thresholds())
  min_coverage = float(rng.uniform(0, 0.9)) if use_coverage else None
  max_risk = float(rng.uniform(0.0, 0.4)) if use_risk else None
  want = brute_force(c, ok, thresholds, metric, min_coverage, max_risk)
  if want is None:
    with pytest.raises(ValueError, match="no threshold in the grid"):
      select_threshold(c, ok, metric=metric, min_coverage=min_coverage, max_risk=max_risk,
                       thresholds=thresholds)
    return
  best, arg, rows = want
  got = select_threshold(c, ok, metric=metric, min_coverage=min_coverage, max_risk=max_risk,
                         thresholds=thresholds)
  assert isinstance(got, ThresholdChoice)
  j = int(np.flatnonzero(thresholds == np.float32(got.threshold))[0])
  # The chosen threshold is feasible and optimal (up to float32 rounding of the metric).
  assert rows[j, 0] > 0
  assert min_coverage is None or rows[j, 0] >= min_coverage - 1e-7
  assert max_risk is None or 1.0 - rows[j, 1] <= max_risk + 1e-6
  assert got.value >= best - ATOL
  assert abs(got.value - rows[j, INDEX[metric]]) <= ATOL
  assert abs(got.coverage - rows[j, 0]) <= ATOL
  assert abs(got.selective_risk - (1.0 - rows[j, 1])) <= ATOL
  # When the optimum is clear (no near-tie), it is exactly the brute-force threshold.
  values = np.sort(rows[:, INDEX[metric]])
  if abs(got.value - best) < ATOL and np.sum(np.abs(values - best) < 1e-5) == 1:
    assert j == arg


def test_tie_break_goes_to_the_smallest_threshold():
  c = np.ones(10, np.float32)  # phi = 1 at every threshold: CWSA = 1 everywhere
  ok = np.ones(10, bool)
  got = select_threshold(c, ok, thresholds=np.array([0.9, 0.6, 0.7], np.float32))
  assert got == ThresholdChoice(float(np.float32(0.6)), 1.0, 0.0, 1.0)


def test_default_grid_and_exact_constraints():
  grid = default_thresholds()
  np.testing.assert_allclose(grid, np.arange(50) / 100 + 0.5, atol=1e-7)
  assert grid.dtype == np.float32 and grid[0] == np.float32(0.5) and grid[-1] == np.float32(0.99)
  # 10 samples, one per 0.05: coverage is exactly k/10 at the grid points.
  c = np.array([0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95], np.float32)
  ok = np.array([0, 1, 0, 1, 1, 1, 1, 1, 1, 1], bool)
  # Unconstrained, CWSA is best at a high threshold; min_coverage 0.9 is met with equality by
  # 0.51..0.55 (9 of 10 retained): equality must count as feasible despite float32 rounding.
  free = select_threshold(c, ok)
  assert free.threshold > 0.6
  got = select_threshold(c, ok, min_coverage=0.9)
  assert 0.5 < got.threshold <= float(np.float32(0.55)) and abs(got.coverage - 0.9) < 1e-6
  assert got.value >= max(reference.hard_metrics(c, ok, t)[2] for t in grid[1:6]) - ATOL
  # Risk 0 requires dropping both mistakes: tau > 0.6.
  got = select_threshold(c, ok, max_risk=0.0, metric="cwsa_plus")
  assert got.selective_risk == 0.0 and got.threshold > 0.6
  reference_value = reference.hard_metrics(c, ok, np.float32(got.threshold))[3]
  assert abs(got.value - reference_value) <= ATOL


def test_infeasible_constraints_raise():
  c = np.array([0.9, 0.8, 0.7, 0.6], np.float32)
  ok = np.array([False, True, False, True])
  with pytest.raises(ValueError, match="no threshold in the grid.*max_risk=0.0"):
    select_threshold(c, ok, max_risk=0.0, min_coverage=0.5)
  with pytest.raises(ValueError, match="no threshold in the grid"):
    select_threshold(c, ok, min_coverage=1.0, thresholds=np.array([0.65, 0.75], np.float32))
  # Nothing retained anywhere on the grid.
  with pytest.raises(ValueError, match="reaches at most coverage 0"):
    select_threshold(np.array([0.1, 0.2], np.float32), [True, True])


@pytest.mark.parametrize("kwargs, match", [
    (dict(metric="aurc"), "metric must be one of"),
    (dict(min_coverage=1.5), "min_coverage must lie in"),
    (dict(min_coverage=float("nan")), "min_coverage must lie in"),
    (dict(max_risk=-0.1), "max_risk must lie in"),
    (dict(max_risk="low"), "max_risk must be a number"),
    (dict(thresholds=[0.5, 1.0]), "thresholds must lie in"),
    (dict(confidences=[[0.9, 0.8]], correct=[[True, False]]), "1-D"),
    (dict(correct=[1.2, 0.0]), r"correct must lie in \[0, 1\]"),
    (dict(correct=[True]), "same shape"),
])
def test_bad_inputs(kwargs, match):
  kwargs = dict(kwargs)
  c = kwargs.pop("confidences", [0.9, 0.8])
  ok = kwargs.pop("correct", [True, False])
  with pytest.raises(ValueError, match=match):
    select_threshold(c, ok, **kwargs)
