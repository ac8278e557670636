"""Tests of the smooth ECE in cwsa_jax._smooth_ece."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cwsa_jax._bootstrap import bootstrap_ci
from cwsa_jax._smooth_ece import _mesh_sums, automatic_bandwidth, searched_smooth_ece, smooth_ece
from cwsa_jax.cli._intervals import SMOOTH_RESAMPLES

N = 200  # the size of most tests: one compilation per form
BANDWIDTHS = (0.01, 0.05, 0.3)


# ---------------------------------------------------------------------------
# float64 NumPy reference, written from relplot's definition without a mesh: the
# reflected Gaussian summed directly at relplot's T evaluation points.

def reference_at(c, kappa, sigma):
  """smECE_sigma, float64: relplot's evaluation points and boundary rule, direct kernel sums."""
  c = np.asarray(c, np.float64).ravel()
  r = c - np.asarray(kappa, np.float64).ravel()
  cells = max(2000, round(20 / sigma)) // 2  # relplot's mesh
  on_boundary = np.maximum(0, 1 - c * cells) + np.maximum(0, c * cells - (cells - 1))
  weight = 1 - on_boundary / 2  # relplot's boundary mesh node is reflected onto itself
  t = np.linspace(0, 1, max(round(10 / sigma), 200))[:, None]

  def gauss(x):
    return np.where(np.abs(x) <= 0.5, np.exp(-0.5 * (x / sigma) ** 2), 0) / (
        np.sqrt(2 * np.pi) * sigma)

  kernel = (gauss(t - c) + gauss(t + c) + gauss(t - 2 + c)) * weight
  return np.sum(np.abs(kernel @ r)) / np.sum(kernel.sum(axis=1) + 1e-4)


def reference_automatic(c, kappa, steps=40):
  """(smECE, sigma*): bisection of sigma < max(smECE_sigma, 0.001) on [0.001, 1]."""
  low, high = 1e-3, 1.0
  for _ in range(steps):
    middle = (low + high) / 2
    if max(reference_at(c, kappa, middle), 1e-3) > middle:
      low = middle
    else:
      high = middle
  return reference_at(c, kappa, high), high


def confident_classifier(seed, n, temperature=1.0, num_classes=10):
  """Top-label (confidence, correct) of a simulated classifier; labels drawn from softmax(logits),
  predictions from softmax(logits / temperature): calibrated at temperature 1."""
  rng = np.random.default_rng(seed)
  logits = 3 * rng.normal(size=(n, num_classes))
  logits[:, 0] += 2
  p = np.exp(logits / temperature)
  p /= p.sum(axis=1, keepdims=True)
  q = np.exp(logits)
  q /= q.sum(axis=1, keepdims=True)
  labels = (q.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
  return p.max(axis=1), (p.argmax(axis=1) == labels)


def random_case(seed, n=N, graded=False):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n) ** 0.3  # most mass near 1, as top-label confidences
  kappa = rng.uniform(0, 1, n) if graded else rng.random(n) < c ** 2
  return c.astype(np.float32), kappa


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("sigma", BANDWIDTHS)
def test_fixed_bandwidth_matches_reference(sigma):
  for seed in range(2):
    c, ok = random_case(seed)
    assert float(smooth_ece(c, ok, bandwidth=sigma)) == pytest.approx(
        reference_at(c, ok, sigma), abs=1e-4)


def test_graded_correctness_and_ties_match_reference():
  c, kappa = random_case(3, graded=True)
  c = np.round(c * 20) / 20  # 21 distinct values, 0 and 1 among them
  assert float(smooth_ece(c, kappa.astype(np.float32), bandwidth=0.05)) == pytest.approx(
      reference_at(c, kappa, 0.05), abs=1e-4)


