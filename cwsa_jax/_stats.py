"""Sufficient statistics of the hard CWSA family and the metrics computed from them.

For a threshold tau and the retained set S = {i : c_i >= tau}, with
u_i = 1 - c_i and kappa_i the (possibly graded) correctness, the four sums

.. math::

  N = |S|, \\quad A = \\sum_S \\kappa_i, \\quad U = \\sum_S u_i, \\quad
  V = \\sum_S u_i \\kappa_i

determine every hard metric, because phi_i = (c_i - tau)/(1 - tau)
= 1 - u_i/(1 - tau):

.. math::

  \\sum_S \\phi_i = N - \\frac{U}{1-\\tau}, \\qquad
  \\sum_S \\phi_i \\kappa_i = A - \\frac{V}{1-\\tau},

  \\mathrm{CWSA} = \\frac{(2A - N) - (2V - U)/(1-\\tau)}{N}, \\qquad
  \\mathrm{CWSA}^+ = \\frac{A - V/(1-\\tau)}{N}.

Sums of u = 1 - c are used rather than sums of c - tau: near tau = 0.99 the
latter cancel catastrophically in float32, the former do not. The sums are
exact (see ``_exact``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cwsa_jax import _exact

U_DIGITS = 3  # 1 - c for float32 c is a multiple of 2^-24: three base-256 digits are exact.
GRADED_DIGITS = 4  # graded kappa and u * kappa: truncated below 2^-32.

NORMALIZATIONS = ("retained", "all")


class Sums(NamedTuple):
  """The four retained-set sums (float32, shape [...])."""
  count: jax.Array
  correct: jax.Array
  one_minus_c: jax.Array
  one_minus_c_correct: jax.Array


def num_columns(graded: bool) -> int:
  return 1 + (GRADED_DIGITS if graded else 1) + U_DIGITS + (GRADED_DIGITS if graded else U_DIGITS)


def columns(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """int32 digit columns [K, n] of (1, kappa, u, u * kappa) for each sample.

  ``correct`` of dtype bool gives the binary layout (K = 8); a float
  ``correct`` (graded kappa in [0, 1]) gives the graded layout (K = 12).
  """
  c = jnp.clip(confidences.astype(jnp.float32), 0.0, 1.0)
  u = 1.0 - c
  ones = jnp.ones(c.shape, jnp.int32)
  u_digits = _exact.grid_digits(u)
  if correct.dtype == jnp.bool_:
    k_int = correct.astype(jnp.int32)
    cols = [ones, k_int] + u_digits + [d * k_int for d in u_digits]
  else:
    kappa = jnp.clip(correct.astype(jnp.float32), 0.0, 1.0)
    k_digits = _exact.digits(kappa, GRADED_DIGITS)
    uk_digits = _exact.digits(u * kappa, GRADED_DIGITS)
    cols = [ones] + k_digits + u_digits + uk_digits
  return jnp.stack(cols, axis=0)


def sums_from_columns(values: jax.Array, graded: bool) -> Sums:
  """Turns summed digit columns (float32 [..., K]) into :class:`Sums`."""
  ka = GRADED_DIGITS if graded else 1
  count = values[..., 0]
  if graded:
    correct = _exact.combine(values[..., 1:1 + ka], ka)
  else:
    correct = values[..., 1]
  u = _exact.combine(values[..., 1 + ka:1 + ka + U_DIGITS], U_DIGITS)
  kv = GRADED_DIGITS if graded else U_DIGITS
  uk = _exact.combine(values[..., 1 + ka + U_DIGITS:1 + ka + U_DIGITS + kv], kv)
  return Sums(count, correct, u, uk)


class Metrics(NamedTuple):
  coverage: jax.Array
  selective_accuracy: jax.Array
  cwsa: jax.Array
  cwsa_plus: jax.Array


def metrics_from_sums(sums: Sums, tau: jax.Array, n: int) -> Metrics:
  """Coverage, selective accuracy, CWSA and CWSA+ from the retained-set sums.

  Empty S gives CWSA = CWSA+ = 0 and selective accuracy NaN.
  """
  count, correct, u, uk = sums
  tau = tau.astype(jnp.float32)
  one_minus_tau = 1.0 - tau
  nonempty = count > 0
  safe_count = jnp.where(nonempty, count, 1.0)
  cwsa_sum = (2.0 * correct - count) - (2.0 * uk - u) / one_minus_tau
  plus_sum = correct - uk / one_minus_tau
  return Metrics(
      coverage=count / jnp.float32(n),
      selective_accuracy=jnp.where(nonempty, correct / safe_count, jnp.nan),
      cwsa=jnp.where(nonempty, cwsa_sum / safe_count, 0.0),
      cwsa_plus=jnp.where(nonempty, plus_sum / safe_count, 0.0),
  )


def invalid_inputs(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """Scalar bool: some confidence or graded correctness is NaN or outside [0, 1].

  Used inside traced code, where ``ValueError`` cannot be raised: the metrics
  then return NaN instead of a silently wrong number.
  """
  bad = jnp.any(~((confidences >= 0) & (confidences <= 1)))
  if correct.dtype != jnp.bool_:
    bad = bad | jnp.any(~((correct >= 0) & (correct <= 1)))
  return bad


def check_normalize(normalize: str) -> None:
  if normalize not in NORMALIZATIONS:
    raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")


def renormalize(metrics, normalize: str):
  """Applies the CWSA denominator choice to a result with coverage and cwsa fields.

  ``"retained"`` keeps the paper's (1/|S|) sum; ``"all"`` is the published
  code's (1/n) sum, i.e. coverage x CWSA. CWSA+ always divides by |S| (the
  published code does too).
  """
  if normalize == "retained":
    return metrics
  return metrics._replace(cwsa=metrics.coverage * metrics.cwsa)
