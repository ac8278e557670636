"""Tests of cwsa_jax.confidence_scores against float64 NumPy references."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax._scores import METHODS


def probs64(logits):
  z = np.asarray(logits, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def reference_scores(logits, method):
  """Straight from the definitions, in float64, with a full sort."""
  z = np.asarray(logits, np.float64)
  p = probs64(z)
  z_sorted, p_sorted = np.sort(z, -1)[..., ::-1], np.sort(p, -1)[..., ::-1]
  if method == "msp":
    return p_sorted[..., 0]
  if method == "max_logit":
    return z_sorted[..., 0]
  if method == "margin":
    return p_sorted[..., 0] - p_sorted[..., 1]
  if method == "logit_margin":
    return z_sorted[..., 0] - z_sorted[..., 1]
  if method == "neg_entropy":
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.sum(np.where(p > 0, p * np.log(p), 0.0), -1)
  if method == "doctor":
    g = np.sum(p**2, -1)
    d_alpha = (1.0 - g) / g  # Granese et al.'s discriminator: reject when large
    return 1.0 / (1.0 + d_alpha)
  raise AssertionError(method)


def random_logits(seed, shape=(200, 7), scale=3.0):
  return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


@pytest.mark.parametrize("method", METHODS)
def test_matches_float64_reference_under_jit(method):
  logits = random_logits(0, (2, 100, 7))
  got = jax.jit(functools.partial(cw.confidence_scores, method=method))(logits)
  assert got.shape == (2, 100) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), reference_scores(logits, method), rtol=2e-6,
                             atol=2e-6)
  eager = cw.confidence_scores(logits, method=method)
  np.testing.assert_allclose(np.asarray(eager), np.asarray(got), rtol=1e-6, atol=1e-7)


def test_default_is_msp_and_matches_confidences_from_logits():
  logits = random_logits(1)
  labels = np.zeros(logits.shape[0], np.int32)
  np.testing.assert_allclose(np.asarray(cw.confidence_scores(logits)),
                             np.asarray(cw.confidences_from_logits(logits, labels).confidences),
                             rtol=4e-7)


def test_doctor_ranks_like_minus_d_alpha():
  logits = random_logits(2, (300, 5), scale=2.0)
  p = probs64(logits)
  d_alpha = (1.0 - np.sum(p**2, -1)) / np.sum(p**2, -1)
  score = np.asarray(cw.confidence_scores(logits, method="doctor"), np.float64)
  # Sorting by the score (descending) is sorting by D_alpha (ascending).
  np.testing.assert_array_equal(np.argsort(-score, kind="stable"),
                                np.argsort(d_alpha, kind="stable"))


@pytest.mark.parametrize("method", METHODS)
def test_higher_score_means_more_often_correct(method):
  # Labels drawn from softmax(z): the predictions the model is sure of are
  # right more often, so every score must rank correct above wrong (AUROC > 0.5).
  rng = np.random.default_rng(3)
  logits = random_logits(3, (4000, 6), scale=2.0)
  labels = (np.log(probs64(logits)) + rng.gumbel(size=logits.shape)).argmax(-1)
  correct = logits.argmax(-1) == labels
  s = np.asarray(cw.confidence_scores(logits, method=method), np.float64)
  ranks = np.argsort(np.argsort(s)) + 1.0
  n_pos, n_neg = correct.sum(), (~correct).sum()
  auroc = (ranks[correct].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
  assert auroc > 0.6, auroc


@pytest.mark.parametrize("method", METHODS)
def test_extreme_and_uniform_logits(method):
  k = 4
  logits = np.float32([[1e4, -1e4, 0.0, 0.0], [0.0] * k, [-1e4, -1e4, 1e4, 1e4]])
  got = np.asarray(cw.confidence_scores(logits, method=method))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, reference_scores(logits, method), rtol=1e-6, atol=1e-6)
  grad = jax.grad(lambda z: jnp.sum(cw.confidence_scores(z, method=method)))(jnp.asarray(logits))
  assert bool(jnp.all(jnp.isfinite(grad)))


def test_scores_of_probability_methods_lie_in_their_ranges():
  logits = random_logits(4, (500, 10), scale=5.0)
  for method in ("msp", "margin", "doctor"):
    s = np.asarray(cw.confidence_scores(logits, method=method))
    assert s.min() >= 0.0 and s.max() <= 1.0 + 1e-6
  s = np.asarray(cw.confidence_scores(logits, method="neg_entropy"))
  assert s.max() <= 1e-6 and s.min() >= -np.log(10) - 1e-5


@pytest.mark.parametrize("logits, kwargs, match", [
    (np.zeros((2, 3)), dict(method="entropy"), r"'msp'.*'max_logit'.*'margin'.*'doctor'"),
    (np.zeros((2, 3)), dict(method="MSP"), "method"),
    (np.float32([[0.0, np.nan]]), {}, "NaN"),
    (np.float32([[0.0, np.inf]]), {}, "NaN or infinite"),
    (np.zeros((2, 1)), {}, "2 classes"),
    (np.float32(1.0), {}, "scalar"),
    (np.array([["a", "b"]]), {}, "logits"),
])
def test_bad_input_raises(logits, kwargs, match):
  with pytest.raises(ValueError, match=match):
    cw.confidence_scores(logits, **kwargs)


def test_exported():
  assert "confidence_scores" in cw.__all__ and cw.confidence_scores is not None


def test_traced_nan_row_gives_nan_score_only_there():
  logits = random_logits(5, (4, 3))
  logits[2, 1] = np.nan
  got = np.asarray(jax.jit(lambda z: cw.confidence_scores(z, method="max_logit"))(logits))
  assert np.isnan(got[2]) and np.all(np.isfinite(got[[0, 1, 3]]))
  np.testing.assert_allclose(got[[0, 1, 3]], logits[[0, 1, 3]].max(-1))
