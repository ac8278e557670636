"""Per-group sweep: equals sweep() on each group separately and a float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference
from cwsa_jax._groups import group_gap, sweep_by_group
from cwsa_jax._sweep import SweepResult, sweep

ATOL = 2e-6
GRID = np.linspace(0.5, 0.99, 50).astype(np.float32)


def _stack(r: SweepResult) -> np.ndarray:
  return np.stack([r.coverage, r.selective_accuracy, r.cwsa, r.cwsa_plus], axis=-1)


def _data(rng, n, num_groups, thresholds, graded):
  c = rng.uniform(0, 1, n).astype(np.float32)
  hits = rng.integers(0, n, size=min(n, 5))
  c[hits] = rng.choice(np.concatenate([thresholds, [0.0, 1.0]]).astype(np.float32), size=hits.size)
  ok = rng.uniform(0, 1, n).astype(np.float32) if graded else rng.uniform(size=n) < c
  groups = rng.integers(0, num_groups, n)
  return c, ok, groups


@settings(max_examples=12, deadline=None)
@given(
    n=st.sampled_from([5, 300]),
    num_groups=st.sampled_from([1, 7]),
    seed=st.integers(0, 2**31 - 1),
    normalize=st.sampled_from(["retained", "all"]),
    graded=st.booleans(),
)
def test_equals_reference_per_group(n, num_groups, seed, normalize, graded):
  rng = np.random.default_rng(seed)
  thresholds = rng.uniform(0, 0.995, 4).astype(np.float32)
  c, ok, groups = _data(rng, n, num_groups, thresholds, graded)
  got = sweep_by_group(c, ok, groups, thresholds, num_groups=num_groups, normalize=normalize)
  assert got.cwsa.shape == (num_groups, 4)
  np.testing.assert_array_equal(got.thresholds, thresholds)
  stacked = _stack(got)
  for g in range(num_groups):
    mask = groups == g
    if not mask.any():
      assert np.all(np.isnan(stacked[g]))  # empty group: every field NaN
      continue
    want = reference.sweep(c[mask], ok[mask], thresholds, normalize)
    np.testing.assert_allclose(stacked[g], want, atol=ATOL, rtol=0, equal_nan=True)


def test_equals_sweep_on_each_group():
  rng = np.random.default_rng(0)
  c, ok, _ = _data(rng, 3000, 5, GRID, False)
  groups = rng.permutation(np.arange(3000) % 5)  # equal sizes: one compilation of sweep
  got = _stack(sweep_by_group(c, ok, groups, GRID, num_groups=5))
  for g in range(5):
    mask = groups == g
    np.testing.assert_allclose(got[g], _stack(sweep(c[mask], ok[mask], GRID)), atol=ATOL, rtol=0,
                               equal_nan=True)


def test_chunked_path_matches_reference():
  # n above the 2^16-sample chunk of the exact sums: exercises the chunked loop and its last chunk.
  rng = np.random.default_rng(1)
  n = (1 << 16) + 1234
  thresholds = np.array([0.0, 0.5, 0.9, 0.99], np.float32)
  c, ok, groups = _data(rng, n, 3, thresholds, False)
  got = _stack(sweep_by_group(c, ok, groups, thresholds, num_groups=3))
  for g in range(3):
    mask = groups == g
    np.testing.assert_allclose(got[g], reference.sweep(c[mask], ok[mask], thresholds), atol=ATOL,
                               rtol=0, equal_nan=True)


def test_edge_cases_and_gap():
  c = np.array([0.0, 0.5, 1.0, 0.7, 0.7, 0.2], np.float32)
  ok = np.array([True, False, True, True, False, False])
  groups = np.array([0, 0, 0, 1, 1, 3])
  thresholds = np.array([0.5, 0.0, 0.9], np.float32)  # unsorted on purpose
  r = sweep_by_group(c, ok, groups, thresholds, num_groups=4)
  got = _stack(r)
  for g in (0, 1, 3):
    mask = groups == g
    np.testing.assert_allclose(got[g], reference.sweep(c[mask], ok[mask], thresholds), atol=ATOL,
                               rtol=0, equal_nan=True)
  assert np.all(np.isnan(got[2]))  # group 2 has no samples
  # Group 3 (one sample, c = 0.2) retains nothing at 0.5 and 0.9: CWSA 0, accuracy NaN.
  np.testing.assert_array_equal(got[3, [0, 2], 0], [0.0, 0.0])
  assert np.all(np.isnan(got[3, [0, 2], 1]))
  cwsa = np.asarray(r.cwsa)
  want_gap = np.nanmax(cwsa, axis=0) - np.nanmin(cwsa, axis=0)
  np.testing.assert_allclose(group_gap(r), want_gap, atol=1e-7)
  acc = np.asarray(r.selective_accuracy)
  np.testing.assert_allclose(group_gap(r, "selective_accuracy"),
                             np.nanmax(acc, axis=0) - np.nanmin(acc, axis=0), atol=1e-7)
  with pytest.raises(ValueError, match="field must be"):
    group_gap(r, "aurc")


def test_gap_all_nan_and_batched():
  rng = np.random.default_rng(2)
  c, ok, groups = _data(rng, 300, 7, GRID[:4], False)
  groups = np.where(groups == 6, 5, groups)  # group 6 empty
  cb, okb, gb = np.stack([c, c[::-1]]), np.stack([ok, ok[::-1]]), np.stack([groups, groups[::-1]])
  r = sweep_by_group(cb, okb, gb, GRID[:4], num_groups=7)
  assert r.cwsa.shape == (2, 7, 4) and group_gap(r).shape == (2, 4)
  for b in range(2):
    single = sweep_by_group(cb[b], okb[b], gb[b], GRID[:4], num_groups=7)
    np.testing.assert_allclose(_stack(r)[b], _stack(single), atol=0, equal_nan=True)
  # Selective accuracy NaN in every group -> NaN gap.
  r1 = sweep_by_group(np.array([0.1, 0.2], np.float32), [True, False], [0, 1],
                      np.array([0.5, 0.0], np.float32), num_groups=2)
  gap = np.asarray(group_gap(r1, "selective_accuracy"))
  assert np.isnan(gap[0]) and gap[1] == 1.0


def test_inside_jit_out_of_range_gives_nan():
  c = jnp.array([0.9, 0.6, 0.8, 0.55]); ok = jnp.array([True, False, True, True])
  f = jax.jit(lambda g: sweep_by_group(c, ok, g, jnp.array([0.5, 0.7]), num_groups=2).cwsa)
  assert not bool(jnp.any(jnp.isnan(f(jnp.array([0, 0, 1, 1])))))
  assert bool(jnp.all(jnp.isnan(f(jnp.array([0, 0, 1, 2])))))
  assert bool(jnp.all(jnp.isnan(f(jnp.array([0, -1, 1, 1])))))


C4 = [0.9, 0.6, 0.8, 0.55]
OK4 = [True, False, True, True]


@pytest.mark.parametrize("kwargs, match", [
    (dict(groups=[0, 1, 2, 1], num_groups=2), r"groups must lie in \[0, 2\)"),
    (dict(groups=[0, -1, 0, 1], num_groups=2), r"groups must lie in \[0, 2\)"),
    (dict(groups=[0, 0.5, 0, 1], num_groups=2), "non-integer"),
    (dict(groups=[True, False, True, True], num_groups=2), "integer class indices"),
    (dict(groups=[0, 1, 0], num_groups=2), "same shape"),
    (dict(groups=[0, 1, 0, 1], num_groups=0), "num_groups must be >= 1"),
    (dict(groups=[0, 1, 0, 1], num_groups=-3), "num_groups must be >= 1"),
    (dict(groups=[0, 1, 0, 1], num_groups=2.0), "num_groups must be a positive int"),
    (dict(groups=[0, 1, 0, 1], num_groups=2, correct=[1.5, 0, 1, 1]), r"correct must lie in \[0, 1\]"),
    (dict(groups=[0, 1, 0, 1], num_groups=2, confidences=[0.9, 0.6, 1.8, 0.5]), "confidences must lie"),
    (dict(groups=[0, 1, 0, 1], num_groups=2, thresholds=[1.0]), "thresholds must lie in"),
    (dict(groups=[0, 1, 0, 1], num_groups=2, normalize="none"), "normalize must be one of"),
])
def test_bad_inputs(kwargs, match):
  kwargs = dict(kwargs)
  args = (kwargs.pop("confidences", C4), kwargs.pop("correct", OK4), kwargs.pop("groups"),
          kwargs.pop("thresholds", [0.5, 0.7]))
  with pytest.raises(ValueError, match=match):
    sweep_by_group(*args, **kwargs)


def test_no_retrace_for_new_data_of_the_same_shape():
  from cwsa_jax import _groups
  rng = np.random.default_rng(5)
  c, ok, groups = _data(rng, 300, 7, GRID[:4], False)
  sweep_by_group(c, ok, groups, GRID[:4], num_groups=7)
  size = _groups._sweep_by_group_1d._cache_size()
  c2, ok2, groups2 = _data(rng, 300, 7, GRID[:4], False)
  sweep_by_group(c2, ok2, groups2, GRID[4:8], num_groups=7)
  assert _groups._sweep_by_group_1d._cache_size() == size
