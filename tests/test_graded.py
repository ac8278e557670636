"""Graded correctness kappa in [0, 1]: binary kappa as float reproduces the bool results,
graded kappa matches float64 references, values outside [0, 1] are rejected."""

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import reference
from cwsa_jax._decompose import contributions
from cwsa_jax._groups import sweep_by_group
from cwsa_jax._select import select_threshold
from cwsa_jax._selective import coverage, cwsa, cwsa_plus, selective_accuracy
from cwsa_jax._soft import soft_cwsa, soft_cwsa_band_area, soft_cwsa_plus, soft_cwsa_sweep
from cwsa_jax._sweep import sweep

ATOL = 2e-6
N = 300
GRID = np.linspace(0.0, 0.99, 12).astype(np.float32)


def soft_reference(confidences, correct, tau, temperature, plus=False, normalize="retained"):
  """float64 soft CWSA / CWSA+: sigmoid gate, phi clipped at 0 below tau."""
  c = np.asarray(confidences, np.float64)
  k = np.asarray(correct, np.float64)
  tau = float(np.float32(tau))
  g = 1.0 / (1.0 + np.exp(-(c - tau) / temperature))
  phi = np.maximum(c - tau, 0.0) / (1.0 - tau)
  score = k if plus else 2.0 * k - 1.0
  total = np.sum(g * phi * score)
  return total / np.sum(g) if normalize == "retained" else total / c.size


def _data(seed, n=N):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  c[:4] = [0.0, 1.0, GRID[3], GRID[7]]  # exact 0, 1 and ties with thresholds
  binary = rng.uniform(size=n) < c
  graded = rng.uniform(0, 1, n).astype(np.float32)
  graded[:6] = [0.0, 1.0, 0.5, 1.0, 0.0, 0.25]
  return c, binary, graded


def _sweep_stack(r):
  return np.stack([r.coverage, r.selective_accuracy, r.cwsa, r.cwsa_plus], axis=-1)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
@example(seed=3958)  # its selected threshold's value rounds 1 ulp apart in the two layouts
def test_binary_kappa_as_float_reproduces_bool(seed):
  c, binary, _ = _data(seed)
  as_float = binary.astype(np.float32)
  tau = np.float32(0.6)
  for fn in (cwsa, cwsa_plus, selective_accuracy):
    np.testing.assert_allclose(fn(c, as_float, tau), fn(c, binary, tau), atol=1e-6, rtol=0)
  np.testing.assert_allclose(cwsa(c, as_float, tau, normalize="all"),
                             cwsa(c, binary, tau, normalize="all"), atol=1e-6, rtol=0)
  np.testing.assert_allclose(_sweep_stack(sweep(c, as_float, GRID)),
                             _sweep_stack(sweep(c, binary, GRID)), atol=1e-6, rtol=0, equal_nan=True)
  groups = np.arange(N) % 3
  np.testing.assert_allclose(_sweep_stack(sweep_by_group(c, as_float, groups, GRID, num_groups=3)),
                             _sweep_stack(sweep_by_group(c, binary, groups, GRID, num_groups=3)),
                             atol=1e-6, rtol=0, equal_nan=True)
  # 0/1 integers are binary too.
  np.testing.assert_allclose(cwsa(c, binary.astype(np.int32), tau), cwsa(c, binary, tau), atol=0)
  np.testing.assert_allclose(contributions(c, as_float, tau).terms,
                             contributions(c, binary, tau).terms, atol=0)
  for plus in (False, True):
    fn = soft_cwsa_plus if plus else soft_cwsa
    np.testing.assert_allclose(fn(c, as_float, tau, temperature=0.05),
                               fn(c, binary, tau, temperature=0.05), atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        soft_cwsa_sweep(c, as_float, GRID, temperature=0.05, plus=plus),
        soft_cwsa_sweep(c, binary, GRID, temperature=0.05, plus=plus), atol=1e-6, rtol=0)
    np.testing.assert_allclose(soft_cwsa_band_area(c, as_float, plus=plus),
                               soft_cwsa_band_area(c, binary, plus=plus), atol=1e-6, rtol=0)
  # The same working point; its metric value from the graded layout's exact sums may round
  # 1 ulp apart, as the sweep's values above (seed 3958: 0.59242690 vs 0.59242684).
  chosen_float, chosen_bool = select_threshold(c, as_float), select_threshold(c, binary)
  assert chosen_float[:3] == chosen_bool[:3]
  np.testing.assert_allclose(chosen_float.value, chosen_bool.value, atol=1e-6, rtol=0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), normalize=st.sampled_from(["retained", "all"]))
