"""The exact mergeable state of :func:`~cwsa_jax.sweep` (:class:`SweepState`) and its kernels.

Concrete float64 confidences (NumPy arrays, lists of Python floats, JAX arrays
under ``jax_enable_x64``), and the maxima of concrete float64 probabilities, are
compared with the thresholds in float64 as :func:`~cwsa_jax.sweep` compares
them: each is replaced on the host by the float32 stand-in of
``_threshold_order`` (:func:`float64_kept`) before the state's kernels round
their input to float32. Inside ``jit`` the inputs are float32 already: nothing
changes there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _threshold_order
from cwsa_jax import _validation
from cwsa_jax._states._common import _batched
from cwsa_jax._states._common import _check_capacity
from cwsa_jax._states._common import _check_same
from cwsa_jax._states._common import _clu_scalar
from cwsa_jax._states._common import _configured
from cwsa_jax._states._common import _empty_sums
from cwsa_jax._states._common import _merged
from cwsa_jax._states._common import _model_outputs
from cwsa_jax._states._common import _prepare_batch
from cwsa_jax._states._common import _reduced
from cwsa_jax._states._common import _sum_leading
from cwsa_jax._states._common import public


def float64_kept(confidences: Any, mask: Any,
                 stand_ins_of: Callable[[np.ndarray], np.ndarray | None]) -> Any:
  """``confidences`` [..., n] with concrete float64 values replaced by float32 stand-ins.

  ``stand_ins_of(c64)`` maps the float64 confidences (every entry in [0, 1]) to their
  stand-ins (``_threshold_order``), or None to leave them. Entries that ``mask`` drops are
  taken as 0 first (padding may hold anything; the state ignores them). Anything else
  (float32 and narrower, tracers, input the checks refuse) is returned as it is.
  """
  if isinstance(confidences, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
    return confidences
  if isinstance(confidences, (np.ndarray, jax.Array, np.generic)):
    dtype = np.dtype(confidences.dtype)
    if dtype.kind != "f" or dtype.itemsize <= 4:  # no copy of the usual float32 arrays
      return confidences
  c = confidences
  if mask is not None:
    try:
      c = np.asarray(c)
      c = np.where(np.broadcast_to(np.asarray(mask) != 0, c.shape), c, c.dtype.type(0))
    except (TypeError, ValueError):  # the checks name the problem
      return confidences
  c64 = _threshold_order.wide_floats(c)
  if c64 is None:
    return confidences
  new = stand_ins_of(c64)
  if new is None:
    return confidences
  if isinstance(confidences, jax.Array):  # back where it was (device, sharding)
    new = jax.device_put(new, confidences.sharding)
  return new


def float64_outputs(confidences: Any, correct: Any, logits: Any, labels: Any,
                    probs: Any, predictions: tuple[Any, Any]) -> tuple[Any, Any]:
  """The (confidences, correct) of model outputs, float64 where the probabilities are.

  ``predictions``: what ``_model_outputs`` made of them (checked). For concrete float64
  ``probs`` [..., n, K] (the outputs it read), the float64 maximum and ``argmax == label``
  in float64, so the confidences keep their value (the thresholds then compare them in
  float64) and float32 ties do not pick the class; anything else: ``predictions``.
  """
  if confidences is not None or correct is not None or labels is None or probs is None \
      or logits is not None or isinstance(labels, jax.core.Tracer):
    return predictions
  p64 = _threshold_order.wide_floats(probs)
  if p64 is None or p64.ndim < 2:
    return predictions
  return p64.max(axis=-1), p64.argmax(axis=-1) == np.asarray(labels)


@public
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

  Concrete float64 confidences (and probabilities, in :meth:`from_model_output`)
  are compared with the thresholds in float64, as :func:`~cwsa_jax.sweep`
  compares them (float32 stand-ins, at most one ulp away): the state of
  ``c = [0.5 - 1e-9]`` retains nothing at ``tau = 0.5``. The thresholds keep
  the value they were given in (a Python float its float64 value; the
  ``thresholds`` field is float32). Inside ``jit`` the inputs are float32
  already, so nothing changes there.

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
  _metric = None  # set by at(): compute() gives this SweepResult field at the one threshold
  # Array fields that configure() fixes for every state of the class (cwsa_jax.nnx keeps
  # them out of its metric's variables).
  _CONFIGURED_FIELDS = ("thresholds",)

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
      thresholds: [T] thresholds in [0, 1), kept in the precision given: float64
        confidences are compared with a Python float's float64 value, as in
        ``sweep(c, kappa, thresholds)``.
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
    t = _given_thresholds(thresholds)
    _stats.check_normalize(normalize)
    return _configured(cls, _thresholds=t, _graded=bool(graded),
                       _normalize=normalize, _metric=None)

  @classmethod
  def at(cls, tau: float, *, metric: str = "cwsa", graded: bool = False,
         normalize: str = "retained") -> type[SweepState]:
    """A configured class of one threshold whose :meth:`compute` is one scalar: a clu metric.

    Its states are :class:`SweepState` s of the single threshold ``tau``
    (:meth:`configure` with ``thresholds=[tau]``) and merge as such, but
    :meth:`compute` returns the float32 scalar ``sweep(c, kappa, [tau]).<metric>[0]``
    (``[...]`` with batch axes), bit for bit, and :meth:`compute_value` its
    ``clu.values.Scalar``: what clu's ``Collection.compute_values()`` and
    ``clu.metric_writers.write_values`` take. One class per options, so several
    in one ``Collection`` (``cwsa_50=SweepState.at(0.5), cwsa_90=SweepState.at(0.9)``)
    each hold a state of one threshold.

    Args:
      tau: the threshold, in [0, 1).
      metric: the :class:`~cwsa_jax.SweepResult` field: ``"cwsa"`` (default),
        ``"cwsa_plus"``, ``"coverage"`` or ``"selective_accuracy"``.
      graded, normalize: as in :meth:`configure`.

    Examples:
      >>> Cwsa = SweepState.at(0.5)
      >>> state = Cwsa.empty().merge(Cwsa.from_model_output(
      ...     confidences=np.array([0.9, 0.6, 0.8, 0.55]), correct=np.array([1, 0, 1, 1])))
      >>> print(round(float(state.compute()), 4))  # == cwsa(c, ok, 0.5)
      0.325

      In a clu ``Collection`` (clu is optional: this example needs it):

      >>> import pytest; clu_metrics = pytest.importorskip("clu.metrics")
      >>> Metrics = clu_metrics.Collection.create(
      ...     cwsa=SweepState.at(0.5), coverage=SweepState.at(0.5, metric="coverage"),
      ...     ece=CalibrationState.configure(num_bins=10), aurc=RiskCoverageState)
      >>> logits = np.array([[2.0, 0.0], [0.3, 0.1], [0.0, 1.5]], np.float32)
      >>> metrics = Metrics.empty().merge(Metrics.single_from_model_output(
      ...     logits=logits, labels=np.array([0, 1, 1]), loss=0.7))
      >>> values = metrics.compute_values()  # {name: clu.values.Scalar}: for write_values
      >>> print({name: round(float(v.value), 4) for name, v in sorted(values.items())})
      {'aurc': 0.1111, 'coverage': 1.0, 'cwsa': 0.4324, 'ece': 0.2838}
    """
    if metric not in _sweep.METRIC_FIELDS:
      raise ValueError(f"metric must be one of {', '.join(map(repr, _sweep.METRIC_FIELDS))}, "
                       f"got {metric!r}")
    t = _given_thresholds([tau])
    _stats.check_normalize(normalize)
    return _configured(cls, _thresholds=t, _graded=bool(graded),
                       _normalize=normalize, _metric=metric)

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
  def from_batch(cls, confidences: Any, correct: Any, thresholds: Any = None, *,
                 mask: Any = None) -> SweepState:
    """The state of one batch [..., n] (leading axes are kept as batch axes of the state).

    Args:
      confidences: [..., n] confidences in [0, 1].
      correct: [..., n] boolean correctness or graded kappa in [0, 1].
      thresholds: [T] thresholds in [0, 1) (default: the class's, :meth:`configure`).
      mask: optional bool, integer or float array broadcastable to [..., n]
        (as ``nnx.metrics`` takes it); a sample whose entry is 0 is ignored
        (padding), any other value keeps it. A NaN or infinite entry raises
        ``ValueError`` (under ``jit``: the state is invalid, ``compute`` NaN).

    Concrete float64 confidences are compared with the thresholds in float64
    (see the class); two distinct thresholds that float32 merges with a
    confidence between them raise ``ValueError``, as in :func:`~cwsa_jax.sweep`.
    """
    confidences = cls._kept(confidences, thresholds, mask)
    return cls._from_batch(confidences, correct, thresholds, mask, one_stream=False)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, probs: Any = None, mask: Any = None,
                        **_: Any) -> SweepState:
    """The state of one batch of model outputs at the class's thresholds (clu's protocol).

    Every leading axis holds samples of the same stream: outputs [..., n] give
    the state of their n' = prod(shape) samples (no batch axes), which merges
    into the running state of :meth:`empty` (clu's ``Collection``,
    :class:`cwsa_jax.nnx.SweepMetric`).

    Args:
      confidences, correct: [..., n] confidences and correctness, as in
        :meth:`from_batch`; or else
      logits, labels: [..., n, K] logits and [..., n] integer labels, turned
        into confidences by :func:`~cwsa_jax.confidences_from_logits`; or else
      probs, labels: [..., n, K] probabilities and labels
        (:func:`~cwsa_jax.confidences_from_probs`; concrete float64
        probabilities give the float64 maximum, compared with the thresholds
        in float64, and ``argmax == label`` taken in float64).
      mask: optional bool, integer or float array broadcastable to [..., n];
        a sample whose entry is 0 is ignored (see :meth:`from_batch`).
      **_: other model outputs (a loss, ...), ignored.
    """
    c, k = float64_outputs(confidences, correct, logits, labels, probs, _model_outputs(
        cls.__name__, confidences, correct, logits, labels, probs))
    c = cls._kept(c, None, mask)
    return cls._from_batch(c, k, None, mask, one_stream=True)

  @classmethod
  def _kept(cls, confidences: Any, thresholds: Any, mask: Any) -> Any:
    """``confidences`` with concrete float64 values as their stand-ins for the thresholds
    (given, else the class's in the precision they were configured in)."""
    def stand_ins_of(c64):
      t = _threshold_order.thresholds64(cls._thresholds if thresholds is None else thresholds)
      return None if t is None else _threshold_order.stand_ins(c64, t.reshape(-1))
    if thresholds is None and cls._thresholds is None:
      return confidences  # _class_thresholds names the problem
    return float64_kept(confidences, mask, stand_ins_of)

  @classmethod
  @_public.entry
  def _from_batch(cls, confidences: Any, correct: Any, thresholds: Any, mask: Any, *,
                  one_stream: bool) -> SweepState:
    t = _validation.as_thresholds(cls._class_thresholds() if thresholds is None else thresholds)
    c, k, mask = _prepare_batch(confidences, correct, mask, one_stream=one_stream)
    if cls._graded:
      k = k.astype(jnp.float32)
    fn = _batched(_sweep_state_1d, c.ndim - 1, (0, 0, None, None if mask is None else 0))
    hi, lo, invalid = fn(c, k, t, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(t, hi, lo, top, invalid)

  def _add_model_output(self, **outputs: Any) -> "SweepState":
    """``self.merge(type(self).from_model_output(**outputs))`` (``cwsa_jax.nnx``'s update)."""
    return self.merge(type(self).from_model_output(**outputs))

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
    accuracy NaN. A class made by :meth:`at` returns its one metric at its
    one threshold instead: a float32 scalar ([...] with batch axes).
    """
    normalize = type(self)._normalize if normalize is None else normalize
    _stats.check_normalize(normalize)
    _check_capacity(self)
    lead = self.hi.ndim - 2
    fn = _batched(_sweep_compute, lead, (None, 0, 0, 0, 0))
    result = _stats.renormalize(fn(self.thresholds, self.hi, self.lo, self.top, self.invalid),
                                normalize)
    metric = type(self)._metric
    return result if metric is None else getattr(result, metric)[..., 0]

  def compute_value(self) -> Any:
    """clu's ``Metric.compute_value``: ``clu.values.Scalar(compute())`` for a class made by :meth:`at`.

    A sweep over T thresholds gives T values per metric, which no
    ``clu.values`` type holds as scalars: this raises ``TypeError`` naming
    :meth:`at` (one scalar metric per threshold in the ``Collection``); read
    such a state's arrays with :meth:`compute`. Needs clu (imported here) and a
    state without batch axes.
    """
    if type(self)._metric is None:
      raise TypeError(
          f"{type(self).__name__}.compute_value: a sweep over {self.thresholds.shape[-1]} "
          "threshold(s) gives arrays, not a clu scalar; for clu's compute_values() / "
          "write_values use SweepState.at(tau, metric='cwsa') (one scalar per threshold), "
          "or read the SweepResult with compute()")
    return _clu_scalar(self, self.compute())


def _given_thresholds(thresholds: Any) -> tuple[float, ...]:
  """Checked thresholds [T] as Python floats in the precision given (float64 for Python
  floats and float64 arrays, the float32 values for float32 ones)."""
  t32 = np.asarray(_validation.as_thresholds(thresholds))
  t64 = _threshold_order.thresholds64(thresholds)
  if t64 is None or t64.size != t32.size:
    return tuple(t32.tolist())
  return tuple(t64.reshape(-1).tolist())


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
