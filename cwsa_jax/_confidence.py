"""Building (confidences, correct) from model outputs.

Confidence is the maximum softmax probability and ``correct`` is
``argmax == label`` (ties in the argmax go to the lowest class index, as
``jnp.argmax`` does), the convention of the paper and of most libraries.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _validation


class Predictions(NamedTuple):
  """Top-label confidences [..., n] (float32) and correctness [..., n] (bool)."""
  confidences: jax.Array
  correct: jax.Array


def check_scores(scores, labels, name):
  """(float scores [..., n, K], int32 labels [..., n], per-sample label flag or None): the
  shape and label checks of every [..., n, K] input with labels (here and
  :func:`~cwsa_jax.classwise_ece`)."""
  scores = _validation.as_float_array(scores, name)
  if scores.ndim < 2:
    raise ValueError(f"{name} must have shape [..., n, num_classes], got {scores.shape}")
  if scores.shape[-1] < 1:
    raise ValueError(f"{name} has no classes (last axis is empty)")
  if scores.shape[-2] == 0:
    raise ValueError(f"{name} is empty: at least one sample is needed")
  labels, label_flag = _validation.labels(labels, scores.shape[-1])
  if labels.shape != scores.shape[:-1]:
    raise ValueError(
        f"labels must have shape {scores.shape[:-1]} to match {name} {scores.shape}, got {labels.shape}")
  return scores, labels, label_flag


def check_probabilities(probs: jax.Array, name: str = "probs") -> jax.Array | None:
  """Raises unless concrete ``probs`` [..., K] are probabilities; else the traced flag."""
  return _validation.check_probabilities(probs, name)


@_public.float_entry
def confidences_from_probs(probs, labels) -> Predictions:
  """(max probability, argmax == label) from class probabilities.

  Args:
    probs: [..., n, K] probabilities in [0, 1]; each row must sum to 1 (within
      ``_validation.PROBABILITY_TOLERANCE`` = 1e-3).
    labels: [..., n] integer labels in [0, K).

  Returns:
    :class:`Predictions` ``(confidences, correct)``. Inside a user's ``jit`` /
    ``vmap``, a sample whose probability row or label is invalid gets a NaN
    confidence (so every metric of it is NaN). The confidence is
    differentiable in the probabilities (the max: exact almost everywhere).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import confidences_from_probs
    >>> p = jnp.array([[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]])
    >>> c, ok = confidences_from_probs(p, jnp.array([0, 1]))
    >>> print([round(float(x), 4) for x in c], ok.tolist())
    [0.7, 0.4] [True, False]
  """
  probs, labels, label_flag = check_scores(probs, labels, "probs")
  flag = _validation.either(check_probabilities(probs), label_flag)
  result = _from_probs(probs, labels)
  return result._replace(confidences=_validation.poison(result.confidences, rows=flag))


@jax.jit
def _from_probs(probs, labels):
  pred = jnp.argmax(probs, axis=-1)
  conf = jnp.clip(jnp.max(probs, axis=-1), 0.0, 1.0).astype(jnp.float32)
  return Predictions(conf, pred == labels)


@_public.float_entry
def confidences_from_logits(logits, labels) -> Predictions:
  """(max softmax probability, argmax == label) from logits, computed stably.

  .. math::

    c_i = \\max_k \\mathrm{softmax}(z_i)_k = 1 \\big/ \\sum_k e^{z_{ik} - \\max_j z_{ij}} .

  Args:
    logits: [..., n, K] unnormalised log-probabilities (finite).
    labels: [..., n] integer labels in [0, K).

  Returns:
    :class:`Predictions` ``(confidences, correct)``. Inside a user's ``jit`` /
    ``vmap``, a sample with a NaN/inf logit or an invalid label gets a NaN
    confidence. The confidence is differentiable in the logits (exact).

  Warns:
    UserWarning: on concrete logits whose every row lies in [0, 1] and sums to
    1 (within 1e-4) with K > 1: far more likely probabilities than logits
    (their softmax would squash every confidence towards 1/K); pass them to
    :func:`confidences_from_probs` (``probs=`` in the metrics' ``update``) instead.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import confidences_from_logits
    >>> c, ok = confidences_from_logits(jnp.array([[2.0, 0.0], [0.0, 1e4]]), jnp.array([0, 0]))
    >>> print([round(float(x), 4) for x in c], ok.tolist())
    [0.8808, 1.0] [True, False]
  """
  logits, labels, label_flag = check_scores(logits, labels, "logits")
  finite_flag = _validation.check_finite_in_unit_interval(logits, "logits", unit=False)
  if finite_flag is None and _look_like_probabilities(logits):
    warnings.warn("logits: every row lies in [0, 1] and sums to 1, so these look like "
                  "probabilities; pass them as probs= (confidences_from_probs) instead",
                  UserWarning, stacklevel=2)
  flag = _validation.either(finite_flag, label_flag)
  result = _from_logits(logits, labels)
  return result._replace(confidences=_validation.poison(result.confidences, rows=flag))


def _look_like_probabilities(logits: jax.Array) -> bool:
  """Whether every row of concrete logits [..., K] (K > 1) lies in [0, 1] and sums to 1."""
  if logits.shape[-1] < 2 or logits.size == 0:
    return False
  with jax.ensure_compile_time_eval():
    unit = jnp.all((logits >= 0) & (logits <= 1))
    sums = jnp.all(jnp.abs(jnp.sum(logits, axis=-1) - 1) <= 1e-4)
    return bool(unit & sums)


@jax.jit
def _from_logits(logits, labels):
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  conf = (1.0 / jnp.sum(jnp.exp(shifted), axis=-1)).astype(jnp.float32)
  pred = jnp.argmax(logits, axis=-1)
  return Predictions(conf, pred == labels)
