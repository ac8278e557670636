"""Mergeable metric states: evaluate batch by batch, device by device, with exact results.

A *state* is a small immutable pytree of sufficient statistics. Build one per
batch with ``from_batch``, combine states with ``merge`` (or ``psum`` across
devices inside ``shard_map``, or ``reduce`` over a leading axis) and read the
metrics with ``compute``:

.. code-block:: python

  state = SweepState.empty(thresholds)
  for confidences, correct in batches:
    state = state.merge(SweepState.from_batch(confidences, correct, thresholds))
  result = state.compute()          # the same SweepResult as sweep(all data)

The sums inside :class:`SweepState` and :class:`CalibrationState` are exact
integers (``cwsa_jax._exact``: int32 digit sums carried in three limbs,
``top * 2^36 + hi * 4096 + lo``), so ``merge`` is exact integer addition:
associative, commutative, and any split of the data merged in any order gives
*bit for bit* the one-shot result. Every state is exact to 2^53 (9.0e15)
samples in total; past that, merging raises ``ValueError`` (under ``jit`` the
state is marked and ``compute`` gives NaN), never a wrapped number.

* :class:`SweepState`: per threshold bucket, the count and the digit sums of
  ``kappa``, ``u = 1 - c`` and ``u kappa``; ``compute`` gives the
  :class:`~cwsa_jax.SweepResult` of :func:`~cwsa_jax.sweep`.
* :class:`CalibrationState`: per equal-width bin, count, sum of ``kappa`` and
  of ``1 - c``; gives the ECE family and the reliability-diagram bins of
  :func:`~cwsa_jax.ece` / :func:`~cwsa_jax.calibration_bins` (``binning="width"``;
  equal-mass bins need every confidence and cannot stream).
* :class:`RiskCoverageState`: AURC and AUGRC (``"step"`` convention) need the
  samples in confidence order, which a fixed-size state cannot keep. It bins
  confidences on a log-odds-like grid of ``2^mantissa_bits`` bins per octave
  of ``c`` below 1/2 and of ``1 - c`` above it, treats each bin as a tie group,
  and also keeps each bin's smallest and largest confidence. Where every bin
  holds a single distinct value the estimate *is* the step-convention AURC;
  otherwise ``compute`` returns guaranteed lower and upper bounds (see
  :class:`BinnedRiskCoverage`).

Multi-device and multi-host: the states are plain arrays, so inside
``jax.shard_map`` each device builds the state of its shard and
``state.psum(axis_name)`` reduces them (an exact integer all-reduce). Nothing
here is device-specific: with ``jax.distributed.initialize()`` the same code
runs on every process of a multi-host GPU or TPU job, a mesh spans all
devices, and JAX's own collectives do the reduction. Calling
:func:`~cwsa_jax.sweep` on a sharded array gives the identical result too
(XLA partitions the computation). Where each process instead reads its own
files, :func:`process_merge` merges the states of all processes (one
all-reduce of the exact sums) and returns the global state on every process.

Inside a user's ``jit`` the value checks cannot raise; a batch with NaN or
out-of-range values marks the state invalid and ``compute`` returns NaN.

clu's ``Metric`` protocol: ``configure(...)`` returns a subclass holding the
options (thresholds, bins), whose ``empty()`` takes no arguments and whose
``from_model_output(**outputs)`` takes ``confidences=``/``correct=`` or
``logits=``/``labels=`` (optional ``mask=``, other outputs ignored), so a
``clu.metrics.Collection`` can hold the states:

.. code-block:: python

  Metrics = clu.metrics.Collection.create(
      sweep=SweepState.configure(thresholds=thresholds),
      ece=CalibrationState.configure(num_bins=15), aurc=RiskCoverageState)
  metrics = Metrics.empty()
  metrics = metrics.merge(Metrics.single_from_model_output(logits=logits, labels=labels))
  metrics.compute()  # {"sweep": SweepResult, "ece": ..., "aurc": BinnedRiskCoverage}

``cwsa_jax.nnx`` wraps the same states as ``flax.nnx`` metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _calibration
from cwsa_jax import _confidence
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax import _risk_coverage
from cwsa_jax import _sort
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation

__all__ = [
    "BinnedRiskCoverage",
    "CalibrationState",
    "EvaluationResult",
    "RiskCoverageState",
    "SweepState",
    "evaluate_batches",
    "process_merge",
]



def _batched(fn: Callable, ndim: int, in_axes) -> Callable:
  for _ in range(ndim):
    fn = jax.vmap(fn, in_axes=in_axes)
  return fn


_NO_GRADIENT = (
    "streaming states hold exact integer sums and have no derivative; differentiate "
    "cwsa_jax.sweep / cwsa / ece (exact almost everywhere) or soft_cwsa (relaxed) instead")


def _prepare_batch(confidences: Any, correct: Any, mask: Any):
  """Validated float32 confidences, correctness and optional bool mask [..., n].

  Traced invalid values (integer correctness other than 0/1 included, checked
  before the cast to bool) make the row's confidences NaN, which the state
  kernels record in ``invalid``. The states hold exact integer sums with no
  derivative: differentiating through ``from_batch`` raises ``TypeError``.
  """
  c = _validation.as_float_array(confidences, "confidences")
  k = _validation.correct_array(correct)
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise ValueError(f"mask must be boolean, got dtype {mask.dtype}")
    if mask.shape != c.shape:
      raise ValueError(f"mask shape {mask.shape} does not match confidences shape {c.shape}")
    # Padding may hold anything; only the kept samples are checked and summed.
    c = jnp.where(mask, c, 0.0)
    k = jnp.where(mask, k, jnp.zeros((), k.dtype))
  invalid = _validation.check_samples(c, k)
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


def _check_capacity(state: Any) -> None:
  """Raises ``ValueError`` for a concrete state past its capacity (merged under ``jit``)."""
  if _validation.is_concrete(state.top) and bool(np.any(np.asarray(
      _exact.over_capacity(state.top)))):
    raise ValueError(f"{type(state).__name__}: past its capacity, so no metric can be computed; "
                     f"a state is {_CAPACITY_TEXT}")


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


def _model_outputs(owner: str, confidences: Any, correct: Any, logits: Any, labels: Any):
  """(confidences, correct) from ``confidences=``/``correct=`` or else ``logits=``/``labels=``."""
  if confidences is not None or correct is not None:
    if confidences is None or correct is None:
      raise TypeError(f"{owner}.from_model_output needs both confidences= and correct= "
                      f"(got only {'confidences' if correct is None else 'correct'}=)")
    return confidences, correct
  if logits is None or labels is None:
    raise TypeError(f"{owner}.from_model_output needs confidences= and correct=, "
                    "or logits= and labels=")
  return _confidence.confidences_from_logits(logits, labels)


# --------------------------------------------------------------------------- sweep


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SweepState:
  """Exact sufficient statistics of :func:`~cwsa_jax.sweep` at fixed thresholds.

  With the thresholds sorted, bucket ``b`` holds the samples with exactly ``b``
  thresholds ``<= c``; the retained set of threshold ``j`` is the union of the
  buckets above ``j``, so the per-bucket sums

  .. math::

    N_b = |B_b|,\\quad A_b = \\sum_{B_b} \\kappa_i,\\quad U_b = \\sum_{B_b} (1 - c_i),
    \\quad V_b = \\sum_{B_b} (1 - c_i)\\kappa_i

  determine coverage, selective accuracy, CWSA and CWSA+ at every threshold
  (formulas in :func:`~cwsa_jax.sweep`). They are stored as exact integer
  digit sums, so :meth:`merge` is exact.

  Capacity: exact to 2^53 (9.0e15) samples in total, whatever their buckets.
  Past it :meth:`merge`, :meth:`reduce` and :meth:`psum` raise ``ValueError``
  eagerly, and under ``jit`` the state is marked (every ``top`` is -1, for
  good) and :meth:`compute` returns NaN; never a wrapped number.

  Attributes:
    thresholds: [T] float32 thresholds, in the order given.
    hi, lo, top: int32 [..., T + 1, W] exact per-bucket sums
      ``top * 2^36 + hi * 4096 + lo`` (``0 <= hi < 2^24``, ``0 <= lo < 4096``;
      W = 6 for boolean correctness, 12 for graded).
    invalid: bool [...]: some sample was NaN or outside [0, 1] (under ``jit``).

  Examples:
    >>> import numpy as np
    >>> c, ok = np.array([0.9, 0.6, 0.8, 0.55]), np.array([True, False, True, True])
    >>> t = np.array([0.5, 0.7])
    >>> s = SweepState.from_batch(c[:2], ok[:2], t).merge(SweepState.from_batch(c[2:], ok[2:], t))
    >>> print([round(float(x), 4) for x in s.compute().cwsa])  # == sweep(c, ok, t).cwsa
    [0.325, 0.5]
  """
  thresholds: jax.Array
  hi: jax.Array
  lo: jax.Array
  top: jax.Array
  invalid: jax.Array

  # Class options (not fields), set by configure().
  _thresholds = None
  _graded = False
  _normalize = "retained"

  @classmethod
  def configure(cls, *, thresholds: Any, graded: bool = False,
                normalize: str = "retained") -> type[SweepState]:
    """A subclass with fixed thresholds, for clu's ``Collection`` and ``cwsa_jax.nnx``.

    clu's ``Metric`` protocol: its :meth:`empty` takes no arguments,
    :meth:`from_model_output` builds the state of a batch from the model's
    outputs, :meth:`compute` uses ``normalize`` (as clu's
    ``Metric.from_output`` makes a configured class). The same options give
    the same class.

    Args:
      thresholds: [T] thresholds in [0, 1).
      graded: correctness is graded (kappa in [0, 1]); boolean correctness
        is then counted as 0/1. Default: boolean correctness.
      normalize: ``"retained"`` or ``"all"``, as in :func:`~cwsa_jax.sweep`.

    Examples:
      >>> Sweep = SweepState.configure(thresholds=[0.5, 0.7])
      >>> batch = Sweep.from_model_output(confidences=np.array([0.9, 0.6]),
      ...                                 correct=np.array([True, False]), loss=0.3)
      >>> print([round(float(x), 4) for x in Sweep.empty().merge(batch).compute().coverage])
      [1.0, 0.5]
    """
    t = np.asarray(_validation.as_thresholds(thresholds))
    _stats.check_normalize(normalize)
    return _configured(cls, _thresholds=tuple(t.tolist()), _graded=bool(graded),
                       _normalize=normalize)

  @classmethod
  def _class_thresholds(cls) -> np.ndarray:
    if cls._thresholds is None:
      raise TypeError(f"{cls.__name__} needs thresholds: pass them, or make a class that holds them "
                      "with SweepState.configure(thresholds=...)")
    return np.asarray(cls._thresholds, np.float32)

  @classmethod
  def empty(cls, thresholds: Any = None, *, graded: bool | None = None) -> SweepState:
    """The state of no samples (the identity of :meth:`merge`).

    ``thresholds`` and ``graded`` default to the class's (:meth:`configure`).
    """
    t = _validation.as_thresholds(cls._class_thresholds() if thresholds is None else thresholds)
    graded = cls._graded if graded is None else graded
    width = _stats.bucket_width(graded)
    top, hi, lo = _empty_sums((t.shape[0] + 1, width))
    return cls(t, hi, lo, top, jnp.zeros((), bool))

  @classmethod
  @_public.entry
  def from_batch(cls, confidences: Any, correct: Any, thresholds: Any = None, *,
                 mask: Any = None) -> SweepState:
    """The state of one batch [..., n] (leading axes are kept as batch axes of the state).

    Args:
      confidences: [..., n] confidences in [0, 1].
      correct: [..., n] boolean correctness or graded kappa in [0, 1].
      thresholds: [T] thresholds in [0, 1) (default: the class's, :meth:`configure`).
      mask: optional bool [..., n]; samples with False are ignored (padding).
    """
    t = _validation.as_thresholds(cls._class_thresholds() if thresholds is None else thresholds)
    c, k, mask = _prepare_batch(confidences, correct, mask)
    if cls._graded:
      k = k.astype(jnp.float32)
    fn = _batched(_sweep_state_1d, c.ndim - 1, (0, 0, None, None if mask is None else 0))
    hi, lo, invalid = fn(c, k, t, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(t, hi, lo, top, invalid)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, mask: Any = None, **_: Any) -> SweepState:
    """The state of one batch of model outputs at the class's thresholds (clu's protocol).

    Args:
      confidences, correct: [..., n] confidences and correctness, as in
        :meth:`from_batch`; or else
      logits, labels: [..., n, K] logits and [..., n] integer labels, turned
        into confidences by :func:`~cwsa_jax.confidences_from_logits`.
      mask: optional bool [..., n]; samples with False are ignored.
      **_: other model outputs (a loss, ...), ignored.
    """
    c, k = _model_outputs(cls.__name__, confidences, correct, logits, labels)
    return cls.from_batch(c, k, mask=mask)

  @property
  def graded(self) -> bool:
    return self.hi.shape[-1] == _stats.bucket_width(True)

  def merge(self, other: "SweepState") -> "SweepState":
    """The state of both sets of samples (exact integer addition)."""
    _check_same(self.thresholds, other.thresholds, "thresholds")
    _check_same(jnp.zeros(self.hi.shape[-1:]), jnp.zeros(other.hi.shape[-1:]),
                "correctness types (boolean vs graded)")
    return dataclasses.replace(self, **_merged(self, other), invalid=self.invalid | other.invalid)

  def reduce(self) -> "SweepState":
    """Merges the states stacked along the leading axis (e.g. from ``jax.vmap`` over batches)."""
    # Stacked with the sums (jax.vmap, clu's all_gather), the thresholds are repeated: keep one.
    t = self.thresholds[0] if self.thresholds.ndim > 1 else self.thresholds
    return dataclasses.replace(self, thresholds=t, **_reduced(self, _sum_leading),
                               invalid=jnp.any(self.invalid, axis=0))

  def psum(self, axis_name: Any) -> "SweepState":
    """All-reduces the state over a mapped axis (inside ``shard_map`` / ``pmap``)."""
    invalid = jax.lax.psum(self.invalid.astype(jnp.int32), axis_name) > 0
    return dataclasses.replace(self, **_reduced(self, lambda x: jax.lax.psum(x, axis_name)),
                               invalid=invalid)

  def compute(self, *, normalize: str | None = None) -> _sweep.SweepResult:
    """The :class:`~cwsa_jax.SweepResult` of every sample merged into this state.

    ``normalize`` (``"retained"`` or ``"all"``, see :func:`~cwsa_jax.sweep`)
    defaults to the class's, ``"retained"`` unless :meth:`configure` set it.
    A state with no samples gives coverage NaN (0/0), CWSA 0 and selective
    accuracy NaN.
    """
    normalize = type(self)._normalize if normalize is None else normalize
    _stats.check_normalize(normalize)
    _check_capacity(self)
    lead = self.hi.ndim - 2
    fn = _batched(_sweep_compute, lead, (None, 0, 0, 0, 0))
    return _stats.renormalize(fn(self.thresholds, self.hi, self.lo, self.top, self.invalid),
                              normalize)


@jax.jit
def _sweep_state_1d(c, k, thresholds, mask):
  _, sorted_thresh = _sweep.sorted_thresholds(thresholds)
  hi, lo = _sweep.bucket_sums(c, k, sorted_thresh, mask)
  return hi, lo, _stats.invalid_inputs(c, k)


@jax.jit
def _sweep_compute(thresholds, hi, lo, top, invalid):
  order, _ = _sweep.sorted_thresholds(thresholds)
  invalid = invalid | _exact.over_capacity(top)
  return _sweep.result_from_bucket_sums(hi, lo, thresholds, order, invalid, top)


# --------------------------------------------------------------------- calibration

_CAL_WIDTH = _stats.CALIBRATION_COLUMNS  # count, kappa digits, (1 - c) digits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CalibrationState:
  """Exact per-bin sums for the ECE family and reliability diagrams (equal-width bins).

  Per bin ``b`` (edges ``float32(j)/float32(B)``, last bin closed, as in
  :func:`~cwsa_jax.ece`): ``n_b``, ``A_b = sum kappa`` and ``U_b = sum (1 - c)``,
  so ``conf_b = 1 - U_b/n_b``, ``acc_b = A_b/n_b`` and the signed gap
  ``sum_b (c - kappa) = (n_b - A_b) - U_b``. The sums come from the same
  pipeline as :func:`~cwsa_jax.ece` (``_calibration.bin_sums``), so a state
  of all the data, however split and merged, computes the same values bit for
  bit.

  Capacity: exact to 2^53 (9.0e15) samples in total, as :class:`SweepState`;
  :meth:`bins` gives a bin's count as -1 from 2^31 samples (int32).

  Attributes:
    hi, lo, top: int32 [..., B, 6] exact per-bin sums
      ``top * 2^36 + hi * 4096 + lo`` (``_stats.CALIBRATION_COLUMNS``).
    invalid: bool [...].
  """
  hi: jax.Array
  lo: jax.Array
  top: jax.Array
  invalid: jax.Array

  # Class options (not fields), set by configure().
  _num_bins = 15
  _norm = "l1"

  @classmethod
  def configure(cls, *, num_bins: int = 15, norm: str = "l1") -> type[CalibrationState]:
    """A subclass with ``num_bins`` bins whose :meth:`compute` uses ``norm`` (clu's protocol).

    Its :meth:`empty` takes no arguments and :meth:`from_model_output` builds
    the state of a batch of model outputs; see :meth:`SweepState.configure`.
    """
    _calibration._check_options(num_bins, "width", norm)
    return _configured(cls, _num_bins=int(num_bins), _norm=norm)

  @classmethod
  def empty(cls, num_bins: int | None = None) -> CalibrationState:
    """The state of no samples; ``num_bins`` defaults to the class's (15 unless configured)."""
    num_bins = cls._num_bins if num_bins is None else num_bins
    _calibration._check_options(num_bins, "width")
    top, hi, lo = _empty_sums((int(num_bins), _CAL_WIDTH))
    return cls(hi, lo, top, jnp.zeros((), bool))

  @classmethod
  @_public.entry
  def from_batch(cls, confidences: Any, correct: Any, *, num_bins: int | None = None,
                 mask: Any = None) -> CalibrationState:
    """The state of one batch [..., n]; ``mask`` False marks padding."""
    num_bins = cls._num_bins if num_bins is None else num_bins
    _calibration._check_options(num_bins, "width")
    c, k, mask = _prepare_batch(confidences, correct, mask)
    fn = _batched(functools.partial(_calibration_state_1d, num_bins=int(num_bins)), c.ndim - 1,
                  (0, 0, None if mask is None else 0))
    hi, lo, invalid = fn(c, k, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(hi, lo, top, invalid)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, mask: Any = None, **_: Any) -> CalibrationState:
    """The state of one batch of model outputs (clu's protocol); see :meth:`SweepState.from_model_output`."""
    c, k = _model_outputs(cls.__name__, confidences, correct, logits, labels)
    return cls.from_batch(c, k, mask=mask)

  @property
  def num_bins(self) -> int:
    return self.hi.shape[-2]

  def merge(self, other: "CalibrationState") -> "CalibrationState":
    _check_same(jnp.zeros(self.hi.shape[-2:-1]), jnp.zeros(other.hi.shape[-2:-1]), "numbers of bins")
    return dataclasses.replace(self, **_merged(self, other), invalid=self.invalid | other.invalid)

  def reduce(self) -> "CalibrationState":
    return dataclasses.replace(self, **_reduced(self, _sum_leading),
                               invalid=jnp.any(self.invalid, axis=0))

  def psum(self, axis_name: Any) -> "CalibrationState":
    return dataclasses.replace(
        self, **_reduced(self, lambda x: jax.lax.psum(x, axis_name)),
        invalid=jax.lax.psum(self.invalid.astype(jnp.int32), axis_name) > 0)

  def compute(self, *, norm: str | None = None) -> jax.Array:
    """ECE (``"l1"``), RMS calibration error (``"l2"``) or MCE (``"max"``); see :func:`~cwsa_jax.ece`.

    ``norm`` defaults to the class's, ``"l1"`` unless :meth:`configure` set it.
    """
    norm = type(self)._norm if norm is None else norm
    _calibration._check_options(self.num_bins, "width", norm)
    _check_capacity(self)
    fn = _batched(functools.partial(_calibration_error, norm=norm), self.hi.ndim - 2,
                  (0, 0, 0, 0))
    return fn(self.hi, self.lo, self.top, self.invalid)

  def bins(self) -> _calibration.CalibrationBins:
    """The reliability-diagram bins (:class:`~cwsa_jax.CalibrationBins`)."""
    _check_capacity(self)
    fn = _batched(_calibration_bins, self.hi.ndim - 2, (0, 0, 0, 0))
    return fn(self.hi, self.lo, self.top, self.invalid)


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _calibration_state_1d(c, k, mask, *, num_bins):
  hi, lo = _calibration.bin_sums(c, k, _calibration.width_edges(num_bins), mask)
  return hi, lo, _stats.invalid_inputs(c, k)


@functools.partial(jax.jit, static_argnames=("norm",))
def _calibration_error(hi, lo, top, invalid, *, norm):
  value = _calibration.error_from_totals(_stats.calibration_totals(hi, lo, top), norm)
  return jnp.where(invalid | _exact.over_capacity(top), jnp.nan, value)


@jax.jit
def _calibration_bins(hi, lo, top, invalid):
  invalid = invalid | _exact.over_capacity(top)
  bins = _calibration.bins_from_totals(_calibration.width_edges(hi.shape[0]),
                                       _calibration.exact_count(hi, lo, top),
                                       _stats.calibration_totals(hi, lo, top))
  return bins._replace(mean_confidence=jnp.where(invalid, jnp.nan, bins.mean_confidence),
                       accuracy=jnp.where(invalid, jnp.nan, bins.accuracy))


# ------------------------------------------------------------------ risk-coverage

_HALF_BITS = 0x3F000000  # int32 bit pattern of 0.5f
_KEY_MAX = 2 * _HALF_BITS  # key of c = 1
_EMPTY_MIN = np.iinfo(np.int32).max
_RC_WIDTH = _stats.LOSS_COLUMNS  # count, loss digits


class BinnedRiskCoverage(NamedTuple):
  """AURC and AUGRC ("step" convention) from a :class:`RiskCoverageState`.

  Sort the bins by decreasing confidence; bin ``b`` has ``m_b`` samples with
  total loss ``e_b`` (errors, or ``sum 1 - kappa``), ``K_b`` samples and loss
  ``E_b`` in the bins above it. Treating each bin as one tie group gives

  .. math::

    \\widehat{\\mathrm{AURC}} = \\frac{1}{n}\\sum_b m_b \\frac{E_b + e_b}{K_b + m_b},\\qquad
    \\widehat{\\mathrm{AUGRC}} = \\frac{1}{n^2}\\sum_b m_b (E_b + e_b),

  which equals the step-convention value exactly when every bin holds one
  distinct confidence. For a bin with several distinct confidences, whatever
  their order and ties, each of its samples contributes a group-end risk in
  ``[E_b / (K_b + m_b), min(1, (E_b + e_b) / (K_b + 1))]`` (and a generalized
  risk in ``[E_b, E_b + e_b] / n``); summing these gives ``low`` and ``high``,
  guaranteed bounds on the exact value (up to float32 rounding).

  Attributes:
    aurc, aurc_low, aurc_high, augrc, augrc_low, augrc_high: float32 [...].
    exact: bool [...], every non-empty bin holds a single distinct confidence
      (then low = estimate = high).
  """
  aurc: jax.Array
  aurc_low: jax.Array
  aurc_high: jax.Array
  augrc: jax.Array
  augrc_low: jax.Array
  augrc_high: jax.Array
  exact: jax.Array


def confidence_key(c: jax.Array) -> jax.Array:
  """An int32 key, strictly increasing in ``c`` in [0, 1], fine near 0 and near 1.

  ``bits(c)`` below 1/2 and ``2 bits(1/2) - bits(1 - c)`` from 1/2 up (``1 - c``
  is exact there), where ``bits`` is the float32 bit pattern, so the key
  resolves ``c`` and ``1 - c`` to full float32 precision.
  """
  c = _sort.clip_unit(c)
  low = jax.lax.bitcast_convert_type(c, jnp.int32)  # _sort.float_key of the clipped c
  high = _KEY_MAX - jax.lax.bitcast_convert_type(jnp.float32(1.0) - c, jnp.int32)
  return jnp.where(c < 0.5, low, high)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RiskCoverageState:
  """Binned statistics for streaming AURC / AUGRC with guaranteed error bounds.

  Bins are ``confidence_key(c) >> (23 - mantissa_bits)``: ``2^mantissa_bits``
  bins per octave of ``c`` (below 1/2) or of ``1 - c`` (above), i.e. a relative
  resolution of ``2^-mantissa_bits`` in the error rate ``1 - c`` of confident
  predictions. Default 8: 64,513 bins. Per bin: the count and the exact digit
  sums of the loss ``1 - kappa`` (``hi``, ``lo``: 2 x 4 int32), and the
  smallest and largest key seen (to know whether the bin is one tie group):
  40 bytes a bin, about 2.6 MB of state at the default.

  ``python benchmarks/streaming_aurc_error.py`` measures the estimate's error
  and the bound width against the exact AURC, per ``mantissa_bits``.

  Capacity: exact sums to 2^53 (9.0e15) samples in total, as :class:`SweepState`.

  Attributes:
    hi, lo, top: int32 [..., bins, 4] (``_stats.loss_columns``, as
      ``top * 2^36 + hi * 4096 + lo``); key_min, key_max: int32 [..., bins];
    invalid: bool [...]; mantissa_bits: static int.
  """
  hi: jax.Array
  lo: jax.Array
  top: jax.Array
  key_min: jax.Array
  key_max: jax.Array
  invalid: jax.Array
  mantissa_bits: int = dataclasses.field(default=8, metadata=dict(static=True))

  # Class option (not a field), set by configure().
  _mantissa_bits = 8

  @classmethod
  def configure(cls, *, mantissa_bits: int = 8) -> type[RiskCoverageState]:
    """A subclass whose bins have ``mantissa_bits`` (clu's protocol; see :meth:`SweepState.configure`).

    The unconfigured class already follows the protocol with the default 8 bits.
    """
    _num_rc_bins(mantissa_bits)
    return _configured(cls, _mantissa_bits=int(mantissa_bits))

  @classmethod
  def empty(cls, *, mantissa_bits: int | None = None) -> RiskCoverageState:
    """The state of no samples; ``mantissa_bits`` defaults to the class's (8 unless configured)."""
    mantissa_bits = cls._mantissa_bits if mantissa_bits is None else mantissa_bits
    bins = _num_rc_bins(mantissa_bits)
    top, hi, lo = _empty_sums((bins, _RC_WIDTH))
    return cls(hi, lo, top, jnp.full((bins,), _EMPTY_MIN, jnp.int32),
               jnp.full((bins,), -1, jnp.int32), jnp.zeros((), bool), mantissa_bits)

  @classmethod
  @_public.entry
  def from_batch(cls, confidences: Any, correct: Any, *, mantissa_bits: int | None = None,
                 mask: Any = None) -> RiskCoverageState:
    """The state of one batch [..., n]; ``mask`` False marks padding."""
    mantissa_bits = cls._mantissa_bits if mantissa_bits is None else mantissa_bits
    _num_rc_bins(mantissa_bits)
    c, k, mask = _prepare_batch(confidences, correct, mask)
    fn = _batched(functools.partial(_rc_state_1d, mantissa_bits=mantissa_bits), c.ndim - 1,
                  (0, 0, None if mask is None else 0))
    hi, lo, key_min, key_max, invalid = fn(c, k, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(hi, lo, top, key_min, key_max, invalid, mantissa_bits)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, mask: Any = None, **_: Any) -> RiskCoverageState:
    """The state of one batch of model outputs (clu's protocol); see :meth:`SweepState.from_model_output`."""
    c, k = _model_outputs(cls.__name__, confidences, correct, logits, labels)
    return cls.from_batch(c, k, mask=mask)

  def merge(self, other: "RiskCoverageState") -> "RiskCoverageState":
    if other.mantissa_bits != self.mantissa_bits:
      raise ValueError("cannot merge states with different mantissa_bits: "
                       f"{self.mantissa_bits} and {other.mantissa_bits}")
    return dataclasses.replace(
        self, **_merged(self, other), key_min=jnp.minimum(self.key_min, other.key_min),
        key_max=jnp.maximum(self.key_max, other.key_max), invalid=self.invalid | other.invalid)

  def reduce(self) -> "RiskCoverageState":
    return dataclasses.replace(self, **_reduced(self, _sum_leading),
                               key_min=jnp.min(self.key_min, axis=0),
                               key_max=jnp.max(self.key_max, axis=0),
                               invalid=jnp.any(self.invalid, axis=0))

  def psum(self, axis_name: Any) -> "RiskCoverageState":
    return dataclasses.replace(
        self, **_reduced(self, lambda x: jax.lax.psum(x, axis_name)),
        key_min=jax.lax.pmin(self.key_min, axis_name),
        key_max=jax.lax.pmax(self.key_max, axis_name),
        invalid=jax.lax.psum(self.invalid.astype(jnp.int32), axis_name) > 0)

  def compute(self) -> BinnedRiskCoverage:
    _check_capacity(self)
    fn = _batched(_rc_compute, self.hi.ndim - 2, (0, 0, 0, 0, 0, 0))
    return fn(self.hi, self.lo, self.top, self.key_min, self.key_max, self.invalid)


def _num_rc_bins(mantissa_bits: Any) -> int:
  if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, (int, np.integer)) \
      or not 0 <= mantissa_bits <= 12:
    raise ValueError(f"mantissa_bits must be an int in [0, 12], got {mantissa_bits!r}")
  return (_KEY_MAX >> (23 - int(mantissa_bits))) + 1


