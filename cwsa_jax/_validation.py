"""Input checks shared by the public functions.

Every public metric calls these on its inputs before tracing. The checks that
look at *values* (NaN, range, label range) need concrete arrays: inside a
user's ``jax.jit`` or ``jax.vmap`` the inputs are tracers and only the shape
and dtype checks run. There the metrics compute on whatever they are given
(see the README, "Inside jit").
"""

from __future__ import annotations

import operator

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*arrays: Any) -> bool:
  """True when none of ``arrays`` is a JAX tracer (value checks can run)."""
  return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def as_float_array(x: Any, name: str) -> jax.Array:
  """Converts ``x`` to a floating JAX array (float32 unless already floating)."""
  if isinstance(x, jax.core.Tracer):
    arr = x
  else:
    try:
      arr = jnp.asarray(x)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{name} must be numeric array-like, got {type(x).__name__}: {e}") from None
  if arr.dtype == jnp.bool_ or not (
      jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
    raise ValueError(f"{name} must have a numeric dtype, got {arr.dtype}")
  if not jnp.issubdtype(arr.dtype, jnp.floating):
    arr = arr.astype(jnp.float32)
  return arr


def check_nonempty(x: jax.Array, name: str) -> None:
  if x.size == 0:
    raise ValueError(f"{name} is empty: at least one sample is needed")


def check_same_leading_shape(a: jax.Array, b: jax.Array, name_a: str, name_b: str) -> None:
  if a.shape != b.shape:
    raise ValueError(f"{name_a} and {name_b} must have the same shape, got {a.shape} and {b.shape}")


def check_samples(confidences: jax.Array, correct: jax.Array) -> None:
  """Raises unless confidences [..., n] and correct share a shape with n >= 1 and c in [0, 1]."""
  check_same_leading_shape(confidences, correct, "confidences", "correct")
  if confidences.ndim == 0:
    raise ValueError("confidences must have a samples axis [..., n], got a scalar")
  if confidences.shape[-1] == 0:
    raise ValueError("confidences is empty: at least one sample is needed")
  check_finite_in_unit_interval(confidences, "confidences")


def check_finite_in_unit_interval(x: jax.Array, name: str) -> None:
  """Raises if ``x`` (concrete) holds NaN, inf, or values outside [0, 1]."""
  if not is_concrete(x):
    return
  v = np.asarray(x)
  if not np.all(np.isfinite(v)):
    bad = int(np.sum(~np.isfinite(v)))
    raise ValueError(f"{name} contains {bad} NaN or infinite value(s)")
  lo, hi = float(v.min()), float(v.max())
  if lo < 0.0 or hi > 1.0:
    raise ValueError(f"{name} must lie in [0, 1], got values in [{lo:.6g}, {hi:.6g}]")


def check_threshold(tau: Any, name: str = "tau") -> None:
  """Raises unless every (concrete) threshold is finite and in [0, 1)."""
  if not is_concrete(tau):
    return
  v = np.asarray(tau, dtype=np.float64)
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{name} must be finite, got {v if v.size < 8 else 'NaN/inf values'}")
  if np.any(v < 0.0) or np.any(v >= 1.0):
    raise ValueError(
        f"{name} must lie in [0, 1) (tau = 1 makes phi = (c - tau)/(1 - tau) divide by zero), "
        f"got values in [{v.min():.6g}, {v.max():.6g}]")


def as_correct(correct: Any, name: str = "correct", *, graded: bool = True) -> jax.Array:
  """Validates correctness indicators.

  Boolean and integer arrays must be 0/1 and are returned as ``bool``. Floating
  arrays are graded correctness kappa in [0, 1] (binary values allowed) and are
  returned as float32. With ``graded=False`` floating arrays must be exactly 0/1.
  """
  if isinstance(correct, jax.core.Tracer):
    arr = correct
  else:
    try:
      arr = jnp.asarray(correct)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{name} must be array-like, got {type(correct).__name__}: {e}") from None
  if arr.dtype == jnp.bool_:
    return arr
  if jnp.issubdtype(arr.dtype, jnp.integer):
    if is_concrete(arr):
      v = np.asarray(arr)
      if v.size and (v.min() < 0 or v.max() > 1):
        raise ValueError(f"{name} must be boolean or 0/1, got integer values in [{v.min()}, {v.max()}]")
    return arr.astype(jnp.bool_)
  if jnp.issubdtype(arr.dtype, jnp.floating):
    if is_concrete(arr):
      v = np.asarray(arr)
      if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} contains NaN or infinite values")
      if v.size and (v.min() < 0.0 or v.max() > 1.0):
        raise ValueError(
            f"{name} must lie in [0, 1] (graded correctness kappa), got values in "
            f"[{v.min():.6g}, {v.max():.6g}]")
      if not graded and not np.all((v == 0.0) | (v == 1.0)):
        raise ValueError(f"{name} must be boolean or 0/1")
    return arr.astype(jnp.float32)
  raise ValueError(f"{name} must be boolean, 0/1 or a float in [0, 1], got dtype {arr.dtype}")


def as_labels(labels: Any, name: str = "labels", *, num_classes: int | None = None) -> jax.Array:
  """Validates integer class labels (optionally in [0, num_classes))."""
  if isinstance(labels, jax.core.Tracer):
    arr = labels
  else:
    try:
      arr = jnp.asarray(labels)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{name} must be array-like, got {type(labels).__name__}: {e}") from None
  if not jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == jnp.bool_:
    if jnp.issubdtype(arr.dtype, jnp.floating) and is_concrete(arr):
      v = np.asarray(arr)
      if np.all(np.isfinite(v)) and np.all(v == np.round(v)):
        arr = arr.astype(jnp.int32)
      else:
        raise ValueError(f"{name} must be integer class indices, got non-integer values")
    else:
      raise ValueError(f"{name} must be integer class indices, got dtype {arr.dtype}")
  if num_classes is not None and is_concrete(arr):
    v = np.asarray(arr)
    if v.size and (v.min() < 0 or v.max() >= num_classes):
      raise ValueError(
          f"{name} must lie in [0, {num_classes}), got values in [{v.min()}, {v.max()}]")
  return arr


def prepare_at_threshold(confidences: Any, correct: Any, tau: Any, *, hint: str = ""):
  """Validated (float32 confidences [..., n], correctness, float32 scalar tau)."""
  confidences = as_float_array(confidences, "confidences")
  correct = as_correct(correct)
  tau = as_float_array(tau, "tau")
  if tau.ndim != 0:
    raise ValueError(f"tau must be a scalar, got shape {tau.shape}{hint}")
  check_samples(confidences, correct)
  check_threshold(tau)
  return confidences.astype(jnp.float32), correct, tau.astype(jnp.float32)


def as_thresholds(thresholds: Any) -> jax.Array:
  """Validated float32 thresholds [T] (T >= 1, each in [0, 1))."""
  t = as_float_array(thresholds, "thresholds")
  if t.ndim != 1:
    raise ValueError(f"thresholds must be 1-D [T], got shape {t.shape}")
  check_nonempty(t, "thresholds")
  check_threshold(t, "thresholds")
  return t.astype(jnp.float32)


def positive_int(x: Any, name: str) -> int:
  """``x`` as a Python int >= 1 (bools and non-integers refused)."""
  if isinstance(x, bool):
    raise ValueError(f"{name} must be a positive integer, got {x!r}")
  try:
    value = operator.index(x)
  except TypeError:
    raise ValueError(f"{name} must be a positive integer, got {x!r}") from None
  if value < 1:
    raise ValueError(f"{name} must be >= 1, got {value}")
  return value
