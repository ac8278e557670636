"""(confidences, correct) from probabilities and logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import confidences_from_logits, confidences_from_probs


def _softmax64(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def test_from_logits_matches_float64_softmax():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 5, (500, 10)).astype(np.float32)
  labels = rng.integers(0, 10, 500)
  c, ok = confidences_from_logits(logits, labels)
  p = _softmax64(logits)
  np.testing.assert_allclose(np.asarray(c), p.max(-1), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(ok), p.argmax(-1) == labels)


def test_from_logits_extreme_magnitudes_stay_finite():
  c, ok = confidences_from_logits(np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], np.float32), [0, 2])
  np.testing.assert_allclose(np.asarray(c), [1.0, 1 / 3], atol=1e-6)
  assert np.asarray(ok).tolist() == [True, False]  # ties go to the lowest index


def test_from_probs_and_batched():
  rng = np.random.default_rng(1)
  p = _softmax64(rng.normal(size=(3, 50, 4))).astype(np.float32)
  labels = rng.integers(0, 4, (3, 50))
  c, ok = confidences_from_probs(p, labels)
  assert c.shape == (3, 50) and ok.dtype == jnp.bool_
  np.testing.assert_allclose(np.asarray(c), p.max(-1), atol=1e-7)
  np.testing.assert_array_equal(np.asarray(ok), p.argmax(-1) == labels)
  c2, _ = jax.jit(confidences_from_probs)(p, labels)
  np.testing.assert_array_equal(np.asarray(c2), np.asarray(c))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: confidences_from_logits([[1.0, 2.0]], [0.5]), "integer class indices"),
        (lambda: confidences_from_logits([[1.0, 2.0]], [2]), "labels must lie in \\[0, 2\\)"),
        (lambda: confidences_from_logits([[1.0, 2.0]], [-1]), "labels must lie in"),
        (lambda: confidences_from_logits([[1.0, np.nan]], [0]), "NaN"),
        (lambda: confidences_from_logits([1.0, 2.0], [0]), "shape \\[..., n, num_classes\\]"),
        (lambda: confidences_from_logits([[1.0, 2.0]], [0, 1]), "labels must have shape"),
        (lambda: confidences_from_logits(np.zeros((0, 3)), np.zeros((0,), int)), "empty"),
        (lambda: confidences_from_probs([[0.5, 0.6]], [0]), "sum to 1"),
        (lambda: confidences_from_probs([[1.5, -0.5]], [0]), "\\[0, 1\\]"),
        (lambda: confidences_from_probs([[0.5, 0.5]], ["a"]), "labels"),
    ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_logits_that_look_like_probabilities_warn():
  """Concrete logits whose every row lies in [0, 1] and sums to 1 are far more likely
  probabilities: a warning names probs=; real logits, one class and traced logits do not warn."""
  import warnings
  probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]], np.float32)
  labels = np.array([0, 1])
  with pytest.warns(UserWarning, match="probs="):
    confidences_from_logits(probs, labels)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    confidences_from_logits(np.log(probs) * 3.0, labels)  # real logits
    confidences_from_logits(np.ones((2, 1), np.float32), np.array([0, 0]))  # K = 1
    jax.jit(confidences_from_logits)(probs, labels)  # traced: no values to look at