@functools.partial(jax.jit, static_argnames=("mantissa_bits",))
def _rc_state_1d(c, k, mask, *, mantissa_bits):
  bins = _num_rc_bins(mantissa_bits)
  key = confidence_key(c)
  ids = key >> (23 - mantissa_bits)
  seg = ids if mask is None else jnp.where(mask, ids, bins)  # padding: dropped

  def columns_fn(cid, kappa):
    return cid, jnp.stack(_stats.loss_columns(kappa), axis=0)

  hi, lo = _exact.segment_sums(columns_fn, [seg, k], bins, counted=True)
  key_min = jax.ops.segment_min(key, seg, num_segments=bins)  # empty: int32 max
  key_max = jnp.maximum(jax.ops.segment_max(key, seg, num_segments=bins), -1)
  return hi, lo, key_min, key_max, _stats.invalid_inputs(c, k)


@jax.jit
def _rc_compute(hi, lo, top, key_min, key_max, invalid):
  # Suffix sums over ascending bins = totals of the bins at or above each bin.
  wide = (top, hi, lo)
  above = _exact.wide_suffix_sums(wide)
  m, e = _stats.loss_totals(hi, lo, top)
  k_incl, e_incl = _stats.loss_totals(above[1], above[2], above[0])
  # The bins strictly above, exactly (integer difference, rounded once).
  excl = _exact.wide_sub(above, wide)
  k_excl, e_excl = _stats.loss_totals(excl[1], excl[2], excl[0])
  invalid = invalid | _exact.over_capacity(top)
  n = k_incl[0]
  nonempty = m > 0
  safe_k = jnp.where(nonempty, k_incl, 1.0)
  tie = m * e_incl / safe_k
  low = m * e_excl / safe_k
  high = m * jnp.minimum(1.0, e_incl / (k_excl + 1.0))
  single = key_min == key_max
  low = jnp.where(single, tie, low)
  high = jnp.where(single, tie, high)
  where = lambda x: jnp.where(nonempty, x, 0.0)
  g_tie, g_low = m * e_incl, jnp.where(single, m * e_incl, m * e_excl)
  bad = invalid | (n == 0)
  fin = lambda x: jnp.where(bad, jnp.nan, x)
  (aurc, augrc), (aurc_low, augrc_low), (aurc_high, augrc_high) = (
      _risk_coverage.areas(jnp.sum(where(a)), jnp.sum(where(g)), n)
      for a, g in ((tie, g_tie), (low, g_low), (high, g_tie)))
  return BinnedRiskCoverage(
      aurc=fin(aurc), aurc_low=fin(aurc_low), aurc_high=fin(aurc_high),
      augrc=fin(augrc), augrc_low=fin(augrc_low), augrc_high=fin(augrc_high),
      exact=jnp.all(single | ~nonempty) & ~bad)


