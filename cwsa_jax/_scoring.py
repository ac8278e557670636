"""Proper scoring rules on full probability vectors: Brier score and negative log-likelihood.

Both take the model's whole predictive distribution over ``K`` classes (not
just the top-label confidence) and the integer labels, and average over the
samples. Pass probabilities, or logits with ``from_logits=True`` (then a
numerically stable log-softmax / softmax is applied).

Probabilities must be finite, lie in [0, 1] and sum to 1 along the class axis
within ``_validation.PROBABILITY_TOLERANCE`` (1e-3, the package's one
tolerance). Logits must be finite. Labels must be integers in [0, K). On
concrete arrays a violation raises ``ValueError``; inside a user's
``jax.jit`` / ``jax.vmap`` the result is NaN (for the invalid row).

Gradients: both scores are smooth in the probabilities (or logits), and
autodiff returns the exact gradient (NLL of a zero true-class probability:
inf, with an infinite gradient).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _validation


def _prepare(values: Any, labels: Any, *, from_logits: bool, name: str):
  """(float32 values [..., n, K], int32 labels [..., n], row flag [...] or None)."""
  if not isinstance(from_logits, bool):
    raise ValueError(f"from_logits must be True or False, got {from_logits!r}")
  x = _validation.as_float_array(values, name)
  if x.ndim < 2:
    raise ValueError(f"{name} must have shape [..., n, K] (samples x classes), got shape {x.shape}")
  num_classes = x.shape[-1]
  if num_classes == 0 or x.shape[-2] == 0:
    raise ValueError(f"{name} is empty: shape {x.shape} has no samples or no classes")
  y, label_flag = _validation.labels(labels, num_classes)
  if y.shape != x.shape[:-1]:
    raise ValueError(
        f"labels must have shape {x.shape[:-1]} (the shape of {name} without the class axis), "
        f"got {y.shape}")
  if from_logits:
    value_flag = _validation.check_finite_in_unit_interval(x, name, reduce_axes=1, unit=False)
  else:
    value_flag = _validation.check_probabilities(x, name)
  flag = _validation.either(value_flag, label_flag)  # per sample [..., n]
  return x.astype(jnp.float32), y, None if flag is None else jnp.any(flag, axis=-1)


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _brier_impl(x, y, *, from_logits):
  probs = jax.nn.softmax(x, axis=-1) if from_logits else x
  num_classes = x.shape[-1]
  one_hot = jax.nn.one_hot(y, num_classes, dtype=jnp.float32)
  return jnp.mean(jnp.sum(jnp.square(probs - one_hot), axis=-1), axis=-1)


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _nll_impl(x, y, *, from_logits):
  num_classes = x.shape[-1]
  safe = jnp.clip(y, 0, num_classes - 1)[..., None]
  if from_logits:
    log_probs = jax.nn.log_softmax(x, axis=-1)
    per_sample = -jnp.take_along_axis(log_probs, safe, axis=-1)[..., 0]
  else:
    per_sample = -jnp.log(jnp.take_along_axis(x, safe, axis=-1)[..., 0])
  return jnp.mean(per_sample, axis=-1)


@_public.float_entry
def brier_score(probs: Any, labels: Any, *, from_logits: bool = False) -> jax.Array:
  r"""Multi-class Brier score (Brier, 1950): mean squared distance to the one-hot label.

  .. math::
    \mathrm{BS} = \frac{1}{n}\sum_{i=1}^{n}\sum_{k=1}^{K} (p_{ik} - [y_i = k])^2
    \in [0, 2]

  This is the original multi-class definition (summed over classes). For
  ``K = 2`` it is twice scikit-learn's binary ``brier_score_loss``, which
  scores only the positive class.

  Args:
    probs: [..., n, K] probabilities (or logits with ``from_logits=True``).
      Leading axes are batch axes.
    labels: [..., n] integer labels in [0, K).
    from_logits: apply a softmax to ``probs`` first.

  Returns:
    float32 of shape [...] (a scalar for [n, K] inputs); lower is better.

  Examples:
    >>> from cwsa_jax import brier_score
    >>> p = [[0.9, 0.1], [0.1, 0.9], [0.2, 0.8], [0.7, 0.3]]
    >>> print(round(float(brier_score(p, [0, 1, 1, 0])), 4))
    0.075
  """
  x, y, invalid = _prepare(probs, labels, from_logits=from_logits, name="probs")
  return _validation.poison(_brier_impl(x, y, from_logits=from_logits), rows=invalid)


@_public.float_entry
def nll(probs_or_logits: Any, labels: Any, *, from_logits: bool = False) -> jax.Array:
  r"""Mean negative log-likelihood of the true labels (natural log).

  .. math::
    \mathrm{NLL} = -\frac{1}{n}\sum_{i=1}^{n} \log p_{i, y_i},
    \qquad p = \mathrm{softmax}(z) \text{ when } \texttt{from\_logits}

  With probabilities, a true class of probability 0 gives ``inf`` (no
  clipping: that is the honest value). With logits the stable form
  ``logsumexp(z_i) - z_{i, y_i}`` is used.

  Args:
    probs_or_logits: [..., n, K] probabilities, or logits with
      ``from_logits=True``. Leading axes are batch axes.
    labels: [..., n] integer labels in [0, K).
    from_logits: treat the first argument as logits.

  Returns:
    float32 of shape [...]; lower is better.

  Examples:
    >>> from cwsa_jax import nll
    >>> p = [[0.1, 0.9], [0.9, 0.1], [0.8, 0.2], [0.35, 0.65]]
    >>> print(round(float(nll(p, [1, 0, 0, 1])), 5))
    0.21616
  """
  x, y, invalid = _prepare(probs_or_logits, labels, from_logits=from_logits,
                           name="probs_or_logits")
  return _validation.poison(_nll_impl(x, y, from_logits=from_logits), rows=invalid)
