"""Tests of cwsa_jax.fit_temperature (post-hoc temperature scaling)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw


def nll64(logits, labels, temperature):
  """Mean NLL of softmax(logits / T) in float64 (T may be an array of temperatures)."""
  z = np.asarray(logits, np.float64)[None] / np.reshape(temperature, (-1, 1, 1))
  z = z - z.max(-1, keepdims=True)
  log_norm = np.log(np.exp(z).sum(-1))
  true = np.take_along_axis(z, np.asarray(labels)[None, :, None], -1)[..., 0]
  return (log_norm - true).mean(-1)


def brute_force_temperature(logits, labels, low=1e-2, high=1e2):
  """Grid search on log T, refined three times around the best point (no scipy)."""
  lo, hi = np.log(low), np.log(high)
  for _ in range(4):
    grid = np.linspace(lo, hi, 201)
    values = nll64(logits, labels, np.exp(grid))
    best = int(np.argmin(values))
    step = grid[1] - grid[0]
    lo, hi = grid[best] - step, grid[best] + step
  return float(np.exp(grid[best]))


def sample_at_temperature(seed, n, num_classes, true_temperature, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.normal(size=(n, num_classes))).astype(np.float32)
  z = logits.astype(np.float64) / true_temperature
  labels = (z + rng.gumbel(size=z.shape)).argmax(-1).astype(np.int32)  # ~ softmax(z / T)
  return logits, labels


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 2.5])
def test_recovers_the_temperature_the_labels_were_drawn_at(true_temperature):
  logits, labels = sample_at_temperature(0, 20000, 10, true_temperature)
  fitted = float(cw.fit_temperature(logits, labels))
  assert abs(fitted / true_temperature - 1.0) < 0.05, fitted


@pytest.mark.parametrize("seed, n, num_classes, scale", [
    (1, 500, 5, 1.0), (3, 300, 3, 0.3), (4, 500, 100, 8.0)])
def test_matches_float64_grid_search(seed, n, num_classes, scale):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.normal(size=(n, num_classes))).astype(np.float32)
  # Overconfident: 60% of the labels follow the argmax, the rest are uniform.
  labels = np.where(rng.random(n) < 0.6, logits.argmax(-1),
                    rng.integers(0, num_classes, n)).astype(np.int32)
  reference = brute_force_temperature(logits, labels)
  fitted = float(cw.fit_temperature(logits, labels))
  assert abs(fitted / reference - 1.0) < 2e-5, (fitted, reference)
  # And the fit is (to float32 accuracy) at least as good as the grid's best.
  assert nll64(logits, labels, fitted)[0] <= nll64(logits, labels, reference)[0] + 1e-6


def test_scale_equivariance_and_integer_logits():
  logits, labels = sample_at_temperature(5, 1000, 4, 1.5)
  t = float(cw.fit_temperature(logits, labels))
  assert abs(float(cw.fit_temperature(4.0 * logits, labels)) / (4.0 * t) - 1.0) < 1e-4
  rounded = np.round(logits * 10).astype(np.int32)
  assert abs(float(cw.fit_temperature(rounded, labels)) / (10 * t) - 1.0) < 0.02


def test_jit_and_batch_axes():
  parts = [sample_at_temperature(6 + i, 400, 5, t) for i, t in enumerate((0.7, 1.0, 2.0))]
  logits = np.stack([p[0] for p in parts])
  labels = np.stack([p[1] for p in parts])
  rows = [float(cw.fit_temperature(logits[i], labels[i])) for i in range(3)]
  references = [brute_force_temperature(logits[i], labels[i]) for i in range(3)]
  np.testing.assert_allclose(rows, references, rtol=2e-5)
  # Leading batch axes, inside a user's jit (value checks off, NaN for bad rows).
  logits[1, 0, 0] = np.nan
  batched = np.asarray(jax.jit(cw.fit_temperature)(jnp.asarray(logits), jnp.asarray(labels)))
  assert batched.shape == (3,) and np.isnan(batched[1])
  np.testing.assert_allclose(batched[[0, 2]], [rows[0], rows[2]], rtol=1e-5)


def test_monotone_nll_returns_the_better_bound():
  logits = np.float32([[3.0, 0.0, -1.0], [0.0, 2.0, 1.0]] * 10)
  # Every prediction right: the NLL falls as T -> 0.
  right = np.int32([0, 1] * 10)
  fitted = float(cw.fit_temperature(logits, right, bounds=(0.05, 20.0)))
  assert fitted == pytest.approx(0.05, rel=1e-5)
  # Every label the least likely class: the NLL falls as T -> infinity.
  wrong = np.int32([2, 0] * 10)
  fitted = float(cw.fit_temperature(logits, wrong, bounds=(0.05, 20.0)))
  assert fitted == pytest.approx(20.0, rel=1e-5)
  # Inside the bounds the fit is the NLL minimum, so it beats both bounds.
  mixed = np.int32([0, 1, 1, 1] * 5)
  t = float(cw.fit_temperature(logits, mixed, bounds=(0.05, 20.0)))
  assert 0.05 < t < 20.0
  assert nll64(logits, mixed, t)[0] < min(nll64(logits, mixed, [0.05, 20.0]))


def test_extreme_logits_stay_finite():
  logits, labels = sample_at_temperature(9, 500, 5, 2.0)
  t = float(cw.fit_temperature(1e4 * logits / 3.0, labels))
  assert np.isfinite(t)
  reference = brute_force_temperature(1e4 * logits.astype(np.float64) / 3.0, labels, 1e1, 1e5)
  assert abs(t / reference - 1.0) < 2e-5


@pytest.mark.parametrize("kwargs, match", [
    (dict(logits=np.float32([[0.0, np.nan], [0.0, 1.0]])), "NaN"),
    (dict(labels=[0, 2]), "labels"),
    (dict(labels=[0, 1, 1]), "labels"),
    (dict(logits=np.zeros((2, 1)), labels=[0, 0]), "2 classes"),
    (dict(logits=np.zeros((0, 2)), labels=np.zeros(0, np.int32)), "empty"),
    (dict(bounds=(0.0, 1.0)), "bounds"),
    (dict(bounds=(2.0, 1.0)), "bounds"),
    (dict(bounds=(1.0, np.inf)), "bounds"),
    (dict(bounds=1.0), "bounds"),
])
def test_bad_input_raises(kwargs, match):
  args = dict(logits=np.zeros((2, 2), np.float32), labels=[0, 1])
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    cw.fit_temperature(args.pop("logits"), args.pop("labels"), **args)
