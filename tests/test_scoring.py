"""Brier score and NLL against float64 NumPy references and documented values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax._scoring import brier_score, nll

TOL = 2e-6


def ref_brier(probs, labels):
  probs = np.asarray(probs, np.float64)
  one_hot = np.eye(probs.shape[-1])[np.asarray(labels)]
  return float(np.mean(np.sum((probs - one_hot) ** 2, axis=-1)))


def ref_nll(probs, labels):
  probs = np.asarray(probs, np.float64)
  return float(-np.mean(np.log(probs[np.arange(len(labels)), labels])))


def ref_softmax(logits):
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def random_probs(rng, n, k):
  logits = rng.normal(size=(n, k)) * 3
  p = ref_softmax(logits).astype(np.float32)
  return logits.astype(np.float32), p, rng.integers(0, k, size=n)


# ---------------------------------------------------------------------------
# Documented values
# ---------------------------------------------------------------------------


def test_nll_pinned_to_sklearn_log_loss_docstring():
  # scikit-learn `log_loss` docstring: log_loss(["spam", "ham", "ham", "spam"],
  # [[.1, .9], [.9, .1], [.8, .2], [.35, .65]]) == 0.21616... ("ham" = class 0).
  probs = [[0.1, 0.9], [0.9, 0.1], [0.8, 0.2], [0.35, 0.65]]
  assert float(nll(probs, [1, 0, 0, 1])) == pytest.approx(0.21616, abs=1e-5)


def test_brier_pinned_to_sklearn_brier_score_loss_docstring():
  # scikit-learn `brier_score_loss` docstring: y_true [0, 1, 1, 0], y_prob (positive class)
  # [0.1, 0.9, 0.8, 0.3] -> 0.037... (= 0.0375). sklearn scores only the positive class;
  # our multi-class Brier sums over both classes, i.e. exactly twice that.
  y_prob = np.array([0.1, 0.9, 0.8, 0.3])
  probs = np.stack([1 - y_prob, y_prob], axis=-1)
  assert float(brier_score(probs, [0, 1, 1, 0])) == pytest.approx(2 * 0.0375, abs=TOL)


# ---------------------------------------------------------------------------
# Against the references
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 10])
def test_random_against_reference(k):
  rng = np.random.default_rng(k)
  logits, probs, labels = random_probs(rng, 500, k)
  assert float(brier_score(probs, labels)) == pytest.approx(ref_brier(probs, labels), abs=TOL)
  assert float(nll(probs, labels)) == pytest.approx(ref_nll(probs, labels), abs=TOL)
  exact = ref_softmax(logits)
  assert float(brier_score(logits, labels, from_logits=True)) == pytest.approx(
      ref_brier(exact, labels), abs=TOL)
  assert float(nll(logits, labels, from_logits=True)) == pytest.approx(
      ref_nll(exact, labels), abs=TOL)


def test_nll_relative_accuracy():
  # -log p amplifies the float32 rounding of small p; compare relatively.
  rng = np.random.default_rng(0)
  logits, probs, labels = random_probs(rng, 500, 10)
  assert float(nll(probs, labels)) == pytest.approx(ref_nll(probs, labels), rel=1e-6)


def test_extreme_logits_are_stable():
  logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]], np.float32)
  labels = np.array([0, 2])
  assert float(nll(logits, labels, from_logits=True)) == pytest.approx(np.log(3) / 2, abs=TOL)
  assert float(brier_score(logits, labels, from_logits=True)) == pytest.approx(
      (0.0 + (2 / 9 + 4 / 9)) / 2, abs=TOL)
  assert float(nll(logits, np.array([2, 0]), from_logits=True)) == pytest.approx(
      (2000.0 + np.log(3)) / 2, rel=1e-6)


def test_edge_cases():
  # Perfect one-hot predictions, one sample, a zero-probability true class.
  assert float(brier_score([[0.0, 1.0, 0.0]], [1])) == 0.0
  assert float(nll([[0.0, 1.0, 0.0]], [1])) == 0.0
  assert float(brier_score([[1.0, 0.0]], [1])) == pytest.approx(2.0, abs=TOL)
  assert float(nll([[1.0, 0.0]], [1])) == np.inf
  assert float(brier_score([[1.0]], [0])) == 0.0  # a single class


def test_batch_axes_jit_and_vmap():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 40, 5)).astype(np.float32)
  labels = rng.integers(0, 5, size=(3, 40))
  probs = np.asarray(jax.nn.softmax(logits, -1))
  loop = [ref_brier(probs[i], labels[i]) for i in range(3)]
  np.testing.assert_allclose(brier_score(probs, labels), loop, atol=TOL)
  np.testing.assert_allclose(jax.vmap(brier_score)(probs, labels), loop, atol=TOL)
  loop = [ref_nll(ref_softmax(logits[i]), labels[i]) for i in range(3)]
  np.testing.assert_allclose(nll(logits, labels, from_logits=True), loop, atol=TOL)
  jitted = jax.jit(nll, static_argnames="from_logits")
  np.testing.assert_allclose(jitted(logits[0], labels[0], from_logits=True), loop[0], atol=TOL)


def test_out_of_range_label_inside_jit_gives_nan():
  probs = jnp.array([[0.5, 0.5], [0.2, 0.8]])
  assert np.isnan(float(jax.jit(nll)(probs, jnp.array([0, 5]))))
  assert np.isnan(float(jax.jit(brier_score)(probs, jnp.array([-1, 0]))))


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [brier_score, nll])
def test_bad_input(fn):
  good = [[0.3, 0.7], [0.6, 0.4]]
  with pytest.raises(ValueError, match="sum to 1"):
    fn([[0.3, 0.6], [0.6, 0.4]], [0, 1])
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    fn([[1.2, -0.2], [0.6, 0.4]], [0, 1])
  with pytest.raises(ValueError, match="NaN"):
    fn([[np.nan, 0.7], [0.6, 0.4]], [0, 1])
  with pytest.raises(ValueError, match="NaN"):
    fn([[np.inf, 0.0], [0.0, 0.0]], [0, 1], from_logits=True)
  with pytest.raises(ValueError, match="labels"):
    fn(good, [0, 2])
  with pytest.raises(ValueError, match="labels"):
    fn(good, [0, -1])
  with pytest.raises(ValueError, match="labels"):
    fn(good, [0.5, 1])
  with pytest.raises(ValueError, match="labels must have shape"):
    fn(good, [0, 1, 1])
  with pytest.raises(ValueError, match="shape"):
    fn([0.3, 0.7], [1])
  with pytest.raises(ValueError, match="empty"):
    fn(np.zeros((0, 3)), np.zeros((0,), int))
  with pytest.raises(ValueError, match="from_logits"):
    fn(good, [0, 1], from_logits="yes")
  # Within tolerance is accepted.
  assert np.isfinite(float(fn([[0.3, 0.7001], [0.6, 0.4]], [0, 1])))