# ------------------------------------------------------------------ evaluation loop


class EvaluationResult(NamedTuple):
  """What :func:`evaluate_batches` accumulates (states and their computed metrics)."""
  sweep: _sweep.SweepResult
  ece: jax.Array
  calibration_bins: _calibration.CalibrationBins
  risk_coverage: BinnedRiskCoverage
  num_samples: int
  states: tuple


def evaluate_batches(batches: Iterable, thresholds: Any, *, num_bins: int = 15,
                     mantissa_bits: int = 8, total: int | None = None,
                     progress: bool = True) -> EvaluationResult:
  """Accumulates the sweep, calibration and risk-coverage states over batches.

  Every batch is ``(confidences, correct)`` with shape [b] each (NumPy or JAX
  arrays). Batches smaller than the first are padded to its size with a mask,
  so a ragged last batch costs no recompilation. Shows a progress bar
  with ``total`` batches when known if ``tqdm`` is installed (it is optional:
  in the ``[train]`` extra, not in the core install); else none.

  Returns:
    :class:`EvaluationResult` whose ``sweep`` equals :func:`~cwsa_jax.sweep` on
    the concatenated batches bit for bit, ``ece`` equals
    :func:`~cwsa_jax.ece` (``binning="width"``) and ``risk_coverage`` holds the
    binned AURC / AUGRC with bounds.
  """
  t = _validation.as_thresholds(thresholds)
  states = None
  size = None
  count = 0
  bar = _progress_bar(total, progress)
  try:
    for index, batch in enumerate(batches):
      try:
        confidences, correct = batch
      except (TypeError, ValueError):
        raise ValueError(f"batch {index} is not a (confidences, correct) pair") from None
      c = np.asarray(confidences)
      k = np.asarray(correct)
      if c.ndim != 1 or k.shape != c.shape:
        raise ValueError(f"batch {index}: confidences and correct must be 1-D of equal length, "
                         f"got shapes {c.shape} and {k.shape}")
      if c.shape[0] == 0:
        continue
      if size is None or c.shape[0] > size:
        size = c.shape[0]
      pad = size - c.shape[0]
      mask = np.concatenate([np.ones(c.shape[0], bool), np.zeros(pad, bool)])
      c = np.concatenate([c, np.zeros(pad, c.dtype)])
      k = np.concatenate([k, np.zeros(pad, k.dtype)])
      try:
        batch_states = (SweepState.from_batch(c, k, t, mask=mask),
                        CalibrationState.from_batch(c, k, num_bins=num_bins, mask=mask),
                        RiskCoverageState.from_batch(c, k, mantissa_bits=mantissa_bits, mask=mask))
      except ValueError as err:
        raise ValueError(f"batch {index}: {err}") from None
      states = batch_states if states is None else tuple(
          a.merge(b) for a, b in zip(states, batch_states))
      count += int(mask.sum())
      if bar is not None:
        bar.update(1)
        bar.set_postfix(samples=count)
  finally:
    if bar is not None:
      bar.close()
  if states is None:
    raise ValueError("no samples: every batch was empty")
  sweep_state, cal_state, rc_state = states
  return EvaluationResult(sweep_state.compute(), cal_state.compute(), cal_state.bins(),
                          rc_state.compute(), count, states)


