"""AUMCC against a float64 NumPy reference built from the paper's definitions."""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax._aumcc import aumcc

TOL = 2e-6
N = 256
GRID = np.linspace(0.5, 0.99, 20)  # the published code's threshold grid


def ref_point(conf, kappa, tau, normalize="retained"):
  """(coverage, selective accuracy, CWSA, CWSA+) at one threshold, float64, from Algorithm 1."""
  conf = np.asarray(conf, np.float32).astype(np.float64)
  kappa = np.asarray(kappa, np.float64)
  tau = float(np.float32(tau))
  keep = conf >= tau
  if not keep.any():
    return 0.0, np.nan, 0.0, 0.0
  phi = (conf[keep] - tau) / (1 - tau)
  k = kappa[keep]
  denominator = len(conf) if normalize == "all" else keep.sum()
  return (keep.mean(), k.mean(), np.sum(phi * (2 * k - 1)) / denominator,
          np.sum(phi * k) / keep.sum())


def ref_aumcc(conf, kappa, thresholds, metric="cwsa", axis="coverage", normalize="retained"):
  column = {"selective_accuracy": 1, "cwsa": 2, "cwsa_plus": 3}[metric]
  taus = np.sort(np.asarray(thresholds, np.float32).astype(np.float64))
  points = [ref_point(conf, kappa, t, normalize) for t in taus]
  valid = [p[0] > 0 for p in points]
  if not any(valid):
    return np.nan
  area = 0.0
  for i in range(len(taus) - 1):
    if valid[i] and valid[i + 1]:
      width = points[i][0] - points[i + 1][0] if axis == "coverage" else taus[i + 1] - taus[i]
      area += width * (points[i][column] + points[i + 1][column]) / 2
  return area


def synthetic(rng, n=N):
  """The published code's 'calibrated' model: correct w.p. ~0.93, confidence by outcome."""
  correct = rng.random(n) < 0.9
  conf = np.where(correct, rng.uniform(0.8, 1.0, n), rng.uniform(0.5, 0.7, n))
  return conf.astype(np.float32), correct


def test_hand_example():
  c = [0.95, 0.9, 0.8, 0.7, 0.6]
  ok = [True, True, False, True, False]
  tau = [0.5, 0.75, 0.85]
  # Selective accuracy 3/5, 2/3, 1 at coverage 1, .6, .4.
  assert float(aumcc(c, ok, tau, metric="selective_accuracy")) == pytest.approx(
      0.4 * (0.6 + 2 / 3) / 2 + 0.2 * (2 / 3 + 1) / 2, abs=TOL)
  assert float(aumcc(c, ok, tau, metric="selective_accuracy", axis="threshold")) == pytest.approx(
      0.25 * (0.6 + 2 / 3) / 2 + 0.1 * (2 / 3 + 1) / 2, abs=TOL)
  for metric in ("cwsa", "cwsa_plus"):
    for axis in ("coverage", "threshold"):
      assert float(aumcc(c, ok, tau, metric=metric, axis=axis)) == pytest.approx(
          ref_aumcc(c, ok, tau, metric, axis), abs=TOL)


@pytest.mark.parametrize("metric", ["cwsa", "cwsa_plus", "selective_accuracy"])
@pytest.mark.parametrize("axis", ["coverage", "threshold"])
@pytest.mark.parametrize("normalize", ["retained", "all"])
def test_random_against_reference(metric, axis, normalize):
  rng = np.random.default_rng(zlib.crc32(repr((metric, axis, normalize)).encode()))
  conf, correct = synthetic(rng)
  shuffled = rng.permutation(GRID)  # order of the thresholds does not matter
  got = aumcc(conf, correct, shuffled, metric=metric, axis=axis, normalize=normalize)
  assert float(got) == pytest.approx(
      ref_aumcc(conf, correct, GRID, metric, axis, normalize), abs=TOL)


def test_graded_correctness_and_ties():
  rng = np.random.default_rng(0)
  conf = np.round(rng.random(N), 2).astype(np.float32)  # ties, some exactly at thresholds
  kappa = rng.random(N).astype(np.float32)
  grid = np.round(np.linspace(0.0, 0.95, 20), 2)
  for metric in ("cwsa", "cwsa_plus", "selective_accuracy"):
    assert float(aumcc(conf, kappa, grid, metric=metric)) == pytest.approx(
        ref_aumcc(conf, kappa, grid, metric), abs=TOL)


