"""Post-hoc temperature scaling: the scalar T that minimises the NLL of softmax(z / T).

With inverse temperature beta = 1/T and logits z_i [K],

.. math::

  L(\\beta) = \\frac{1}{n}\\sum_i \\Bigl(\\log\\sum_k e^{\\beta z_{ik}} - \\beta z_{i y_i}\\Bigr),
  \\qquad
  L'(\\beta) = \\frac{1}{n}\\sum_i \\Bigl(\\sum_k p_{ik}(\\beta)\\, z_{ik} - z_{i y_i}\\Bigr),
  \\qquad
  L''(\\beta) = \\frac{1}{n}\\sum_i \\mathrm{Var}_{p_i(\\beta)}(z_i) \\ge 0.

L is convex in beta (a log-sum-exp of functions linear in beta), so its
derivative is non-decreasing and has at most one sign change: the minimiser
is the root of L'. The fit solves L'(e^v) = 0 for v = log beta with a
safeguarded Newton iteration (Newton steps on the monotone function
h(v) = L'(e^v), h'(v) = e^v L''(e^v), falling back to bisection whenever a
step leaves the current bracket or fails to halve the step before last, as
in Numerical Recipes' ``rtsafe``): 40 iterations inside one ``jit`` (Newton
converges in under 10 on the tests; bisection alone would reach float32
resolution), returning the evaluated point with the smallest |h|. No
optimiser library, no Python loop, ``jax.vmap``-able. Against a float64
grid search the fitted T agrees to a relative 4e-6 or better (the limit of
evaluating L' in float32).

The root is searched for T in ``bounds``. When L' keeps one sign over the
whole bracket the NLL is monotone there and the better bound is returned:
T = ``bounds[0]`` when it still decreases at the smallest T (e.g. every
prediction is correct, so sharpening always helps), T = ``bounds[1]`` when
it still decreases at the largest (labels no better than chance).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _mesh
from cwsa_jax import _public
from cwsa_jax import _validation

DEFAULT_BOUNDS = (1e-4, 1e4)
_NUM_ITERATIONS = 40


def _slope_and_curvature(shifted_logits: jax.Array, true_logits: jax.Array, log_beta: jax.Array):
  """(h(v), h'(v)) for v = log beta: L'(beta) and beta L''(beta)."""
  beta = jnp.exp(log_beta)
  log_probs = jax.nn.log_softmax(beta * shifted_logits, axis=-1)
  probs = jnp.exp(log_probs)
  mean_logit = jnp.sum(probs * shifted_logits, axis=-1)
  variance = jnp.sum(probs * jnp.square(shifted_logits - mean_logit[..., None]), axis=-1)
  return jnp.mean(mean_logit - true_logits), beta * jnp.mean(variance)


def _fit_log_inverse_temperature(logits: jax.Array, labels: jax.Array, log_beta_low: jax.Array,
                                 log_beta_high: jax.Array) -> jax.Array:
  """log(1/T) of the NLL-minimising temperature for [n, K] logits (no checks)."""
  # Subtracting each row's maximum changes neither L' nor L'' and keeps every
  # shifted logit <= 0, so beta * z never overflows.
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  true_logits = jnp.take_along_axis(shifted, labels[:, None], axis=-1)[:, 0]
  slope = functools.partial(_slope_and_curvature, shifted, true_logits)

  slope_low, _ = slope(log_beta_low)
  slope_high, _ = slope(log_beta_high)

  def step(_, state):
    low, high, v, last_step, best, best_abs_slope = state
    h, dh = slope(v)
    # Of the points evaluated, keep the one nearest the root (|h| smallest):
    # a bisection step taken after convergence cannot spoil the result.
    better = jnp.abs(h) < best_abs_slope
    best = jnp.where(better, v, best)
    best_abs_slope = jnp.where(better, jnp.abs(h), best_abs_slope)
    # h is non-decreasing: a negative slope puts the root above v.
    low = jnp.where(h < 0, v, low)
    high = jnp.where(h < 0, high, v)
    newton = v - h / jnp.where(dh > 0, dh, 1.0)
    # Newton only inside the bracket and when it at least halves the step
    # before last (as in Numerical Recipes' rtsafe); bisection otherwise.
    use_newton = ((dh > 0) & (newton > low) & (newton < high)
                  & (2.0 * jnp.abs(newton - v) <= jnp.abs(last_step)))
    new_v = jnp.where(use_newton, newton, 0.5 * (low + high))
    return low, high, new_v, new_v - v, best, best_abs_slope

  middle = 0.5 * (log_beta_low + log_beta_high)
  init = _mesh.vary_like((log_beta_low, log_beta_high, middle, log_beta_high - log_beta_low,
                          middle, jnp.asarray(jnp.inf, log_beta_low.dtype)), logits)
  root = jax.lax.fori_loop(0, _NUM_ITERATIONS, step, init)[4]
  # No sign change in the bracket: the NLL is monotone there; take the better end.
  root = jnp.where(slope_high <= 0, log_beta_high, root)
  return jnp.where(slope_low >= 0, log_beta_low, root)


@jax.jit
def _fit(logits: jax.Array, labels: jax.Array, log_beta_low: jax.Array,
         log_beta_high: jax.Array) -> jax.Array:
  fn = _fit_log_inverse_temperature
  for _ in range(logits.ndim - 2):
    fn = jax.vmap(fn, in_axes=(0, 0, None, None))
  return jnp.exp(-fn(logits, labels, log_beta_low, log_beta_high))


def _check_bounds(bounds: Any) -> tuple[float, float]:
  try:
    low, high = (float(b) for b in bounds)
  except (TypeError, ValueError):
    raise ValueError(f"bounds must be a pair (low, high) of temperatures, got {bounds!r}") from None
  if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
    raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds!r}")
  return low, high


@_public.float_entry
def fit_temperature(logits: Any, labels: Any, *,
                    bounds: tuple[float, float] = DEFAULT_BOUNDS) -> jax.Array:
  """The temperature T minimising the mean NLL of softmax(logits / T) (temperature scaling).

  .. math::

    \\hat T = \\arg\\min_{T \\in [T_{lo}, T_{hi}]}
      -\\frac{1}{n}\\sum_{i=1}^n \\log \\mathrm{softmax}(z_i / T)_{y_i}.

  The NLL is convex in 1/T, so its derivative changes sign at most once; the
  root is found by safeguarded Newton iterations on log(1/T) (see the module
  docstring). Fit T on held-out data, then divide the test logits by it:
  the argmax, hence accuracy, is unchanged; confidences and their
  calibration change.

  Args:
    logits: [..., n, K] unnormalised scores, K >= 2; leading axes are batch
      axes (one temperature each).
    labels: [..., n] integer labels in [0, K).
    bounds: (T_lo, T_hi), 0 < T_lo < T_hi, the search interval. Where the
      NLL is monotone over it, the better bound is returned.

  Returns:
    [...] temperature(s) (a float32 scalar for [n, K] logits).

  Raises:
    ValueError: on concrete NaN/inf logits, labels out of range or of the
      wrong shape, fewer than 2 classes, no samples, or bad ``bounds``. Inside
      a user's ``jit`` / ``vmap`` only the shape checks run, and a batch row
      with a NaN/inf logit or an invalid label gets a NaN temperature.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import fit_temperature
    >>> logits = jnp.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [0.0, 4.0]])
    >>> labels = jnp.array([0, 1, 0, 0])  # one confident error in four
    >>> t = fit_temperature(logits, labels)
    >>> print(round(float(t), 3))  # softmax(z / t) puts 3/4 on the top class
    3.641

  References:
    Guo, Pleiss, Sun & Weinberger, "On calibration of modern neural
    networks", ICML 2017.
  """
  low, high = _check_bounds(bounds)
  logits = _validation.as_float_array(logits, "logits")
  if logits.ndim < 2:
    raise ValueError(f"logits must have shape [..., n, num_classes], got {logits.shape}")
  if logits.shape[-1] < 2:
    raise ValueError(f"logits need at least 2 classes, got shape {logits.shape}")
  if logits.shape[-2] == 0:
    raise ValueError("logits is empty: at least one sample is needed")
  labels, label_flag = _validation.labels(labels, logits.shape[-1])
  if labels.shape != logits.shape[:-1]:
    raise ValueError(
        f"labels must have shape logits.shape[:-1] = {logits.shape[:-1]}, got {labels.shape}")
  finite_flag = _validation.check_finite_in_unit_interval(logits, "logits", reduce_axes=2,
                                                          unit=False)
  if label_flag is not None:
    label_flag = jnp.any(label_flag, axis=-1)
  dtype = jnp.promote_types(logits.dtype, jnp.float32)
  fitted = _fit(logits.astype(dtype), labels, jnp.asarray(-math.log(high), dtype),
                jnp.asarray(-math.log(low), dtype))
  # Inside a user's jit/vmap, invalid logits or labels give a NaN temperature.
  return _validation.poison(fitted, rows=_validation.either(finite_flag, label_flag))