def _progress_bar(total: int | None, enabled: bool):
  if not enabled:
    return None
  try:
    from tqdm.auto import tqdm
  except ImportError:  # tqdm is optional (not a core dependency): no progress bar
    return None
  return tqdm(total=total, desc="evaluate", unit="batch", leave=False)


# ------------------------------------------------------------------ many processes

_MERGEABLE = (SweepState, CalibrationState, RiskCoverageState)
_DESCRIPTION_BYTES = 256
_DIGEST_BYTES = 32
_PROCESS_AXIS = "processes"
_OK, _NOT_A_STATE, _ALREADY_GLOBAL = 0, 1, 2


def process_merge(state: Any) -> Any:
  """Merges a state over every process of a ``jax.distributed`` job; each process gets the total.

  Each of the ``P`` processes passes the state of its own share of the data
  (its files, its batches); every process gets back the state of all of them,

  .. math::

    S = S_0 \\oplus S_1 \\oplus \\cdots \\oplus S_{P-1},

  where :math:`\\oplus` is the state's :meth:`~SweepState.merge`: exact integer
  addition of the sums (and min / max of the key ranges of a
  :class:`RiskCoverageState`). So ``process_merge(state).compute()`` equals
  one process's result on all the data *bit for bit*, however the data was
  split. The states are exchanged with one all-reduce of the state's
  :meth:`~SweepState.reduce` over one device per process (XLA's collectives:
  NCCL / ICI on GPU / TPU hosts, gloo over TCP on CPU), so each process sends
  and receives about twice the state's bytes, whatever ``n`` and ``P``.

  Every process must call it (it is a collective), in the same order for
  several states. Before exchanging anything it checks that every process is
  alive and passed a state of the same type and configuration (thresholds,
  correctness type, number of bins, mantissa bits, batch shape), and raises on
  every process otherwise. With one process it returns ``state`` unchanged.

  A process that died before the merge is named in a ``RuntimeError`` on the
  others once JAX's coordination service sees it gone: at once for a clean
  exit, after ``heartbeat_timeout_seconds`` (an argument of
  :func:`jax.distributed.initialize`) for a crash. This needs
  ``jax.config.update("jax_enable_recoverability", True)`` before
  :func:`jax.distributed.initialize`; without it the coordination service
  itself terminates every process when it notices the death (an abort whose
  log names the task that stopped sending heartbeats). A process that dies
  during the exchange makes the others raise ``RuntimeError`` (gloo: at once
  once connected, else within its 30 s rendezvous timeout).

  Args:
    state: this process's :class:`SweepState`, :class:`CalibrationState` or
      :class:`RiskCoverageState` (leading batch axes allowed), built on its
      own devices.

  Returns:
    The merged state, of the same class and shapes, on this process's first
    local device.

  Raises:
    TypeError: some process passed something that is not such a state.
    ValueError: some process passed a state of another type or configuration,
      or one that already spans several processes (merged already).
    RuntimeError: some process died before or during the merge.

  Examples:
    >>> s = SweepState.from_batch(np.array([0.9, 0.6]), np.array([True, False]), [0.5, 0.7])
    >>> process_merge(s) is s  # one process: nothing to merge
    True
  """
  kind, digest, description = _merge_signature(state)
  count = jax.process_count()
  if count == 1:
    if kind != _OK:
      error = TypeError if kind == _NOT_A_STATE else ValueError
      raise error("process_merge needs a SweepState, CalibrationState or RiskCoverageState; "
                  f"got {description}")
    return state
  _check_processes_alive(count)
  _check_same_signature(kind, digest, description, count)
  return _all_reduce_over_processes(state, count)


