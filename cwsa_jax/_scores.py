"""Confidence scoring functions (CSFs) of a classifier's logits.

Every score is a function of one row of logits z [K] (softmax p = softmax(z))
and is oriented so that a **higher score means more confident**:

* ``"msp"``: :math:`\\max_k p_k`, in [1/K, 1];
* ``"max_logit"``: :math:`\\max_k z_k`, real;
* ``"margin"``: :math:`p_{(1)} - p_{(2)}` (softmax margin), in [0, 1];
* ``"logit_margin"``: :math:`z_{(1)} - z_{(2)}`, in [0, inf);
* ``"neg_entropy"``: :math:`\\sum_k p_k \\log p_k`, in [-log K, 0];
* ``"doctor"``: :math:`\\hat g = \\sum_k p_k^2 = 1/(1 + D_\\alpha)`, in [1/K, 1];

with :math:`p_{(1)} \\ge p_{(2)}` the two largest probabilities (and
:math:`z_{(1)} \\ge z_{(2)}` the two largest logits). ``"margin"`` is the
softmax margin, as in the AURC study of Zhou et al. (2025); the logit margin
is ``"logit_margin"``.

**DOCTOR.** Granese et al. (2021) define :math:`\\hat g(x) = \\sum_k p_k^2`
and the discriminator :math:`D_\\alpha(x) = (1 - \\hat g(x)) / \\hat g(x)`,
rejecting when :math:`D_\\alpha(x) > \\gamma` (the "totally black box"
setting, without their input perturbation or softmax temperature). The score
returned here is :math:`\\hat g = 1/(1 + D_\\alpha)`, a decreasing function of
:math:`D_\\alpha`, so it ranks samples exactly as :math:`-D_\\alpha` (and as
:math:`-(1 - \\hat g)`, the Gini impurity some libraries use) while staying in
[1/K, 1]. Their :math:`D_\\beta = (1 - \\max_k p_k)/\\max_k p_k` ranks like
``"msp"``.

Everything is computed from ``log_softmax``, so logits of any finite
magnitude give finite scores. Only ``"msp"``, ``"margin"`` and ``"doctor"``
lie in [0, 1] and can serve as confidences for CWSA and ECE, whose values
depend on the scale. Rank metrics (AURC, E-AURC, AUGRC) depend only on the
order of the scores, so a strictly increasing map into [0, 1] (e.g.
``jax.nn.sigmoid``, as long as float32 rounding creates no new ties) leaves
them unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _validation

METHODS = ("msp", "max_logit", "margin", "logit_margin", "neg_entropy", "doctor")


def _prepare_logits(logits: Any) -> tuple[jax.Array, jax.Array | None]:
  """(float logits [..., K], per-row flag of non-finite logits (traced) or None)."""
  logits = _validation.as_float_array(logits, "logits")
  if logits.ndim < 1:
    raise ValueError("logits must have shape [..., num_classes], got a scalar")
  if logits.shape[-1] < 2:
    raise ValueError(f"logits need at least 2 classes, got shape {logits.shape}")
  flag = _validation.check_finite_in_unit_interval(logits, "logits", unit=False)
  return logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), flag


@functools.partial(jax.jit, static_argnames=("method",))
def _scores(logits: jax.Array, *, method: str) -> jax.Array:
  """Scores [...] of logits [..., K] (no checks)."""
  if method == "max_logit":
    return jnp.max(logits, axis=-1)
  if method == "logit_margin":
    top2 = jax.lax.top_k(logits, 2)[0]
    return top2[..., 0] - top2[..., 1]
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  if method == "msp":
    return jnp.exp(jnp.max(log_probs, axis=-1))
  if method == "margin":
    top2 = jax.lax.top_k(log_probs, 2)[0]
    # p1 - p2 = p1 (1 - p2/p1), without cancellation when p2 << p1.
    return jnp.exp(top2[..., 0]) * jnp.abs(jnp.expm1(top2[..., 1] - top2[..., 0]))
  if method == "neg_entropy":
    return jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
  # "doctor": sum_k p_k^2 = exp(logsumexp(2 log p)).
  return jnp.exp(jax.nn.logsumexp(2.0 * log_probs, axis=-1))


@_public.float_entry
def confidence_scores(logits: Any, *, method: str = "msp") -> jax.Array:
  """Per-sample confidence scores from logits; higher means more confident.

  .. math::

    \\mathrm{msp} = \\max_k p_k, \\quad
    \\mathrm{max\\_logit} = \\max_k z_k, \\quad
    \\mathrm{margin} = p_{(1)} - p_{(2)}, \\quad
    \\mathrm{logit\\_margin} = z_{(1)} - z_{(2)},

    \\mathrm{neg\\_entropy} = \\sum_k p_k \\log p_k, \\quad
    \\mathrm{doctor} = \\sum_k p_k^2 = \\frac{1}{1 + D_\\alpha},

  with p = softmax(z) and :math:`p_{(1)} \\ge p_{(2)}` the two largest
  probabilities (see the module docstring for the ranges and for DOCTOR's
  :math:`D_\\alpha`). Ties among the top classes give a margin of 0.

  Args:
    logits: [..., K] unnormalised scores, K >= 2; every leading axis is kept.
    method: one of ``"msp"`` (default), ``"max_logit"``, ``"margin"``,
      ``"logit_margin"``, ``"neg_entropy"``, ``"doctor"``.

  Returns:
    [...] scores (float32 for float32 or integer logits).

  Raises:
    ValueError: on an unknown ``method`` (the message lists the valid ones),
      fewer than 2 classes, or concrete NaN/inf logits. Inside a user's
      ``jit`` / ``vmap`` only the shape checks run, and a row with a NaN/inf
      logit gets a NaN score.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import confidence_scores
    >>> z = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.4, 0.4, 0.2]]))
    >>> for method in ("msp", "margin", "doctor"):
    ...   print(method, [round(float(s), 4) for s in confidence_scores(z, method=method)])
    msp [0.7, 0.4]
    margin [0.5, 0.0]
    doctor [0.54, 0.36]

  References:
    Hendrycks & Gimpel, "A baseline for detecting misclassified and
    out-of-distribution examples in neural networks", ICLR 2017 (MSP).
    Granese, Romanelli, Gorla, Palamidessi & Piantanida, "DOCTOR: a simple
    method for detecting misclassification errors", NeurIPS 2021.
    Zhou, Gruber, Popordanoska & Blaschko, "Revisiting reweighted risk for
    calibration: AURC, focal loss, and inverse focal loss", arXiv:2505.23463,
    2025 (MSP, negative entropy and softmax margin as CSFs).
  """
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  logits, flag = _prepare_logits(logits)
  # Inside a user's jit/vmap, a row with a NaN/inf logit gets a NaN score.
  return _validation.poison(_scores(logits, method=method), rows=flag)
