"""Tests of the classwise ECE in cwsa_jax._classwise_ece."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cwsa_jax._calibration import ece
from cwsa_jax._classwise_ece import classwise_ece

N, K = 300, 4  # the size of most tests: one compilation per option set
OPTIONS = [(norm, binning) for norm in ("l1", "l2", "max") for binning in ("width", "mass")]


# ---------------------------------------------------------------------------
# float64 NumPy reference, written from the definition, one class and one bin at a time.

def reference_ece(p, hit, num_bins, norm, binning):
  """Binned calibration error of the probabilities ``p`` against the indicators ``hit``."""
  p = np.asarray(p, np.float32).astype(np.float64)  # the values the metric sees
  hit = np.asarray(hit, np.float64)
  n = p.size
  if binning == "width":
    edges = np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins)
  else:
    s = np.sort(p)
    edges = [0.0] + [s[math.ceil(j * n / num_bins)] for j in range(1, num_bins)] + [1.0]
  gaps = []
  for b in range(num_bins):
    upper = p <= edges[b + 1] if b == num_bins - 1 else p < edges[b + 1]
    members = (p >= edges[b]) & upper
    if members.any():
      gaps.append((members.sum() / n, abs(p[members].mean() - hit[members].mean())))
  if norm == "l1":
    return sum(w * g for w, g in gaps)
  if norm == "l2":
    return math.sqrt(sum(w * g * g for w, g in gaps))
  return max(g for _, g in gaps)


def reference(probs, labels, num_bins=15, norm="l1", binning="width"):
  probs = np.asarray(probs)
  labels = np.asarray(labels)
  return np.mean([reference_ece(probs[:, k], labels == k, num_bins, norm, binning)
                  for k in range(probs.shape[-1])])


def random_case(seed, n=N, num_classes=K):
  rng = np.random.default_rng(seed)
  logits = 2 * rng.normal(size=(n, num_classes))
  probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
  labels = (probs.cumsum(axis=-1) > rng.random((n, 1)) ** 1.5).argmax(axis=-1)  # overconfident
  return probs.astype(np.float32), labels.astype(np.int32)


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("norm, binning", OPTIONS)
def test_equals_the_mean_of_ece_per_class(norm, binning):
  probs, labels = random_case(0)
  out = classwise_ece(probs, labels, num_bins=10, norm=norm, binning=binning)
  per_class = jnp.stack([ece(probs[:, k], labels == k, num_bins=10, norm=norm, binning=binning)
                         for k in range(K)])
  np.testing.assert_array_equal(out, jnp.mean(per_class))
  assert float(out) == pytest.approx(reference(probs, labels, 10, norm, binning), abs=1e-6)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_random_cases_match_reference(seed, ties):
  probs, labels = random_case(seed)
  if ties:
    probs = np.round(probs * 10) / 10  # rows no longer sum to 1: allowed
  assert float(classwise_ece(probs, labels)) == pytest.approx(reference(probs, labels), abs=1e-6)


def test_edge_cases():
  one_hot = np.eye(K, dtype=np.float32)[np.arange(N) % K]
  labels = np.arange(N) % K
  assert float(classwise_ece(one_hot, labels)) == 0.0  # certain and right
  assert float(classwise_ece(one_hot, (labels + 1) % K)) == pytest.approx(2 / K)  # certain, wrong
  uniform = np.full((N, K), 1 / K, np.float32)
  assert float(classwise_ece(uniform, labels)) == pytest.approx(0, abs=1e-6)  # balanced labels
  assert float(classwise_ece(uniform, np.zeros(N, np.int32))) == pytest.approx(
      reference(uniform, np.zeros(N)), abs=1e-6)
  # one sample; one class (the ECE of an always-right probability)
  assert float(classwise_ece([[0.7, 0.2, 0.1]], [0])) == pytest.approx((0.3 + 0.2 + 0.1) / 3)
  p = np.linspace(0, 1, N, dtype=np.float32)[:, None]
  assert float(classwise_ece(p, np.zeros(N, np.int32))) == pytest.approx(
      float(ece(p[:, 0], np.ones(N, bool))), abs=0)


# ---------------------------------------------------------------------------
# batches, jit, vmap, gradients


def test_batch_axes_jit_and_vmap_equal_rows():
  cases = [random_case(seed) for seed in range(6)]
  probs = np.stack([c[0] for c in cases]).reshape(2, 3, N, K)
  labels = np.stack([c[1] for c in cases]).reshape(2, 3, N)
  each = np.array([float(classwise_ece(p, y)) for p, y in cases]).reshape(2, 3)
  np.testing.assert_array_equal(classwise_ece(probs, labels), each)
  np.testing.assert_array_equal(jax.jit(jax.vmap(classwise_ece))(probs, labels), each)


def test_gradient_is_the_mean_of_the_class_gradients():
  probs, labels = random_case(1)
  grad = jax.grad(lambda p: classwise_ece(p, labels))(probs)
  per_class = jnp.stack([jax.grad(lambda c, k=k: ece(c, labels == k))(probs[:, k])
                         for k in range(K)], axis=-1)
  np.testing.assert_allclose(grad, per_class / K, atol=1e-7)
  assert np.all(np.isfinite(grad)) and np.any(grad != 0)


# ---------------------------------------------------------------------------
# invalid inputs


@pytest.mark.parametrize("probs, labels, match", [
    ([[0.5, 0.5], [0.2, 0.8]], [0, 2], r"\[0, 2\)"),
    ([[0.5, 0.5], [0.2, 0.8]], [-1, 0], r"\[0, 2\)"),
    ([[0.5, 0.5], [0.2, 0.8]], [0.0, 0.5], "integer"),
    ([[0.5, 0.5], [0.2, 0.8]], [True, False], "integer"),
    ([[0.5, np.nan], [0.2, 0.8]], [0, 1], "NaN"),
    ([[0.5, 1.5], [0.2, 0.8]], [0, 1], r"probs must lie in \[0, 1\]"),
    ([[0.5, 0.5], [0.2, 0.8]], [0, 1, 1], "shape"),
    ([0.5, 0.5], [0, 1], "shape"),
    (np.zeros((0, 3)), np.zeros(0, np.int32), "at least one"),
])
def test_invalid_inputs_raise(probs, labels, match):
  with pytest.raises(ValueError, match=match):
    classwise_ece(np.asarray(probs, np.float32), np.asarray(labels))


def test_integral_float_labels_are_accepted():
  probs, labels = random_case(2)
  assert float(classwise_ece(probs, labels.astype(np.float32))) == float(
      classwise_ece(probs, labels))


def test_invalid_values_are_nan_under_jit():
  probs, labels = random_case(3)
  probs = np.stack([probs, probs])
  labels = np.stack([labels, labels])
  fn = jax.jit(functools.partial(classwise_ece, num_bins=10))
  bad_labels = labels.copy()
  bad_labels[1, 5] = K
  out = fn(probs, bad_labels)
  assert np.isfinite(out[0]) and np.isnan(out[1])
  bad_probs = probs.copy()
  bad_probs[0, 7, 2] = np.nan
  out = fn(bad_probs, labels)
  assert np.isnan(out[0]) and np.isfinite(out[1])