def _merge_signature(state: Any) -> tuple[int, bytes, str]:
  """(kind, digest, description): processes may merge their states only if the digests are equal."""
  name = type(state).__name__
  if not isinstance(state, _MERGEABLE):
    return _NOT_A_STATE, b"", f"a {name}, not a SweepState, CalibrationState or RiskCoverageState"
  leaves = jax.tree_util.tree_leaves(state)
  if not all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves):
    return _ALREADY_GLOBAL, b"", (f"a {name} whose arrays already span several processes "
                                  "(a global array: the state is merged already)")
  lead = state.invalid.shape
  batch = f", batch shape {lead}" if lead else ""
  if isinstance(state, SweepState):
    t = np.asarray(state.thresholds, np.float32).reshape(-1, state.thresholds.shape[-1])[0]
    t_hash = hashlib.sha256(t.tobytes()).hexdigest()[:8]
    shown = (", ".join(f"{x:.6g}" for x in t) if len(t) <= 6
             else f"{t[0]:.6g} ... {t[-1]:.6g}, sha256 {t_hash}")
    kind_of = "graded" if state.graded else "boolean"
    description = (f"SweepState({len(t)} thresholds [{shown}], {kind_of} correctness, "
                   f"normalize={type(state)._normalize!r}{batch})")
    extra = t.tobytes()
  elif isinstance(state, CalibrationState):
    description = f"CalibrationState(num_bins={state.num_bins}, norm={type(state)._norm!r}{batch})"
    extra = b""
  else:
    description = f"RiskCoverageState(mantissa_bits={state.mantissa_bits}{batch})"
    extra = b""
  shapes = repr([(np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
                 for leaf in leaves])
  digest = hashlib.sha256(description.encode() + shapes.encode() + extra).digest()
  return _OK, digest, description


def _distributed_client():
  """The ``jax.distributed`` client of this process, or None (JAX keeps it private)."""
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    return distributed.global_state.client
  except (ImportError, AttributeError):
    return None


def _check_processes_alive(count: int) -> None:
  """Waits for every live process to arrive here; raises naming the processes that are gone."""
  client = _distributed_client()
  if client is None or not hasattr(client, "get_live_nodes"):
    return
  try:
    # A barrier over the live processes that returns the same live set to all of them.
    live = client.get_live_nodes(list(range(count)))
  except Exception as err:  # the coordination service (hosted by process 0) is gone
    raise RuntimeError("process_merge: lost the jax.distributed coordinator (process 0); nothing "
                       f"was merged ({err})") from err
  dead = sorted(set(range(count)) - set(int(p) for p in live))
  if dead:
    names = ", ".join(str(p) for p in dead)
    raise RuntimeError(
        f"process_merge: process{'es' if len(dead) > 1 else ''} {names} of {count} died before the "
        "merge (exited, crashed or stopped sending heartbeats); nothing was merged")


def _check_same_signature(kind: int, digest: bytes, description: str, count: int) -> None:
  """Exchanges the signatures of the states (a few hundred bytes per process) and compares them."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  text = description.encode()[:_DESCRIPTION_BYTES].ljust(_DESCRIPTION_BYTES, b"\0")
  row = np.frombuffer(bytes([kind]) + digest.ljust(_DIGEST_BYTES, b"\0") + text, np.uint8)
  try:
    rows = np.asarray(multihost_utils.process_allgather(row))
  except Exception as err:
    raise _exchange_failed(err) from err
  kinds = rows[:, 0]
  digests = [r[1:1 + _DIGEST_BYTES].tobytes() for r in rows]
  said = [r[1 + _DIGEST_BYTES:].tobytes().rstrip(b"\0").decode(errors="replace") for r in rows]
  for bad_kind, error in ((_NOT_A_STATE, TypeError), (_ALREADY_GLOBAL, ValueError)):
    bad = [p for p in range(count) if kinds[p] == bad_kind]
    if bad:
      raise error(f"process_merge: process {bad[0]} passed {said[bad[0]]}"
                  + (f" (so did processes {bad[1:]})" if len(bad) > 1 else ""))
  odd = [p for p in range(count) if digests[p] != digests[0]]
  if odd:
    raise ValueError(
        f"process_merge: process {odd[0]} passed {said[odd[0]]} but process 0 passed {said[0]}"
        + (f" (processes {odd} differ from process 0)" if len(odd) > 1 else "")
        + "; every process must pass a state of the same type and configuration")


def _exchange_failed(err: Exception) -> RuntimeError:
  return RuntimeError(
      "process_merge: exchanging the states between processes failed, most likely because a "
      f"process died or lost its connection during the merge; nothing was merged ({err})")


@functools.lru_cache(maxsize=None)
def _process_reducer(devices: tuple) -> tuple[jax.sharding.Mesh, Callable]:
  mesh = jax.sharding.Mesh(np.array(devices), (_PROCESS_AXIS,))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return mesh, jax.jit(lambda stacked: stacked.reduce(), out_shardings=replicated)


def _all_reduce_over_processes(state: Any, count: int) -> Any:
  """The state's ``reduce`` over a [P, ...] stack sharded one row per process (an all-reduce)."""
  devices = tuple(jax.local_devices(process_index=p)[0] for p in range(count))
  mesh, reduce = _process_reducer(devices)
  local = devices[jax.process_index()]
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(_PROCESS_AXIS))

  def stack(leaf):
    row = jax.device_put(np.asarray(leaf)[None], local)
    return jax.make_array_from_single_device_arrays((count,) + row.shape[1:], rows, [row])

  stacked = jax.tree.map(stack, state)
  try:
    merged = jax.block_until_ready(reduce(stacked))
  except Exception as err:
    raise _exchange_failed(err) from err
  return jax.tree.map(lambda x: x.addressable_data(0), merged)
