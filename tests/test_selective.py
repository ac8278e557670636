"""Hard metrics at one threshold against the float64 reference (tests/reference.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference
from cwsa_jax import coverage, cwsa, cwsa_plus, selective_accuracy

ATOL = 2e-6


def _all(c, ok, tau, normalize="retained"):
  return np.array([
      float(coverage(c, tau)),
      float(selective_accuracy(c, ok, tau)),
      float(cwsa(c, ok, tau, normalize=normalize)),
      float(cwsa_plus(c, ok, tau)),
  ])


def _check(c, ok, tau, normalize="retained"):
  c = np.asarray(c, np.float32)
  tau32 = np.float32(tau)
  got = _all(c, ok, tau32, normalize)
  want = np.array(reference.hard_metrics(c, ok, tau32, normalize))
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, equal_nan=True)
  return got


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([1, 2, 7, 300]),  # few shapes: each new shape compiles
    tau=st.sampled_from([0.0, 0.1, 0.5, 0.73, 0.9, 0.99]),
    seed=st.integers(0, 2**31 - 1),
    normalize=st.sampled_from(["retained", "all"]),
)
def test_random_against_reference(n, tau, seed, normalize):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  ok = rng.uniform(size=n) < c
  _check(c, ok, tau, normalize)


def test_worked_example_by_hand():
  c = np.array([0.9, 0.6, 0.8, 0.55], np.float32)
  ok = np.array([1, 0, 1, 1])
  # tau = 0.7 keeps 0.9 (phi 2/3, correct) and 0.8 (phi 1/3, correct).
  got = _check(c, ok, 0.7)
  np.testing.assert_allclose(got, [0.5, 1.0, 0.5, 0.5], atol=1e-6)
  # tau = 0.5: phi = 0.8, 0.2, 0.6, 0.1 -> CWSA = (0.8 - 0.2 + 0.6 + 0.1)/4.
  got = _check(c, ok, 0.5)
  np.testing.assert_allclose(got, [1.0, 0.75, 1.3 / 4, 1.5 / 4], atol=1e-6)


def test_ties_at_threshold_are_retained_with_zero_weight():
  tau = np.float32(0.75)
  c = np.array([0.75, 0.75, 0.75, 1.0], np.float32)
  ok = np.array([0, 0, 1, 1])
  got = _check(c, ok, tau)
  assert got[0] == 1.0  # all four retained, including the three ties
  assert got[1] == 0.5
  # Only the c = 1 sample has phi > 0 (phi = 1): CWSA = CWSA+ = 1/4.
  np.testing.assert_allclose(got[2:], [0.25, 0.25], atol=1e-7)


def test_confidence_exactly_zero_and_one():
  c = np.array([0.0, 1.0, 1.0, 0.0], np.float32)
  ok = np.array([1, 1, 0, 0])
  for tau in [0.0, 0.5, 0.99]:
    _check(c, ok, tau)
  got = _check(c, ok, 0.0)
  np.testing.assert_allclose(got, [1.0, 0.5, 0.0, 0.25], atol=1e-7)


@pytest.mark.parametrize("tau", [0.0, 0.5, 0.99])
def test_one_sample(tau):
  for c0 in [0.0, 0.5, 0.995, 1.0]:
    for ok in [0, 1]:
      _check(np.array([c0]), np.array([ok]), tau)


def test_all_correct_and_all_wrong():
  rng = np.random.default_rng(0)
  c = rng.uniform(0.5, 1, 200).astype(np.float32)
  right = _check(c, np.ones(200, bool), 0.6)
  wrong = _check(c, np.zeros(200, bool), 0.6)
  assert right[1] == 1.0 and wrong[1] == 0.0
  assert right[2] == pytest.approx(right[3], abs=1e-7)  # CWSA = CWSA+ when all correct
  assert wrong[3] == 0.0 and wrong[2] == pytest.approx(-right[2], abs=1e-6)


def test_empty_retained_set():
  c = np.array([0.1, 0.2, 0.3], np.float32)
  got = _all(c, np.array([1, 0, 1]), 0.5)
  assert got[0] == 0.0 and np.isnan(got[1]) and got[2] == 0.0 and got[3] == 0.0


def test_published_code_normalization_is_coverage_times_cwsa():
  rng = np.random.default_rng(3)
  c = rng.uniform(0.3, 1, 1000).astype(np.float32)
  ok = rng.uniform(size=1000) < 0.6
  for tau in [0.5, 0.8, 0.95]:
    paper = float(cwsa(c, ok, tau))
    code = float(cwsa(c, ok, tau, normalize="all"))
    assert code == pytest.approx(float(coverage(c, tau)) * paper, abs=1e-6)
    _check(c, ok, tau, "all")


def test_graded_correctness_against_reference():
  rng = np.random.default_rng(5)
  c = rng.uniform(0, 1, 500).astype(np.float32)
  kappa = rng.uniform(0, 1, 500).astype(np.float32)
  for tau in [0.0, 0.4, 0.9, 0.99]:
    _check(c, kappa, tau)


def test_graded_zero_one_equals_binary():
  rng = np.random.default_rng(6)
  c = rng.uniform(0, 1, 500).astype(np.float32)
  ok = rng.uniform(size=500) < c
  for tau in [0.0, 0.6, 0.99]:
    np.testing.assert_array_equal(_all(c, ok, tau), _all(c, ok.astype(np.float32), tau))


def test_jit_and_vmap_match_eager():
  rng = np.random.default_rng(7)
  c = jnp.asarray(rng.uniform(0, 1, (4, 300)).astype(np.float32))
  ok = jnp.asarray(rng.uniform(size=(4, 300)) < 0.7)
  taus = jnp.array([0.2, 0.5, 0.8, 0.95], jnp.float32)
  eager = np.array([float(cwsa(c[i], ok[i], taus[i])) for i in range(4)])
  jitted = jax.jit(cwsa)
  np.testing.assert_allclose(np.array([float(jitted(c[i], ok[i], taus[i])) for i in range(4)]), eager, atol=1e-7)
  np.testing.assert_allclose(np.asarray(jax.vmap(cwsa)(c, ok, taus)), eager, atol=1e-7)
  # Leading batch axes are mapped over too.
  batched = cwsa_plus(c, ok, 0.5)
  assert batched.shape == (4,)
  np.testing.assert_allclose(np.asarray(batched), [float(cwsa_plus(c[i], ok[i], 0.5)) for i in range(4)], atol=1e-7)


def test_large_n_float32_accuracy():
  """n = 10^7 (several exact-sum chunks), thresholds up to 0.99: within 2e-6 of float64."""
  rng = np.random.default_rng(11)
  n = 10**7
  c = rng.uniform(0.0, 1.0, n).astype(np.float32)
  c[: n // 2] = rng.uniform(0.98, 1.0, n // 2).astype(np.float32)  # mass right above 0.99
  ok = rng.uniform(size=n) < c
  for tau in [0.0, 0.5, 0.99]:
    _check(c, ok, tau)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: cwsa([0.5, 0.6], [1, 0], 1.0), "tau must lie in \\[0, 1\\)"),
        (lambda: cwsa([0.5, 0.6], [1, 0], -0.1), "tau must lie in"),
        (lambda: cwsa([0.5, 0.6], [1, 0], float("nan")), "tau must be finite"),
        (lambda: cwsa([0.5, float("nan")], [1, 0], 0.5), "NaN or infinite"),
        (lambda: cwsa([0.5, float("inf")], [1, 0], 0.5), "NaN or infinite"),
        (lambda: cwsa([0.5, 1.2], [1, 0], 0.5), "must lie in \\[0, 1\\]"),
        (lambda: cwsa([-0.1, 0.5], [1, 0], 0.5), "must lie in \\[0, 1\\]"),
        (lambda: cwsa([0.5, 0.6], [1, 0, 1], 0.5), "same shape"),
        (lambda: cwsa([], [], 0.5), "empty"),
        (lambda: cwsa([0.5, 0.6], [2, 0], 0.5), "boolean or 0/1"),
        (lambda: cwsa([0.5, 0.6], [1.5, 0.0], 0.5), "kappa"),
        (lambda: cwsa([0.5, 0.6], [1, 0], 0.5, normalize="n"), "normalize must be one of"),
        (lambda: cwsa([0.5, 0.6], [1, 0], [0.5, 0.6]), "tau must be a scalar"),
        (lambda: coverage(["a", "b"], 0.5), "confidences"),
        (lambda: selective_accuracy(0.5, 1, 0.5), "scalar"),
    ],
)
def test_bad_input_raises_value_error(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_inside_jit_invalid_values_give_nan():
  """Value checks cannot run on tracers: invalid inputs give NaN, never a silent number."""
  f = jax.jit(cwsa)
  assert np.isnan(float(f(jnp.array([0.5, jnp.nan]), jnp.array([True, False]), 0.5)))
  assert np.isnan(float(f(jnp.array([0.5, 1.5]), jnp.array([True, False]), 0.5)))
  assert np.isnan(float(f(jnp.array([0.5, 0.7]), jnp.array([True, False]), 1.0)))
  assert np.isfinite(float(f(jnp.array([0.5, 0.7]), jnp.array([True, False]), 0.5)))
