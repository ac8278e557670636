"""Per-sample contributions: they average to CWSA / CWSA+ and match a float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference
from cwsa_jax._decompose import Contributions, contributions, most_damaging
from cwsa_jax._selective import cwsa, cwsa_plus

ATOL = 2e-6


def reference_terms(confidences, correct, tau, plus=False):
  """float64 per-sample terms, one sample at a time."""
  c = np.asarray(confidences, np.float64)
  k = np.asarray(correct, np.float64)
  tau = float(np.float32(tau))
  out = np.zeros(c.shape)
  for i in range(c.size):
    if c[i] >= tau:
      phi = (c[i] - tau) / (1.0 - tau)
      out[i] = phi * k[i] if plus else phi * (2.0 * k[i] - 1.0)
  return out


def _mean_retained(r: Contributions) -> float:
  t = np.asarray(r.terms, np.float64)
  m = np.asarray(r.retained)
  return float(t[m].sum() / m.sum()) if m.any() else 0.0


@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([1, 6, 200]),
    seed=st.integers(0, 2**31 - 1),
    graded=st.booleans(),
)
def test_average_is_the_metric(n, seed, graded):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  tau = np.float32(rng.choice([0.0, rng.uniform(0, 0.99), 0.99]))
  c[: min(n, 2)] = tau  # ties at tau are retained with weight 0
  ok = rng.uniform(0, 1, n).astype(np.float32) if graded else rng.uniform(size=n) < c
  for plus, metric_fn, index in [(False, cwsa, 2), (True, cwsa_plus, 3)]:
    r = contributions(c, ok, tau, metric="cwsa_plus" if plus else "cwsa")
    assert r.terms.shape == (n,) and r.terms.dtype == jnp.float32 and r.retained.dtype == jnp.bool_
    np.testing.assert_array_equal(r.retained, c >= tau)
    np.testing.assert_allclose(r.terms, reference_terms(c, ok, tau, plus), atol=ATOL, rtol=0)
    mean = _mean_retained(r)
    assert abs(mean - float(metric_fn(c, ok, tau))) <= ATOL
    assert abs(mean - reference.hard_metrics(c, ok, tau)[index]) <= ATOL
    # Mean over all samples is the normalize="all" variant.
    if not plus:
      all_mean = float(np.asarray(r.terms, np.float64).mean())
      assert abs(all_mean - float(cwsa(c, ok, tau, normalize="all"))) <= ATOL


def test_edge_cases():
  c = np.array([0.0, 0.5, 0.5, 1.0, 0.7, 0.2], np.float32)
  ok = np.array([True, False, True, False, True, False])
  r = contributions(c, ok, 0.5)
  np.testing.assert_allclose(r.terms, [0.0, 0.0, 0.0, -1.0, 0.4, 0.0], atol=1e-6)
  np.testing.assert_array_equal(r.retained, [False, True, True, True, True, False])
  # Empty retained set: all zero terms, metric 0.
  r = contributions(c[:1], ok[:1], 0.5)
  assert not bool(r.retained.any()) and float(r.terms[0]) == 0.0 and float(cwsa(c[:1], ok[:1], 0.5)) == 0.0
  # tau = 0 retains confidence 0 with weight 0.
  r = contributions(c, ok, 0.0)
  assert bool(r.retained.all()) and float(r.terms[0]) == 0.0
  # All correct / all wrong: terms are +phi / -phi.
  phi = np.clip((c - 0.5) / 0.5, 0, None) * (c >= 0.5)
  np.testing.assert_allclose(contributions(c, np.ones(6, bool), 0.5).terms, phi, atol=1e-6)
  np.testing.assert_allclose(contributions(c, np.zeros(6, bool), 0.5).terms, -phi, atol=1e-6)
  np.testing.assert_allclose(contributions(c, np.zeros(6, bool), 0.5, metric="cwsa_plus").terms, 0.0)


def test_batched_and_jit():
  rng = np.random.default_rng(1)
  c = rng.uniform(0, 1, (3, 200)).astype(np.float32)
  ok = rng.uniform(size=(3, 200)) < c
  r = contributions(c, ok, 0.6)
  assert r.terms.shape == (3, 200)
  got = np.asarray(r.terms, np.float64).sum(-1) / np.asarray(r.retained).sum(-1)
  np.testing.assert_allclose(got, cwsa(c, ok, 0.6), atol=ATOL, rtol=0)
  jitted = jax.jit(lambda a, b: contributions(a, b, 0.6).terms)(c[0], ok[0])
  np.testing.assert_allclose(jitted, r.terms[0], atol=0)
  # Inside jit, invalid values cannot raise: they give NaN terms.
  bad = jax.jit(lambda a, b: contributions(a, b, 0.6).terms)(jnp.asarray(c[0]).at[0].set(1.5), ok[0])
  assert bool(jnp.all(jnp.isnan(bad)))


def test_most_damaging():
  c = np.array([0.99, 0.6, 0.9, 0.3, 0.9, 0.8], np.float32)
  ok = np.array([False, False, False, False, False, True])
  r = contributions(c, ok, 0.5)
  # Most negative first; the tie between samples 2 and 4 keeps index order; sample 3 is abstained.
  assert most_damaging(r, k=10).tolist() == [0, 2, 4, 1]
  assert most_damaging(r, k=2).tolist() == [0, 2]
  assert most_damaging(contributions(c, ok, 0.5, metric="cwsa_plus"), k=3).tolist() == []
  with pytest.raises(ValueError, match="k must"):
    most_damaging(r, k=-1)


@pytest.mark.parametrize("args, match", [
    (([0.5, 1.5], [1, 0], 0.5), "confidences must lie in"),
    (([0.5, np.nan], [1, 0], 0.5), "NaN"),
    (([0.5, 0.6], [1, 0, 1], 0.5), "same shape"),
    (([0.5, 0.6], [1.2, 0.0], 0.5), r"correct must lie in \[0, 1\]"),
    (([0.5, 0.6], [2, 0], 0.5), "boolean or 0/1"),
    (([0.5, 0.6], [1, 0], 1.0), "tau must lie in"),
    (([0.5, 0.6], [1, 0], [0.5, 0.6]), "tau must be a scalar"),
    (([], [], 0.5), "empty"),
])
def test_bad_inputs(args, match):
  with pytest.raises(ValueError, match=match):
    contributions(*args)


def test_bad_metric():
  with pytest.raises(ValueError, match="metric must be one of"):
    contributions([0.5], [True], 0.5, metric="aurc")
