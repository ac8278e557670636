"""What the mergeable states share: batch checks, exact merges of their integer sums, the
capacity check, configured subclasses (clu's protocol) and model outputs."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _confidence
from cwsa_jax import _exact
from cwsa_jax import _validation

PUBLIC_MODULE = "cwsa_jax.streaming"


def public(obj: Any) -> Any:
  """``obj`` with ``__module__`` set to :mod:`cwsa_jax.streaming`, which re-exports it (a class:
  its methods too), so that ``help()``, ``repr``, pickle and the docs name it there and
  doctest collects its examples from there."""
  obj.__module__ = PUBLIC_MODULE
  if inspect.isclass(obj):
    for value in vars(obj).values():
      value = getattr(value, "__func__", getattr(value, "fget", value))
      if inspect.isfunction(value) and value.__module__ != PUBLIC_MODULE:
        value.__module__ = PUBLIC_MODULE
  return obj


def _batched(fn: Callable, ndim: int, in_axes) -> Callable:
  for _ in range(ndim):
    fn = jax.vmap(fn, in_axes=in_axes)
  return fn


_NO_GRADIENT = (
    "streaming states hold exact integer sums and have no derivative; differentiate "
    "cwsa_jax.sweep / cwsa / ece (exact almost everywhere) or soft_cwsa (relaxed) instead")


def _prepare_batch(confidences: Any, correct: Any, mask: Any, *, one_stream: bool = False):
  """Validated float32 confidences, correctness and optional bool mask [..., n].

  ``mask``: bool, integer or float (``nnx.metrics``' masks), broadcastable to
  the confidences' shape; ``mask != 0`` keeps a sample (:func:`_validation.mask`).
  It is returned as bool of the confidences' shape, so a 0/1 float mask gives
  exactly the boolean mask's state. With ``one_stream`` the leading axes are
  samples of one stream: [..., n] becomes [n'] (clu's and nnx's protocol,
  where every batch merges into one running state).

  Traced invalid values (integer correctness other than 0/1 included, checked
  before the cast to bool; a NaN or infinite mask entry) make the row's
  confidences NaN, which the state kernels record in ``invalid``. The states
  hold exact integer sums with no derivative: differentiating through
  ``from_batch`` raises ``TypeError``.
  """
  c = _validation.as_float_array(confidences, "confidences")
  k = _validation.correct_array(correct)
  _validation.check_same_leading_shape(c, k, "confidences", "correct")
  mask_rows = None
  if mask is not None:
    mask, mask_flag = _validation.mask(mask, c.shape, target="confidences.shape")
    if mask.dtype != jnp.bool_:
      mask = mask != 0
    if mask.shape != c.shape:
      mask = jnp.broadcast_to(mask, c.shape)
    if mask_flag is not None:  # an invalid entry, kept or not, marks its row (as in the losses)
      mask_rows = jnp.any(jnp.broadcast_to(mask_flag, c.shape), axis=-1)
  if one_stream and c.ndim > 1:
    c, k = c.reshape(-1), k.reshape(-1)
    mask = None if mask is None else mask.reshape(-1)
    mask_rows = None if mask_rows is None else jnp.any(mask_rows)
  if mask is not None:
    # Padding may hold anything; only the kept samples are checked and summed.
    c = jnp.where(mask, c, 0.0)
    k = jnp.where(mask, k, jnp.zeros((), k.dtype))
  invalid = _validation.either(_validation.check_samples(c, k), mask_rows)
  c = _validation.poison(c.astype(jnp.float32), rows=invalid)
  k = _validation.convert_correct(k)
  c = _validation.refuse_gradient(c, _NO_GRADIENT)
  k = _validation.refuse_gradient(k, _NO_GRADIENT)
  return c, k, mask


def _check_same(a: jax.Array, b: jax.Array, what: str) -> None:
  if a.shape != b.shape:
    raise ValueError(f"cannot merge states with different {what}: shapes {a.shape} and {b.shape}")
  if _validation.is_concrete(a, b) and not np.array_equal(np.asarray(a), np.asarray(b)):
    raise ValueError(f"cannot merge states built with different {what}")


def _sum_leading(x: jax.Array) -> jax.Array:
  return jnp.sum(x, axis=0)


_CAPACITY_TEXT = (
    "exact to 2^53 = 9.0e15 samples in total (per bucket or bin too): its merged integer sums "
    "would not fit")


def _empty_sums(shape: tuple) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(top, hi, lo) zeros, three buffers (a donated state must not hold one buffer twice)."""
  return tuple(jnp.zeros(shape, jnp.int32) for _ in range(3))


def _sealed(state: Any, top: jax.Array, hi: jax.Array, lo: jax.Array, over: jax.Array) -> dict:
  """The fields top, hi, lo of merged sums (``over``: some state is past capacity, which
  raises eagerly)."""
  if _validation.is_concrete(over) and bool(over):
    raise ValueError(f"{type(state).__name__}: the merged state is past its capacity; a state is "
                     f"{_CAPACITY_TEXT}")
  return dict(top=top, hi=hi, lo=lo)


def _marked(wide: tuple) -> tuple:
  top, hi, lo = _exact.seal(wide)
  return top, hi, lo, jnp.any(_exact.over_capacity(top))


@jax.jit
def _merge_sums(a: tuple, b: tuple) -> tuple:
  """One program for an eager merge's sums (a handful of small ops, one dispatch)."""
  return _marked(_exact.wide_add(a, b))


def _merged(a: Any, b: Any) -> dict:
  return _sealed(a, *_merge_sums((a.top, a.hi, a.lo), (b.top, b.hi, b.lo)))


def _reduced(state: Any, total: Callable) -> dict:
  return _sealed(state, *_marked(_exact.wide_reduce((state.top, state.hi, state.lo), total)))


@jax.jit
def _past_capacity(top: jax.Array, hi: jax.Array) -> jax.Array:
  """bool [...]: each state (sums [..., buckets, W]) is marked, or its column totals are past
  the capacity: ``_exact.seal``'s criterion, for states that in-place updates (which skip
  the full pass of a merge's seal) may have carried past it unmarked."""
  return _exact.over_capacity(_exact.seal((top, hi, hi))[0])


def _check_capacity(state: Any, *, columns: bool = False) -> None:
  """Raises ``ValueError`` for a concrete state past its capacity (merged under ``jit``);
  ``columns``: also one whose column totals are (:func:`_past_capacity`), for a state that
  in-place updates may have carried past it unmarked."""
  if not _validation.is_concrete(state.top):
    return
  over = _past_capacity(state.top, state.hi) if columns else _exact.over_capacity(state.top)
  if bool(np.any(np.asarray(over))):
    raise ValueError(f"{type(state).__name__}: past its capacity, so no metric can be computed; "
                     f"a state is {_CAPACITY_TEXT}")


def _clu_scalar(state: Any, value: jax.Array) -> Any:
  """``clu.values.Scalar(value)``, what clu's ``Metric.compute_value`` returns for a scalar.

  clu is imported here, not with the module: it is an optional dependency (the
  states follow its protocol without it). A state with batch axes has one value
  per batch row, which no writer takes as a scalar: ``reduce()`` it first.
  """
  if state.invalid.ndim:
    raise ValueError(f"{type(state).__name__}.compute_value needs a state without batch axes, "
                     f"got batch shape {state.invalid.shape}: reduce() it first")
  try:
    from clu import values  # pylint: disable=import-outside-toplevel
  except ModuleNotFoundError as e:
    if e.name != "clu":
      raise
    raise ModuleNotFoundError("compute_value is clu's protocol and returns a clu.values.Value: "
                              "pip install clu (or use compute())", name="clu") from None
  return values.Scalar(value)


def _configured(cls: type, **options: Any) -> type:
  """The subclass of the state class ``cls`` with class options ``options`` (one per options)."""
  return _configured_class(cls, tuple(sorted(options.items())))


@functools.lru_cache(maxsize=None)
def _configured_class(cls: type, options: tuple) -> type:
  namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
               "__doc__": cls.__doc__, **dict(options)}
  sub = dataclasses.dataclass(frozen=True)(type(cls.__name__, (cls,), namespace))
  fields = dataclasses.fields(sub)
  return jax.tree_util.register_dataclass(
      sub, data_fields=[f.name for f in fields if not f.metadata.get("static")],
      meta_fields=[f.name for f in fields if f.metadata.get("static")])


def _model_outputs(owner: str, confidences: Any, correct: Any, logits: Any, labels: Any,
                   probs: Any = None):
  """(confidences, correct) from ``confidences=``/``correct=``, else ``logits=``/``labels=``,
  else ``probs=``/``labels=``."""
  if confidences is not None or correct is not None:
    if confidences is None or correct is None:
      raise TypeError(f"{owner}.from_model_output needs both confidences= and correct= "
                      f"(got only {'confidences' if correct is None else 'correct'}=)")
    return confidences, correct
  if labels is not None and logits is not None:
    return _confidence.confidences_from_logits(logits, labels)
  if labels is not None and probs is not None:
    return _confidence.confidences_from_probs(probs, labels)
  raise TypeError(f"{owner}.from_model_output needs confidences= and correct=, "
                  "or logits= and labels= (or probs= and labels=)")
