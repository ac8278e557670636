"""Input checks shared by the public functions: one place for what "invalid" means.

Every public function passes its inputs through the entry points here before
computing anything. Each entry point does two things:

* **shape and dtype** checks, always (also at trace time): ``ValueError`` for
  a bad shape, :class:`DTypeError` (a ``TypeError``, and a ``ValueError`` for
  callers that catch that) for a wrong dtype;
* **value** checks. On concrete arrays they raise ``ValueError`` naming the
  problem. On tracers (inside a user's ``jax.jit``, ``jax.vmap``, ``jax.grad``
  or ``checkify``) nothing can be raised: the entry point returns a traced
  boolean *flag* instead (``None`` when the values were already checked), and
  the public function passes its outputs through :func:`poison`, which makes
  them NaN (and their gradients NaN) where the flag is set: for the invalid
  batch row only under ``vmap`` or with leading batch axes, for the invalid
  threshold only in a sweep. Each flag is also a
  ``jax.experimental.checkify.debug_check``, so
  ``checkify.checkify(f, errors=checkify.user_checks)`` reports the problem as
  an error. Outside ``checkify`` the checks compute nothing more, but they
  give a jitted function that contains them checkify's (unordered) error
  effect, and JAX dispatches such a function on its Python path rather than
  its C++ fast path, which adds a small fixed cost per call (docs/exactness.md).

Invalid values, for every public function:

* confidences or probabilities that are NaN, infinite or outside [0, 1]
  (rank metrics: see :data:`SCORES_IN_UNIT_INTERVAL`);
* probability rows whose sum differs from 1 by more than
  :data:`PROBABILITY_TOLERANCE`;
* integer class labels or group ids outside [0, K);
* integer correctness other than 0 and 1 (integers are checked before they are
  cast to ``bool``), graded correctness NaN or outside [0, 1];
* thresholds outside [0, 1), temperatures that are not finite and > 0,
  coverage or risk targets outside their range (NaN and inf included).
"""

from __future__ import annotations

import functools
import operator

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from cwsa_jax._kernels import _dispatch

# Probability rows must sum to 1 within this absolute tolerance, for every
# dtype (float32 softmax outputs of 10^4 classes and probabilities saved with
# four decimals pass; rows summing to 0.999 or 1.01 do not).
PROBABILITY_TOLERANCE = 1e-3

# The rank metrics (aurc, augrc, eaurc, risk_coverage_summary,
# risk_coverage_curve, risk_at_coverage, coverage_at_risk) only compare
# confidences with each other. Their scores must lie in [0, 1] all the same: the default of
# ``samples(..., scores=True, unit_scores=...)``; with False any finite real score is
# accepted (their kernels still clip to [0, 1]).
SCORES_IN_UNIT_INTERVAL = True


class DTypeError(TypeError, ValueError):
  """An input has the wrong dtype (a ``TypeError``; also a ``ValueError`` for older callers)."""


def is_concrete(*arrays: Any) -> bool:
  """True when none of ``arrays`` is a JAX tracer (value checks can run)."""
  return not any(isinstance(a, jax.core.Tracer) for a in arrays)


class _Values(NamedTuple):
  """What the eager value checks read of an array."""
  nonfinite: int  # NaN and infinite entries
  low: Any  # min and max (None when empty or when some entry is not finite)
  high: Any
  not_binary: int | None  # entries other than 0 and 1 (when asked for)


