"""The argument checks of every bootstrap: key, level, data, metric, resample counts."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _validation
from cwsa_jax._bootstrap._stand_ins import refusal

# Elements (chunk_size * n) per chunk when chunk_size is None: resamples of a
# small test set are batched, one of n >= 65536 samples runs alone.
DEFAULT_CHUNK_ELEMENTS = 1 << 16


def _check_key(key: Any) -> jax.Array:
  """A typed PRNG key (``jax.random.key``) or a legacy uint32 [2] key (``jax.random.PRNGKey``)."""
  dtype = getattr(key, "dtype", None)
  shape = getattr(key, "shape", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if shape != ():
      raise ValueError(f"key must be a single PRNG key, got a key array of shape {shape}")
    return key
  if dtype == jnp.uint32 and shape == (2,):
    return jax.random.wrap_key_data(key, impl="threefry2x32")
  raise ValueError(
      f"key must be a JAX PRNG key, e.g. jax.random.key(0), got {type(key).__name__}"
      + (f" with dtype {dtype} and shape {shape}" if dtype is not None else ""))


def _check_level(level: Any) -> Any:
  if isinstance(level, jax.core.Tracer):
    return level
  try:
    value = float(level)
  except (TypeError, ValueError):
    raise ValueError(f"level must be a number in (0, 1), got {level!r}") from None
  if not 0.0 < value < 1.0:  # also rejects NaN
    raise ValueError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {value!r}")
  return value


def _check_data(confidences: Any, correct: Any, suffix: str = "", *, fn: Any = None):
  """Checked [n] confidences (float, NaN rows under a trace) and correctness; ``fn``: the
  metric the data are for, named when it refuses real-valued scores (``_stand_ins``)."""
  c = _validation.as_float_array(confidences, f"confidences{suffix}")
  k = _validation.correct_array(correct, f"correct{suffix}")
  if c.ndim != 1 or k.ndim != 1:
    raise ValueError(f"confidences{suffix} and correct{suffix} must be 1-D [n], got shapes "
                     f"{c.shape} and {k.shape}")
  try:
    invalid = _validation.check_samples(c, k, names=(f"confidences{suffix}", f"correct{suffix}"))
  except ValueError as e:
    named = fn is not None and c.shape == k.shape  # a range error, not one of shapes
    message = str(e) + (refusal(fn, c) if named else "")
    raise ValueError(f"{message} (model {suffix[1:]})" if suffix else message) from None
  # Traced invalid data (inside a user's jit/vmap): every confidence becomes NaN,
  # so the estimate and every resample are NaN, whatever ``fn`` computes.
  return _validation.poison(c, rows=invalid), _validation.convert_correct(k)


def _check_fn(fn: Any) -> None:
  if not callable(fn):
    raise ValueError(f"fn must be a function (confidences, correct) -> metric, got {type(fn).__name__}")


def _check_common(key: Any, num_resamples: Any, chunk_size: Any, n: int):
  """Validated (key, num_resamples, chunk_size), the chunk size defaulted and capped at B."""
  key = _check_key(key)
  num_resamples = _validation.positive_int(num_resamples, "num_resamples")
  if chunk_size is None:
    chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // n)
  chunk_size = min(_validation.positive_int(chunk_size, "chunk_size"), num_resamples)
  return key, num_resamples, chunk_size