def test_automatic_bandwidth_is_the_fixed_point():
  c, ok = random_case(4)
  value, sigma = reference_automatic(c, ok)
  ours = float(smooth_ece(c, ok))
  bandwidth = float(automatic_bandwidth(jnp.asarray(c), jnp.asarray(ok, jnp.float32)))
  assert ours == pytest.approx(value, abs=1e-4)
  assert bandwidth == pytest.approx(sigma, abs=1e-4)
  assert ours == pytest.approx(bandwidth, abs=1e-6)  # smECE_{sigma*} = sigma*


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sigma=st.floats(0.01, 1.0))
def test_random_bandwidths_match_reference(seed, sigma):
  c, ok = random_case(seed)
  assert float(smooth_ece(c, ok, bandwidth=sigma)) == pytest.approx(
      reference_at(c, ok, sigma), abs=1e-4)


def test_edge_cases():
  ones, zeros = np.ones(N, np.float32), np.zeros(N, np.float32)
  assert float(smooth_ece(ones, ones)) == pytest.approx(0, abs=1e-6)  # all correct at 1
  assert float(smooth_ece(zeros, zeros)) == pytest.approx(0, abs=1e-6)  # all wrong at 0
  assert float(smooth_ece(ones, zeros)) == pytest.approx(1, abs=1e-3)  # all wrong at 1
  constant = np.full(N, 0.7, np.float32)
  seventy = np.arange(N) < 0.7 * N
  assert float(smooth_ece(constant, seventy)) == pytest.approx(0, abs=1e-6)
  assert float(smooth_ece(constant, np.arange(N) < N // 2)) == pytest.approx(0.2, abs=1e-3)
  # one sample: |c - kappa| at every bandwidth, so also at the fixed point
  for c, ok in ((0.7, True), (0.2, True), (0.9, False)):
    for bandwidth in (None, 0.05):
      assert float(smooth_ece([c], [ok], bandwidth=bandwidth)) == pytest.approx(
          abs(c - ok), abs=1e-3)


def test_below_the_floor_the_bandwidth_is_0_001():
  c = np.full(N, 0.6, np.float32)
  graded = np.full(N, 0.6, np.float32)  # calibrated exactly: smECE_sigma = 0 at every sigma
  sigma = automatic_bandwidth(jnp.asarray(c), jnp.asarray(graded))
  assert float(sigma) == pytest.approx(1e-3, rel=1e-4)


def test_batched_search_finds_the_bisections_fixed_point():
  """searched_smooth_ece (the CLI's bootstrap resamples) finds smooth_ece's bandwidth and value
  to float32 rounding, from plain and repeat-weighted mesh sums (rows repeated w times)."""
  rng = np.random.default_rng(9)
  rows = [random_case(seed) for seed in (4, 5)]
  rows.append((random_case(6)[0], random_case(6, graded=True)[1].astype(np.float32)))
  rows.append((np.full(N, 0.6, np.float32), np.full(N, 0.6, np.float32)))  # below the floor
  repeats = rng.multinomial(N, np.full(N, 1 / N))  # a resample: N rows, one compiled program
  c, ok = rows[0]
  sums = [_mesh_sums(jnp.asarray(c), jnp.asarray(k, jnp.float32)) for c, k in rows]
  weighted = _mesh_sums(jnp.asarray(c), jnp.asarray(ok, jnp.float32), jnp.float32(repeats))
  rows.append((np.repeat(c, repeats), np.repeat(ok, repeats)))
  repeated = _mesh_sums(*(jnp.asarray(x, jnp.float32) for x in rows[-1]))
  np.testing.assert_allclose(weighted, repeated, atol=1e-4)
  sums.append(weighted)
  # The CLI's batch of SMOOTH_RESAMPLES rows (one compiled program), the rows repeated.
  batch = np.resize(np.stack(sums), (SMOOTH_RESAMPLES,) + weighted.shape)
  sigma, value = (np.asarray(x, np.float64)[:len(rows)] for x in searched_smooth_ece(batch))
  for i, (c, k) in enumerate(rows):
    want_sigma = float(automatic_bandwidth(jnp.asarray(c), jnp.asarray(k, jnp.float32)))
    assert sigma[i] == pytest.approx(want_sigma, abs=1e-6), i
    assert value[i] == pytest.approx(float(smooth_ece(c, k)), abs=1e-6), i
    if sigma[i] > 1.001e-3:  # above the floor: the fixed point smECE_{sigma*} = sigma*
      assert value[i] == pytest.approx(sigma[i], abs=1e-6), i
  assert sigma[3] == pytest.approx(1e-3, rel=1e-4) and value[3] == pytest.approx(0, abs=1e-6)


# ---------------------------------------------------------------------------
# relplot, the authors' package


def relplot_cases():
  cases = [(f"n={n} T={t}",) + confident_classifier(n + int(10 * t), n, t)
           for n in (1000, 100_000) for t in (0.7, 1.0, 1.5)]
  c, ok = confident_classifier(8, 100_000, 1.3)
  cases.append(("ties", np.round(c, 2), ok))  # about 70 distinct values, 1.0 among them
  return cases


def test_matches_relplot():
  import relplot  # a dev dependency (pyproject.toml)
  for name, c, ok in relplot_cases():
    ok = ok.astype(np.float64)
    for sigma in (0.01, 0.05, 0.2):
      ours = float(smooth_ece(c.astype(np.float32), ok, bandwidth=sigma))
      assert ours == pytest.approx(relplot.smECE_sigma(c, ok, sigma), abs=1e-4), (name, sigma)
    theirs, width = relplot.smECE(c, ok, return_width=True)
    ours = float(smooth_ece(c.astype(np.float32), ok))  # = sigma*, the fixed point
    # relplot halves [0, 1] ten times and stops at the upper end of the last interval,
    # which holds the fixed point found here.
    assert width - 2.0**-10 - 1e-6 <= ours <= width + 1e-6, name
    at_width = float(smooth_ece(c.astype(np.float32), ok, bandwidth=width))
    assert at_width == pytest.approx(theirs, abs=1e-4), name
    # so the values differ by at most (2^-10) |d smECE / d sigma|
    assert ours == pytest.approx(theirs, abs=1e-3), name


# ---------------------------------------------------------------------------
# batches, jit, vmap, bootstrap, dtypes


def test_batch_axes_jit_and_vmap_equal_rows():
  rows = [random_case(seed) for seed in range(6)]
  c = np.stack([r[0] for r in rows]).reshape(2, 3, N)
  ok = np.stack([r[1] for r in rows]).reshape(2, 3, N)
  for bandwidth in (None, 0.05):
    each = np.array([float(smooth_ece(ci, ki, bandwidth=bandwidth))
                     for ci, ki in zip(c.reshape(6, N), ok.reshape(6, N))]).reshape(2, 3)
    np.testing.assert_allclose(smooth_ece(c, ok, bandwidth=bandwidth), each, atol=1e-6)
    fn = functools.partial(smooth_ece, bandwidth=bandwidth)
    np.testing.assert_allclose(jax.jit(jax.vmap(fn))(c, ok), each, atol=1e-6)


def test_traced_bandwidth_under_jit():
  c, ok = random_case(0)
  fn = jax.jit(lambda c, ok, s: smooth_ece(c, ok, bandwidth=s))
  assert float(fn(c, ok, 0.05)) == pytest.approx(float(smooth_ece(c, ok, bandwidth=0.05)),
                                                 abs=1e-6)
  assert np.isnan(fn(c, ok, -0.05))


def test_bootstrap_ci():
  c, ok = random_case(1)
  result = bootstrap_ci(smooth_ece, c, ok, key=jax.random.key(0), num_resamples=64)
  estimate = float(smooth_ece(c, ok))
  assert float(result.estimate) == pytest.approx(estimate, abs=1e-6)
  assert float(result.low) < estimate < float(result.high)


def test_dtype_follows_inputs():
  c, ok = random_case(0)
  assert smooth_ece(c, ok).dtype == jnp.float32
  assert smooth_ece(c.astype(np.float16), ok).dtype == jnp.float32
  with jax.enable_x64(True):
    assert smooth_ece(jnp.asarray(c, jnp.float64), ok).dtype == jnp.float64


# ---------------------------------------------------------------------------
# gradients, float64 against central differences


def cell_centres(seed, n=16):
  """Confidences at the centres of the mesh cells (the mesh spreading has kinks at mesh points)."""
  c, _ = random_case(seed, n)
  c = (np.floor(np.asarray(c, np.float64) * 8000) + 0.5) / 8000
  rng = np.random.default_rng(seed)
  return c, (rng.random(n) < c ** 2).astype(np.float64), rng.uniform(0, 1, n)


def central_differences(fn, x, eps=1e-7):
  basis = np.eye(x.size)
  return np.array([(fn(x + eps * e) - fn(x - eps * e)) / (2 * eps) for e in basis])


@pytest.mark.parametrize("bandwidth", [0.05, None])
def test_gradient_matches_central_differences(bandwidth):
  with jax.enable_x64(True):
    c, ok, graded = cell_centres(0)
    by_confidence = functools.partial(lambda k, x: smooth_ece(x, k, bandwidth=bandwidth), ok)
    grad = np.asarray(jax.grad(by_confidence)(c))
    np.testing.assert_allclose(grad, central_differences(by_confidence, c), atol=1e-8)
    assert np.max(np.abs(grad)) > 1e-3
    by_kappa = functools.partial(lambda x, k: smooth_ece(x, k, bandwidth=bandwidth), c)
    grad = np.asarray(jax.grad(by_kappa)(graded))
    np.testing.assert_allclose(grad, central_differences(by_kappa, graded), atol=1e-8)
    tangent = np.random.default_rng(1).normal(size=c.size)
    _, forward = jax.jvp(by_confidence, (c,), (tangent,))
    assert float(forward) == pytest.approx(float(jax.grad(by_confidence)(c) @ tangent), abs=1e-12)


def test_gradients_finite_at_the_ends():
  for c, ok in ((np.ones(N, np.float32), np.ones(N)), (np.zeros(N, np.float32), np.ones(N))):
    for bandwidth in (None, 0.05):
      grad = jax.grad(lambda x: smooth_ece(x, ok, bandwidth=bandwidth))(c)
      assert np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------
# invalid inputs


@pytest.mark.parametrize("c, ok, bandwidth, match", [
    ([0.5, np.nan], [1, 0], None, "NaN"),
    ([0.5, 1.5], [1, 0], None, r"\[0, 1\]"),
    ([0.5, -0.1], [1, 0], 0.05, r"\[0, 1\]"),
    ([0.5, 0.6], [1, 2], None, "0/1"),
    ([0.5, 0.6], [1.0, 1.2], None, r"\[0, 1\]"),
    ([0.5, 0.6], [1, 0], 0.0, "bandwidth"),
    ([0.5, 0.6], [1, 0], -1.0, "bandwidth"),
    ([0.5, 0.6], [1, 0], np.inf, "bandwidth"),
    ([0.5, 0.6], [1, 0], [0.1, 0.2], "bandwidth"),
    ([0.5, 0.6], [1, 0, 1], None, "shape"),
    ([], [], None, "empty"),
])
def test_invalid_inputs_raise(c, ok, bandwidth, match):
  with pytest.raises(ValueError, match=match):
    smooth_ece(np.asarray(c, np.float32), np.asarray(ok), bandwidth=bandwidth)


def test_invalid_values_are_nan_under_jit():
  c, ok = random_case(0, 50)
  c2 = np.stack([c, c])
  ok2 = np.stack([ok, ok]).astype(np.float32)
  c2[1, 3] = np.nan
  for bandwidth in (None, 0.05):
    fn = jax.jit(functools.partial(smooth_ece, bandwidth=bandwidth))
    out = fn(c2, ok2)
    assert np.isfinite(out[0]) and np.isnan(out[1])
    graded = ok2.copy()
    graded[0, 0] = 1.5
    out = fn(np.stack([c, c]), graded)
    assert np.isnan(out[0]) and np.isfinite(out[1])