@functools.partial(jax.jit, static_argnames="binary")
def _device_values(x: jax.Array, binary: bool):
  finite = jnp.isfinite(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.ones(x.shape, bool)
  out = (jnp.sum(~finite), jnp.min(x), jnp.max(x))
  return out + ((jnp.sum((x != 0) & (x != 1)),) if binary else ())


def _values(x: Any, *, binary: bool = False,
            kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> _Values:
  """:class:`_Values` of a concrete numeric array, computed where it lives.

  An array on an accelerator (``kernels.on_accelerator``) is reduced there (a
  few scalars come back, not the array); others are read as NumPy arrays (no
  copy for CPU arrays).
  """
  if kernels.on_accelerator(x):
    if x.size == 0:
      return _Values(0, None, None, 0 if binary else None)
    nonfinite, low, high, *not_binary = jax.device_get(_device_values(x, binary))
    nonfinite = int(nonfinite)
    return _Values(nonfinite, None if nonfinite else low, None if nonfinite else high,
                   int(not_binary[0]) if binary else None)
  v = np.asarray(x)
  low, high = (v.min(), v.max()) if v.size else (None, None)
  nonfinite = 0
  # min and max carry any NaN or infinity: the entries are counted only when one is there
  # (two passes over valid data instead of three).
  if v.dtype.kind == "f" and v.size and not (np.isfinite(low) and np.isfinite(high)):
    nonfinite = int(v.size - np.count_nonzero(np.isfinite(v)))
    low = high = None
  not_binary = int(np.count_nonzero((v != 0) & (v != 1))) if binary else None
  return _Values(nonfinite, low, high, not_binary)


# --------------------------------------------------------------------------- flags
# Elementwise "invalid" predicates. Written as ``~(ok)`` so that NaN, which
# fails every comparison, is always invalid.

def bad_unit(x: jax.Array) -> jax.Array:
  """Elementwise: NaN, infinite or outside [0, 1]."""
  return ~((x >= 0) & (x <= 1))


def bad_correct(k: jax.Array) -> jax.Array:
  """Elementwise: integer correctness not 0/1, graded correctness NaN or outside [0, 1]."""
  if k.dtype == jnp.bool_:
    return jnp.zeros(k.shape, bool)
  if jnp.issubdtype(k.dtype, jnp.integer):
    return (k != 0) & (k != 1)
  return bad_unit(k)


def bad_threshold(t: jax.Array) -> jax.Array:
  """Elementwise: a threshold outside [0, 1) (NaN and inf included)."""
  return ~((t >= 0) & (t < 1))


def bad_positive(x: jax.Array) -> jax.Array:
  """Elementwise: not finite and > 0 (temperatures)."""
  return ~((x > 0) & (x < jnp.inf))


def bad_label(y: jax.Array, num_classes: int) -> jax.Array:
  """Elementwise: an integer label outside [0, num_classes)."""
  return (y < 0) | (y >= num_classes)


def bad_probability_rows(p: jax.Array) -> jax.Array:
  """Per row of ``p`` [..., K]: a value outside [0, 1] or a sum off 1 by more than the tolerance."""
  total = jnp.sum(p.astype(jnp.promote_types(p.dtype, jnp.float32)), axis=-1)
  return jnp.any(bad_unit(p), axis=-1) | ~(jnp.abs(total - 1) <= PROBABILITY_TOLERANCE)


def _traced_flag(bad: jax.Array, reduce_axes: int, message: str) -> jax.Array:
  """``bad`` reduced with ``any`` over its last ``reduce_axes`` axes, registered with checkify."""
  if reduce_axes:
    bad = jnp.any(bad, axis=tuple(range(bad.ndim - reduce_axes, bad.ndim)))
  checkify.debug_check(~jnp.any(bad), message)
  return bad


def either(*flags: jax.Array | None) -> jax.Array | None:
  """Elementwise or of the flags that are not None (None if all are)."""
  flags = [f for f in flags if f is not None]
  if not flags:
    return None
  out = flags[0]
  for f in flags[1:]:
    out = out | f
  return out


def poison(x: Any, rows: jax.Array | None = None, items: jax.Array | None = None) -> Any:
  """Marks the outputs of invalid inputs: NaN for floating leaves, -1 for integer ones.

  ``rows`` flags the batch rows (aligned with the *leading* axes of every leaf,
  e.g. [...] for [..., T] outputs); ``items`` is broadcast against the
  *trailing* axes (a scalar for tau, [T] for thresholds, a target's shape).
  Floating leaves are multiplied by NaN rather than replaced, so that their
  gradients are NaN too, never a plausible number. Boolean leaves are kept.
  """
  if rows is None and items is None:
    return x

  def mark(leaf):
    leaf = jnp.asarray(leaf)
    bad = jnp.zeros((), bool)
    if rows is not None:
      bad = bad | rows.reshape(rows.shape + (1,) * (leaf.ndim - rows.ndim))
    if items is not None:
      bad = bad | items
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      return leaf * jnp.where(bad, jnp.nan, 1.0).astype(leaf.dtype)
    if jnp.issubdtype(leaf.dtype, jnp.integer):
      return jnp.where(bad, jnp.asarray(-1, leaf.dtype), leaf)
    return leaf

  return jax.tree_util.tree_map(mark, x)


# ------------------------------------------------------------------ conversions


def _as_array(x: Any, name: str) -> jax.Array:
  if isinstance(x, jax.Array):  # tracers too: as it is (jnp.asarray costs a dispatch)
    return x
  try:
    return jnp.asarray(x)
  except TypeError as e:  # e.g. strings or objects: not a numeric dtype
    raise DTypeError(f"{name} must be numeric array-like, got {type(x).__name__}: {e}") from None
  except ValueError as e:  # e.g. ragged nested lists
    raise ValueError(f"{name} must be numeric array-like, got {type(x).__name__}: {e}") from None


def as_float_array(x: Any, name: str) -> jax.Array:
  """Converts ``x`` to a floating JAX array (float32 unless already floating)."""
  arr = _as_array(x, name)
  if arr.dtype == jnp.bool_ or not (
      jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
    raise DTypeError(f"{name} must have a numeric dtype, got {arr.dtype}")
  if not jnp.issubdtype(arr.dtype, jnp.floating):
    arr = arr.astype(jnp.float32)
  return arr


def correct_array(correct: Any, name: str = "correct") -> jax.Array:
  """``correct`` as an array of its own dtype (bool, integer or floating), not yet converted."""
  arr = _as_array(correct, name)
  if arr.dtype == jnp.bool_ or jnp.issubdtype(arr.dtype, jnp.integer) \
      or jnp.issubdtype(arr.dtype, jnp.floating):
    return arr
  raise DTypeError(f"{name} must be boolean, 0/1 or a float in [0, 1], got dtype {arr.dtype}")


def _float32(x: jax.Array) -> jax.Array:
  """``x`` as float32 (no conversion op for an array that is float32 already)."""
  return x if x.dtype == jnp.float32 else x.astype(jnp.float32)


def convert_correct(k: jax.Array) -> jax.Array:
  """Checked correctness in the kernels' dtype: integers as ``bool``, floats as float32."""
  if jnp.issubdtype(k.dtype, jnp.integer):
    return k.astype(jnp.bool_)
  if jnp.issubdtype(k.dtype, jnp.floating):
    return _float32(k)
  return k


# ------------------------------------------------------------------ value checks
# Each returns None after a successful eager check, or a traced flag.


def check_finite_in_unit_interval(x: jax.Array, name: str, *, reduce_axes: int = 1,
                                  unit: bool = True,
                                  kernels: _dispatch.Kernels = _dispatch.DEFAULT
                                  ) -> jax.Array | None:
  """Raises if concrete ``x`` holds NaN, inf or values outside [0, 1]; else the traced flag.

  The flag is reduced over the last ``reduce_axes`` axes (the samples axis by
  default). With ``unit=False`` only finiteness is required. ``kernels``: where
  concrete values are reduced (:func:`_values`).
  """
  if not is_concrete(x):
    bad = bad_unit(x) if unit else ~jnp.isfinite(x)
    what = "finite and in [0, 1]" if unit else "finite"
    return _traced_flag(bad, min(reduce_axes, x.ndim), f"{name} must be {what}")
  v = _values(x, kernels=kernels)
  if v.nonfinite:
    raise ValueError(f"{name} contains {v.nonfinite} NaN or infinite value(s)")
  if unit and v.low is not None:
    lo, hi = float(v.low), float(v.high)
    if lo < 0.0 or hi > 1.0:
      raise ValueError(f"{name} must lie in [0, 1], got values in [{lo:.6g}, {hi:.6g}]")
  return None


def check_correct(k: jax.Array, name: str = "correct", *, graded: bool = True,
                  reduce_axes: int = 1,
                  kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array | None:
  """Raises unless concrete ``k`` is bool, integer 0/1 or (``graded``) a float in [0, 1].

  Returns the traced flag instead on tracers.

  With ``graded=False`` floats must be exactly 0 or 1 (traced: flagged if not).
  """
  if k.dtype == jnp.bool_:
    return None
  integer = jnp.issubdtype(k.dtype, jnp.integer)
  if not is_concrete(k):
    bad = bad_correct(k)
    if not graded and not integer:
      bad = (k != 0) & (k != 1)
    what = "0 or 1" if integer or not graded else "a number in [0, 1]"
    return _traced_flag(bad, min(reduce_axes, k.ndim), f"{name} must be {what}")
  v = _values(k, binary=not graded and not integer, kernels=kernels)
  if integer:
    if v.low is not None and (v.low < 0 or v.high > 1):
      raise ValueError(
          f"{name} must be boolean or 0/1, got integer values in [{v.low}, {v.high}]")
    return None
  if v.nonfinite:
    raise ValueError(f"{name} contains NaN or infinite values")
  if v.low is not None and (v.low < 0.0 or v.high > 1.0):
    raise ValueError(
        f"{name} must lie in [0, 1] (graded correctness kappa), got values in "
        f"[{v.low:.6g}, {v.high:.6g}]")
  if not graded and v.not_binary:
    raise ValueError(f"{name} must be boolean or 0/1 here (graded values are not accepted)")
  return None


def check_threshold(tau: Any, name: str = "tau") -> jax.Array | None:
  """Raises unless every (concrete) threshold is finite and in [0, 1); else the elementwise flag."""
  if not is_concrete(tau):
    return _traced_flag(bad_threshold(tau), 0, f"{name} must lie in [0, 1)")
  v = np.asarray(tau, dtype=np.float64)
  if v.size and 0.0 <= v.min() and v.max() < 1.0:  # False with a NaN: min and max carry it
    return None
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{name} must be finite, got {v if v.size < 8 else 'NaN/inf values'}")
  if np.any(v < 0.0) or np.any(v >= 1.0):
    bad = v[(v < 0.0) | (v >= 1.0)]
    given = ", ".join(f"{x:.6g}" for x in bad[:4])
    if bad.size > 4:
      given += f" and {bad.size - 4} more"
    why = " (at tau = 1, phi = (c - tau)/(1 - tau) divides by zero)" if bad.max() >= 1.0 else ""
    raise ValueError(f"{name} must lie in [0, 1), got {given}{why}")
  return None


def check_positive(x: Any, name: str) -> jax.Array | None:
  """Raises unless concrete ``x`` is finite and > 0; else the elementwise flag."""
  if not is_concrete(x):
    return _traced_flag(bad_positive(x), 0, f"{name} must be finite and > 0")
  v = np.asarray(x, dtype=np.float64)
  if not (np.all(np.isfinite(v)) and np.all(v > 0)):
    raise ValueError(f"{name} must be finite and > 0, got {v if v.size < 8 else 'other values'}")
  return None


def check_nonnegative(x: Any, name: str) -> jax.Array | None:
  """Raises unless concrete ``x`` is finite and >= 0 (loss weights); else the elementwise flag."""
  if not is_concrete(x):
    return _traced_flag(~((x >= 0) & (x < jnp.inf)), 0, f"{name} must be finite and >= 0")
  v = np.asarray(x, dtype=np.float64)
  if not (np.all(np.isfinite(v)) and np.all(v >= 0)):
    raise ValueError(f"{name} must be finite and >= 0, got {v if v.size < 8 else 'other values'}")
  return None


def check_range(x: Any, name: str, *, low_open: bool) -> jax.Array | None:
  """Raises unless concrete ``x`` lies in [0, 1] ((0, 1] with ``low_open``); else the flag."""
  interval = "(0, 1]" if low_open else "[0, 1]"
  if not is_concrete(x):
    ok = ((x > 0) if low_open else (x >= 0)) & (x <= 1)
    return _traced_flag(~ok, 0, f"{name} must lie in {interval}")
  v = np.asarray(x, dtype=np.float64)
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{name} must be finite")
  lo_ok = np.all(v > 0.0) if low_open else np.all(v >= 0.0)
  if not lo_ok or np.any(v > 1.0):
    raise ValueError(f"{name} must lie in {interval}, got values in [{v.min():.6g}, {v.max():.6g}]")
  return None


def check_labels(y: jax.Array, num_classes: int, name: str = "labels", *,
                 kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array | None:
  """Raises unless concrete integer ``y`` lies in [0, num_classes); else the elementwise flag."""
  if not is_concrete(y):
    return _traced_flag(bad_label(y, num_classes), 0, f"{name} must lie in [0, {num_classes})")
  v = _values(y, kernels=kernels)
  if v.low is not None and (v.low < 0 or v.high >= num_classes):
    raise ValueError(f"{name} must lie in [0, {num_classes}), got values in [{v.low}, {v.high}]")
  return None


def check_probabilities(p: jax.Array, name: str = "probs") -> jax.Array | None:
  """Raises unless concrete ``p`` [..., K] are probabilities; else the per-row traced flag.

  Probabilities: finite, in [0, 1], each row summing to 1 within
  :data:`PROBABILITY_TOLERANCE`.
  """
  if not is_concrete(p):
    return _traced_flag(bad_probability_rows(p), 0,
                        f"{name} must be probabilities in [0, 1] summing to 1 over the class axis")
  v = np.asarray(p, dtype=np.float64)
  if not np.all(np.isfinite(v)):
    raise ValueError(f"{name} contains {int(np.sum(~np.isfinite(v)))} NaN or infinite value(s)")
  lo, hi = float(v.min()), float(v.max())
  if lo < 0.0 or hi > 1.0:
    raise ValueError(
        f"{name} must be probabilities in [0, 1], got values in [{lo:.6g}, {hi:.6g}] "
        "(pass logits instead?)")
  err = np.abs(v.sum(axis=-1) - 1.0)
  if err.size and err.max() > PROBABILITY_TOLERANCE:
    i = int(np.argmax(err.reshape(-1)))
    total = float(v.sum(axis=-1).reshape(-1)[i])
    raise ValueError(
        f"{name} rows must sum to 1 over the class axis (tolerance {PROBABILITY_TOLERANCE:g}); "
        f"row {i} sums to {total:.6g} (pass logits instead?)")
  return None


# ------------------------------------------------------------------ entry points


def check_nonempty(x: jax.Array, name: str) -> None:
  if x.size == 0:
    raise ValueError(f"{name} is empty: at least one sample is needed")


def check_same_leading_shape(a: jax.Array, b: jax.Array, name_a: str, name_b: str) -> None:
  if a.shape != b.shape:
    raise ValueError(f"{name_a} and {name_b} must have the same shape, got {a.shape} and {b.shape}")


def _check_sample_shapes(confidences: jax.Array, correct: jax.Array,
                         names: tuple[str, str] = ("confidences", "correct")) -> None:
  check_same_leading_shape(confidences, correct, *names)
  if confidences.ndim == 0:
    raise ValueError(f"{names[0]} must have a samples axis [..., n], got a scalar")
  if confidences.shape[-1] == 0:
    raise ValueError(f"{names[0]} is empty: at least one sample is needed")


def check_samples(confidences: jax.Array, correct: jax.Array, *,
                  names: tuple[str, str] = ("confidences", "correct")) -> jax.Array | None:
  """Shapes of confidences [..., n] and correct; values of both. Returns the traced row flag."""
  _check_sample_shapes(confidences, correct, names)
  return either(check_finite_in_unit_interval(confidences, names[0]),
                check_correct(correct, names[1]))


class Samples(NamedTuple):
  """Checked samples: float32 confidences, correctness (bool or float32), row flag [...] or None."""
  confidences: jax.Array
  correct: jax.Array
  invalid: jax.Array | None


def deferred_to_kernel(confidences: Any, *,
                       kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> bool:
  """Whether a kernel that counts the confidences it kept checks these instead of a pass here.

  True for concrete arrays on an accelerator: there a value check is a pass
  over the samples of its own and a wait for its result, before the kernel
  reads them again. A caller that gets True passes ``check_confidences=False``
  to :func:`samples`, runs its kernel leaving out confidences NaN or outside
  [0, 1] (``drop_invalid``) and then calls :func:`raise_if_left_out`.
  ``kernels.on_accelerator`` says where the confidences are.
  """
  return is_concrete(confidences) and kernels.on_accelerator(confidences)


def raise_if_left_out(left_out: Any, confidences: Any, *,
                      kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> None:
  """After a kernel that left out invalid confidences (:func:`deferred_to_kernel`): where a
  row lost samples (``left_out``, concrete bools), the error a check beforehand gives."""
  if np.asarray(left_out).any():
    # raises, naming the problem
    check_finite_in_unit_interval(confidences, "confidences", kernels=kernels)


def samples(confidences: Any, correct: Any, *, scores: bool = False,
            graded: bool = True, flag_confidences: bool = True,
            check_confidences: bool = True, unit_scores: bool = SCORES_IN_UNIT_INTERVAL,
            kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> Samples:
  """The common entry point of the (confidences, correct) metrics.

  Args:
    confidences: [..., n] confidences in [0, 1] (with ``scores``, rank-metric
      scores: in [0, 1] too unless ``unit_scores`` is False).
    correct: [..., n] bool, integer 0/1 or graded float in [0, 1].
    scores: apply the rank metrics' range rule to ``confidences``.
    graded: accept graded (non-binary) float correctness.
    flag_confidences: include traced confidences in the flag. A kernel that
      leaves out confidences NaN or outside [0, 1] and counts what it kept
      (``_sweep.bucket_sums(drop_invalid=True)``) flags them from that count
      instead, with no pass of its own over the samples; the check stays
      registered with ``checkify``.
    check_confidences: False: concrete confidences are not checked here
      either (see :func:`deferred_to_kernel`).
    unit_scores: with ``scores``, whether they must lie in [0, 1] (False: any
      finite score; :data:`SCORES_IN_UNIT_INTERVAL` by default).
    kernels: where concrete values are reduced (:func:`_values`).

  Returns:
    :class:`Samples`; ``invalid`` is the traced per-row flag (None when the
    values were concrete and checked).
  """
  c = as_float_array(confidences, "confidences")
  k = correct_array(correct)
  _check_sample_shapes(c, k)
  confidence_flag = None
  if check_confidences or not is_concrete(c):
    confidence_flag = check_finite_in_unit_interval(
        c, "confidences", unit=unit_scores or not scores, kernels=kernels)
  flag = either(confidence_flag if flag_confidences else None,
                check_correct(k, graded=graded, kernels=kernels))
  return Samples(_float32(c), convert_correct(k), flag)


def as_correct(correct: Any, name: str = "correct", *, graded: bool = True) -> jax.Array:
  """Validated correctness: integers as ``bool``, floats (graded kappa in [0, 1]) as float32.

  Concrete values are checked (ValueError). Use :func:`samples` where traced
  values must be flagged too: this function cannot return the flag.
  """
  k = correct_array(correct, name)
  check_correct(k, name, graded=graded)
  return convert_correct(k)


def as_labels(labels: Any, name: str = "labels", *, num_classes: int | None = None,
              kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """Validated integer class labels (concrete ones checked to lie in [0, num_classes))."""
  arr = _as_array(labels, name)
  if not jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == jnp.bool_:
    if jnp.issubdtype(arr.dtype, jnp.floating) and is_concrete(arr):
      v = np.asarray(arr)
      if np.all(np.isfinite(v)) and np.all(v == np.round(v)):
        arr = arr.astype(jnp.int32)
      else:
        raise ValueError(f"{name} must be integer class indices, got non-integer values")
    else:
      raise DTypeError(f"{name} must be integer class indices, got dtype {arr.dtype}")
  if num_classes is not None and is_concrete(arr):
    check_labels(arr, num_classes, name, kernels=kernels)
  return arr


def labels(y: Any, num_classes: int, name: str = "labels", *,
           kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> tuple[jax.Array, jax.Array | None]:
  """(int32 labels, elementwise flag or None) of labels that must lie in [0, num_classes)."""
  y = as_labels(y, name)
  return y.astype(jnp.int32), check_labels(y, num_classes, name, kernels=kernels)


def threshold(tau: Any, name: str = "tau", *, hint: str = "") -> tuple[jax.Array, jax.Array | None]:
  """(float32 scalar threshold, flag or None)."""
  t = as_float_array(tau, name)
  if t.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {t.shape}{hint}")
  return _float32(t), check_threshold(t, name)


def thresholds(values: Any, name: str = "thresholds", *,
               min_size: int = 1) -> tuple[jax.Array, jax.Array | None]:
  """(float32 thresholds [T], elementwise flag [T] or None)."""
  t = as_float_array(values, name)
  if t.ndim != 1:
    raise ValueError(f"{name} must be 1-D [T], got shape {t.shape}")
  check_nonempty(t, name)
  if t.shape[0] < min_size:
    raise ValueError(f"{name} needs at least {min_size} values, got shape {t.shape}")
  return _float32(t), check_threshold(t, name)


def as_thresholds(values: Any) -> jax.Array:
  """Validated float32 thresholds [T] (T >= 1; concrete ones checked to lie in [0, 1))."""
  return thresholds(values)[0]


def temperature(value: Any, name: str = "temperature") -> tuple[jax.Array, jax.Array | None]:
  """(scalar temperature, flag or None): finite and > 0."""
  t = as_float_array(value, name)
  if t.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {t.shape}")
  return t, check_positive(t, name)


def prepare_at_threshold(confidences: Any, correct: Any, tau: Any, *, hint: str = "",
                         kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  """(float32 confidences [..., n], correctness, float32 scalar tau, row flag, tau flag)."""
  c, k, rows = samples(confidences, correct, kernels=kernels)
  tau, tau_flag = threshold(tau, hint=hint)
  return c, k, tau, rows, tau_flag


def mask(values: Any, shape: tuple[int, ...], *, target: str = "labels.shape",
         name: str = "mask") -> tuple[jax.Array, jax.Array | None]:
  """(mask array, elementwise traced flag or None) of a sample mask, as ``nnx.metrics`` takes it.

  A bool, integer or float array broadcastable to ``shape`` (the samples'
  shape [..., n], called ``target`` in messages); a nonzero entry keeps its
  sample, 0 drops it, so ``mask != 0`` is the kept set (a float mask is not a
  weight). Float entries must be finite: concrete NaN or inf raises
  ``ValueError``; traced ones give the flag, over the mask's own shape, for
  the caller to :func:`poison` its results with.
  """
  if isinstance(values, jax.Array):  # tracers too: as they are
    arr = values
  else:
    try:
      arr = jnp.asarray(values)
    except TypeError as e:  # strings, objects
      raise DTypeError(f"{name} must be a boolean, integer or float array, got "
                       f"{type(values).__name__}: {e}") from None
    except ValueError as e:  # ragged nested lists
      raise ValueError(f"{name} must be a boolean, integer or float array, got "
                       f"{type(values).__name__}: {e}") from None
  floating = jnp.issubdtype(arr.dtype, jnp.floating)
  if not (floating or arr.dtype == jnp.bool_ or jnp.issubdtype(arr.dtype, jnp.integer)):
    raise DTypeError(f"{name} must be a boolean, integer or float array (nonzero keeps a "
                     f"sample), got dtype {arr.dtype}")
  try:
    fits = np.broadcast_shapes(arr.shape, tuple(shape)) == tuple(shape)
  except ValueError:
    fits = False
  if not fits:
    raise ValueError(
        f"{name} must be broadcastable to {target} = {tuple(shape)}, got shape {arr.shape}")
  flag = None
  if floating:
    flag = check_finite_in_unit_interval(arr, name, reduce_axes=0, unit=False)
  return arr, flag


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


def nan_if_invalid(x: jax.Array, flag: jax.Array | None) -> jax.Array:
  """``x`` with NaN where ``flag`` is set: an invalid traced option then poisons every result."""
  return x if flag is None else poison(x, items=flag)


def refuse_gradient(x: jax.Array, message: str) -> jax.Array:
  """``x`` unchanged; differentiating through it raises ``TypeError(message)``.

  For results built from exact integer statistics, which carry no derivative:
  an error instead of a silent zero gradient.
  """
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  return _refuse(message, x)


def _refuse_impl(message, x):
  del message
  return x


_refuse = jax.custom_jvp(_refuse_impl, nondiff_argnums=(0,))


@_refuse.defjvp
def _refuse_jvp(message, primals, tangents):
  del primals, tangents
  raise TypeError(message)