def test_graded_against_float64_reference(seed, normalize):
  c, _, kappa = _data(seed)
  tau = np.float32(np.random.default_rng(seed).uniform(0, 0.99))
  want = reference.hard_metrics(c, kappa, tau, normalize)
  got = [coverage(c, tau), selective_accuracy(c, kappa, tau), cwsa(c, kappa, tau, normalize=normalize),
         cwsa_plus(c, kappa, tau)]
  np.testing.assert_allclose(np.array(got, np.float64), want, atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(_sweep_stack(sweep(c, kappa, GRID, normalize=normalize)),
                             reference.sweep(c, kappa, GRID, normalize), atol=ATOL, rtol=0,
                             equal_nan=True)
  for plus in (False, True):
    fn = soft_cwsa_plus if plus else soft_cwsa
    np.testing.assert_allclose(fn(c, kappa, tau, temperature=0.05),
                               soft_reference(c, kappa, tau, 0.05, plus), atol=ATOL, rtol=0)
    want_sweep = [soft_reference(c, kappa, t, 0.05, plus) for t in GRID]
    np.testing.assert_allclose(soft_cwsa_sweep(c, kappa, GRID, temperature=0.05, plus=plus),
                               want_sweep, atol=ATOL, rtol=0)
  np.testing.assert_allclose(soft_cwsa(c, kappa, tau, temperature=0.05, normalize="all"),
                             soft_reference(c, kappa, tau, 0.05, normalize="all"), atol=ATOL, rtol=0)


def test_graded_edge_cases():
  c = np.array([0.0, 0.5, 0.75, 1.0], np.float32)
  half = np.full(4, 0.5, np.float32)
  # kappa = 1/2 everywhere: 2 kappa - 1 = 0, so CWSA is exactly 0 and CWSA+ is half the mean phi.
  assert float(cwsa(c, half, 0.5)) == 0.0
  np.testing.assert_allclose(cwsa_plus(c, half, 0.5), 0.5 * (0 + 0.5 + 1) / 3, atol=1e-7)
  np.testing.assert_allclose(selective_accuracy(c, half, 0.5), 0.5, atol=0)
  # One sample; nothing retained.
  np.testing.assert_allclose(cwsa(c[3:], np.array([0.3], np.float32), 0.2), 1.0 * (2 * 0.3 - 1), atol=1e-7)
  assert float(cwsa(c[:1], np.array([0.3], np.float32), 0.2)) == 0.0
  assert np.isnan(float(selective_accuracy(c[:1], np.array([0.3], np.float32), 0.2)))


def test_graded_chunked_precision():
  # n above the 2^16-sample chunk: the 4-digit graded sums must stay within 2e-6.
  rng = np.random.default_rng(3)
  n = (1 << 16) + 4321
  c = rng.uniform(0, 1, n).astype(np.float32)
  kappa = rng.uniform(0, 1, n).astype(np.float32)
  thresholds = np.array([0.0, 0.5, 0.95], np.float32)
  np.testing.assert_allclose(_sweep_stack(sweep(c, kappa, thresholds)),
                             reference.sweep(c, kappa, thresholds), atol=ATOL, rtol=0)


BAD_KAPPA = [np.array([0.2, 1.5, 0.0], np.float32), np.array([0.2, -0.1, 0.0], np.float32),
             np.array([0.2, np.nan, 0.0], np.float32)]
C3 = np.array([0.9, 0.6, 0.7], np.float32)


@pytest.mark.parametrize("kappa", BAD_KAPPA, ids=["above", "below", "nan"])
@pytest.mark.parametrize("call", [
    lambda k: cwsa(C3, k, 0.5),
    lambda k: cwsa_plus(C3, k, 0.5),
    lambda k: selective_accuracy(C3, k, 0.5),
    lambda k: sweep(C3, k, GRID),
    lambda k: soft_cwsa(C3, k, 0.5),
    lambda k: soft_cwsa_plus(C3, k, 0.5),
    lambda k: soft_cwsa_sweep(C3, k, GRID),
    lambda k: contributions(C3, k, 0.5),
    lambda k: sweep_by_group(C3, k, [0, 1, 0], GRID, num_groups=2),
    lambda k: select_threshold(C3, k),
], ids=["cwsa", "cwsa_plus", "selective_accuracy", "sweep", "soft_cwsa", "soft_cwsa_plus",
        "soft_cwsa_sweep", "contributions", "sweep_by_group", "select_threshold"])
def test_kappa_outside_unit_interval_raises(kappa, call):
  with pytest.raises(ValueError, match=r"correct (must lie in \[0, 1\]|contains NaN)"):
    call(kappa)