def test_empty_retained_sets_are_left_out():
  conf = np.array([0.55, 0.6, 0.62, 0.7], np.float32)
  ok = np.array([True, False, True, True])
  grid = [0.5, 0.6, 0.65, 0.8, 0.9]  # 0.8 and 0.9 retain nothing
  for metric in ("cwsa", "cwsa_plus", "selective_accuracy"):
    value = float(aumcc(conf, ok, grid, metric=metric))
    assert np.isfinite(value)  # the NaN selective accuracy of an empty set never leaks
    assert value == pytest.approx(ref_aumcc(conf, ok, grid, metric), abs=TOL)
    # Same area as the curve cut at the last non-empty threshold.
    assert value == pytest.approx(float(aumcc(conf, ok, grid[:3], metric=metric)), abs=TOL)
  # One non-empty point: no segment, area 0. None: NaN.
  assert float(aumcc(conf, ok, [0.65, 0.8])) == 0.0
  assert np.isnan(float(aumcc(conf, ok, [0.8, 0.9])))


def test_all_correct_all_wrong_one_sample_and_extremes():
  conf = np.linspace(0.0, 1.0, 11).astype(np.float32)  # includes 0.0 and 1.0
  grid = [0.0, 0.25, 0.5, 0.75]
  cov = [1.0, 8 / 11, 6 / 11, 3 / 11]
  sa_area = sum(cov[i] - cov[i + 1] for i in range(3))
  assert float(aumcc(conf, np.ones(11, bool), grid, metric="selective_accuracy")) == pytest.approx(
      sa_area, abs=TOL)
  assert float(aumcc(conf, np.zeros(11, bool), grid, metric="selective_accuracy")) == 0.0
  for metric in ("cwsa", "cwsa_plus"):
    for ok in (np.ones(11, bool), np.zeros(11, bool)):
      assert float(aumcc(conf, ok, grid, metric=metric)) == pytest.approx(
          ref_aumcc(conf, ok, grid, metric), abs=TOL)
  assert float(aumcc([0.9], [True], [0.5, 0.8], metric="cwsa_plus")) == 0.0  # one sample
  assert float(aumcc([0.9], [True], [0.5, 0.8], metric="cwsa", axis="threshold")) == pytest.approx(
      0.3 * (0.8 + 0.5) / 2, abs=TOL)


def test_batch_axes_jit_and_vmap():
  rng = np.random.default_rng(1)
  conf = np.stack([synthetic(rng)[0] for _ in range(3)])
  correct = rng.random((3, N)) < 0.8
  grid = jnp.asarray(GRID, jnp.float32)
  loop = [float(aumcc(conf[i], correct[i], grid)) for i in range(3)]
  np.testing.assert_allclose(aumcc(conf, correct, grid), loop, atol=1e-7)
  np.testing.assert_allclose(jax.vmap(aumcc, in_axes=(0, 0, None))(conf, correct, grid), loop,
                             atol=1e-7)
  jitted = jax.jit(functools.partial(aumcc, metric="cwsa_plus", axis="threshold"))
  assert float(jitted(conf[0], correct[0], grid)) == pytest.approx(
      ref_aumcc(conf[0], correct[0], GRID, "cwsa_plus", "threshold"), abs=TOL)


def test_bad_input():
  c, ok = [0.6, 0.7], [True, False]
  with pytest.raises(ValueError, match="metric"):
    aumcc(c, ok, GRID, metric="accuracy")
  with pytest.raises(ValueError, match="axis"):
    aumcc(c, ok, GRID, axis="tau")
  with pytest.raises(ValueError, match="at least 2"):
    aumcc(c, ok, [0.5])
  with pytest.raises(ValueError, match="at least 2"):
    aumcc(c, ok, [[0.5, 0.6]])
  with pytest.raises(ValueError, match="threshold"):
    aumcc(c, ok, [0.5, 1.0])
  with pytest.raises(ValueError, match="NaN"):
    aumcc([0.6, np.nan], ok, GRID)
  with pytest.raises(ValueError, match="same shape"):
    aumcc([0.6], ok, GRID)
  with pytest.raises(ValueError, match="normalize"):
    aumcc(c, ok, GRID, normalize="n")
