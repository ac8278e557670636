"""Flax NNX metrics: the streaming states as ``flax.nnx.metrics.Metric`` objects.

:class:`SweepMetric`, :class:`CalibrationMetric` and :class:`RiskCoverageMetric`
hold the exact sums of :class:`~cwsa_jax.streaming.SweepState`,
:class:`~cwsa_jax.streaming.CalibrationState` and
:class:`~cwsa_jax.streaming.RiskCoverageState` in ``nnx.metrics.MetricState``
variables, with flax's ``update(**outputs)`` / ``compute()`` / ``reset()``:
``update`` takes ``confidences=``/``correct=``, ``logits=``/``labels=`` or
``probs=``/``labels=`` with any leading batch axes (all of them samples of the
one stream), an optional ``mask=`` as ``nnx.metrics`` takes it (bool, integer
or float, broadcastable to the samples' shape, nonzero keeps a sample), and
ignores every other keyword, so the metrics sit in an ``nnx.MultiMetric``
beside ``nnx.metrics.Accuracy`` and ``Average('loss')`` and update in place
inside ``nnx.jit``:

.. code-block:: python

  metrics = nnx.MultiMetric(
      accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"),
      sweep=SweepMetric(jnp.linspace(0.5, 0.95, 10)), ece=CalibrationMetric(15),
      aurc=RiskCoverageMetric())

  @nnx.jit
  def eval_step(model, metrics, images, labels):
    logits = model(images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    metrics.update(logits=logits, labels=labels, loss=loss)

  for images, labels in test_batches:
    eval_step(model, metrics, images, labels)
  metrics.compute()   # {"sweep": SweepResult, "ece": ..., "aurc": BinnedRiskCoverage, ...}

After any number of updates, ``compute()`` equals :func:`~cwsa_jax.sweep` /
:func:`~cwsa_jax.ece` on all the samples bit for bit (the sums are exact
integers); :class:`RiskCoverageMetric` gives the binned AURC with its bounds.
Inside ``shard_map``, ``update(..., axis_name="data")`` all-reduces each
batch's sums over the mesh axis before adding them, so every device holds the
metric of the whole global batch.

This module imports flax (the ``[train]`` extra); ``import cwsa_jax`` does not.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

try:
  from flax import nnx
except ModuleNotFoundError as e:  # flax is optional: not in the core install
  if e.name != "flax":
    raise
  raise ModuleNotFoundError("cwsa_jax.nnx needs flax: pip install 'cwsa-jax[train]'",
                            name="flax") from None

from cwsa_jax import streaming
from cwsa_jax import SweepResult

__all__ = ["CalibrationMetric", "RiskCoverageMetric", "SweepMetric", "ThresholdMetric"]


@functools.lru_cache(maxsize=None)
def _layout(state_type: type) -> tuple[tuple[str, ...], dict]:
  """The array fields a metric of ``state_type`` holds, and the fields its class fixes.

  Static fields (bins) and configured arrays (a sweep's thresholds) are the same in
  every state of the class: keeping them out of the metric's variable spares ``nnx.jit``
  flattening, transferring and returning them on every step.
  """
  empty = state_type.empty()
  arrays, fixed = [], {}
  for f in dataclasses.fields(empty):
    value = getattr(empty, f.name)
    if f.metadata.get("static"):
      fixed[f.name] = value
    elif f.name in state_type._CONFIGURED_FIELDS:
      fixed[f.name] = np.asarray(value)
    else:
      arrays.append(f.name)
  return tuple(arrays), fixed


class _StateMetric(nnx.metrics.Metric):
  """A ``Metric`` holding one configured streaming state's arrays in one ``MetricState``.

  One variable (a tuple of the state's arrays) rather than one per array: ``nnx.jit``
  walks every graph node and variable on each call, host work that made the step of a
  small model markedly slower.
  """

  def __init__(self, state_type: type):
    self._state_type = state_type  # static: its class options (thresholds, bins)
    self.arrays = nnx.metrics.MetricState(self._arrays_of(state_type.empty()))

  def _arrays_of(self, state) -> tuple:
    return tuple(getattr(state, name) for name in _layout(self._state_type)[0])

  def streaming_state(self):
    """The accumulated :mod:`cwsa_jax.streaming` state (e.g. to ``merge`` or ``psum`` it)."""
    names, fixed = _layout(self._state_type)
    fields = dict(zip(names, self.arrays.get_value()))
    fields.update({name: jnp.asarray(value) if isinstance(value, np.ndarray) else value
                   for name, value in fixed.items()})
    return self._state_type(**fields)

  def _store(self, state) -> None:
    self.arrays.set_value(self._arrays_of(state))

  def reset(self) -> None:
    """Forgets every sample: back to the state of none."""
    self._store(self._state_type.empty())

  def update(self, *, axis_name: Any = None, **outputs: Any) -> None:
    """Adds a batch of model outputs, in place.

    Under ``nnx.jit`` with the metric donated (``donate_argnums``), XLA updates
    the state's buffers in place: a :class:`RiskCoverageMetric` then rewrites
    only the bins the batch touches instead of its whole state.

    Args:
      axis_name: inside ``shard_map``: all-reduce the batch's sums over this
        mesh axis first, so that every device adds the whole global batch.
      **outputs: ``confidences=`` and ``correct=`` ([..., n]), or else
        ``logits=`` ([..., n, K]) and ``labels=`` ([..., n]), or else
        ``probs=`` ([..., n, K]) and ``labels=``; every leading axis holds
        samples of the same stream (an update of [4, 16] equals one of the
        flattened [64]). Optional ``mask=``: bool, integer or float,
        broadcastable to [..., n]; an entry 0 ignores its sample, any other
        value keeps it (a NaN entry raises, or under ``jit`` makes the metric
        NaN). Any other keyword (a loss, images) is ignored.

    Float64: an eager update (outside ``jit``) with concrete float64
    ``confidences=`` or ``probs=`` compares them with a
    :class:`SweepMetric`'s or :class:`ThresholdMetric`'s thresholds and
    puts them in a :class:`CalibrationMetric`'s bins in float64, as the
    states' ``from_model_output`` does (``c = 0.5 - 1e-9`` is not retained
    at ``tau = 0.5``). Under ``nnx.jit`` the inputs are float32 (a 64-bit
    tracer is rounded first), so the comparisons are float32's there.
    """
    state = self.streaming_state()
    if axis_name is None:
      self._store(state._add_model_output(**outputs))
      return
    batch = self._state_type.from_model_output(**outputs).psum(axis_name)
    self._store(state.merge(batch))

  def compute(self) -> Any:
    """The metric of every sample added since the last :meth:`reset` (NaN-valued with none)."""
    return self.streaming_state().compute()

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    # flax's metaclass makes inspect (and help()) show (*args, **kwargs): give the real one.
    init = inspect.signature(cls.__init__)
    cls.__signature__ = init.replace(parameters=list(init.parameters.values())[1:],
                                     return_annotation=inspect.Signature.empty)


class SweepMetric(_StateMetric):
  """Coverage, selective accuracy, CWSA and CWSA+ at fixed thresholds (exact).

  ``compute()`` returns the :class:`~cwsa_jax.SweepResult` of
  :func:`~cwsa_jax.sweep` on every sample added since the last ``reset()``,
  bit for bit. Eager updates with concrete float64 confidences compare them
  with the thresholds in float64, as :func:`~cwsa_jax.sweep` does; under
  ``nnx.jit`` the inputs are float32 (see :meth:`update`).

  Args:
    thresholds: [T] thresholds in [0, 1).
    graded: correctness is graded (kappa in [0, 1]); default boolean.
    normalize: ``"retained"`` (the paper's CWSA) or ``"all"``; see
      :func:`~cwsa_jax.sweep`.

  Examples:
    >>> import numpy as np
    >>> metric = SweepMetric([0.5, 0.7])
    >>> metric.update(confidences=np.array([0.9, 0.6]), correct=np.array([True, False]), loss=0.3)
    >>> metric.update(confidences=np.array([0.8, 0.55]), correct=np.array([True, True]))
    >>> print([round(float(x), 4) for x in metric.compute().cwsa])  # == sweep(all four).cwsa
    [0.325, 0.5]
    >>> metric.reset()
    >>> print(metric.compute().coverage.tolist())
    [nan, nan]
  """

  def __init__(self, thresholds: ArrayLike, *, graded: bool = False,
               normalize: str = "retained"):
    super().__init__(streaming.SweepState.configure(thresholds=thresholds, graded=graded,
                                                    normalize=normalize))

  def compute(self) -> SweepResult:
    """The :class:`~cwsa_jax.SweepResult` of every sample added since the last :meth:`reset`."""
    return super().compute()


class ThresholdMetric(_StateMetric):
  """One metric of :func:`~cwsa_jax.sweep` at one threshold, as a float32 scalar (exact).

  ``compute()`` returns ``sweep(c, kappa, [tau]).<metric>[0]`` on every sample
  added since the last ``reset()``, bit for bit: a scalar that loggers and
  ``clu.metric_writers.write_scalars`` take as they take ``Accuracy``'s. It
  holds the state of :meth:`SweepState.at <cwsa_jax.streaming.SweepState.at>`
  (``tau`` kept in the precision given; eager float64 updates compared with it
  in float64, under ``nnx.jit`` float32: see :meth:`update`).

  Args:
    tau: the threshold, in [0, 1).
    metric: ``"cwsa"`` (default), ``"cwsa_plus"``, ``"coverage"`` or
      ``"selective_accuracy"``.
    graded, normalize: as in :class:`SweepMetric`.

  Examples:
    >>> import numpy as np
    >>> metric = ThresholdMetric(0.5)
    >>> metric.update(confidences=np.array([[0.9, 0.6], [0.8, 0.55]]),
    ...               correct=np.array([[True, False], [True, True]]))
    >>> print(round(float(metric.compute()), 4))  # == cwsa(all four, 0.5)
    0.325
  """

  def __init__(self, tau: float, *, metric: str = "cwsa", graded: bool = False,
               normalize: str = "retained"):
    super().__init__(streaming.SweepState.at(tau, metric=metric, graded=graded,
                                             normalize=normalize))

  def compute(self) -> jax.Array:
    """The metric at the threshold (float32 scalar) of every sample added since the last
    :meth:`reset`."""
    return super().compute()


class CalibrationMetric(_StateMetric):
  """Expected calibration error over equal-width bins (exact).

  ``compute()`` equals :func:`~cwsa_jax.ece` (``binning="width"``, the same
  ``num_bins`` and ``norm``) on every sample added since the last ``reset()``;
  ``streaming_state().bins()`` gives the reliability-diagram bins. Eager
  updates with concrete float64 confidences put them in their float64 bins,
  as :func:`~cwsa_jax.ece` does; under ``nnx.jit`` the inputs are float32
  (see :meth:`update`).

  Args:
    num_bins: number of equal-width bins.
    norm: ``"l1"`` (ECE), ``"l2"`` (RMS calibration error) or ``"max"`` (MCE).
  """

  def __init__(self, num_bins: int = 15, *, norm: str = "l1"):
    super().__init__(streaming.CalibrationState.configure(num_bins=num_bins, norm=norm))

  def compute(self) -> jax.Array:
    """The calibration error (float32 scalar) of every sample added since the last :meth:`reset`."""
    return super().compute()


class RiskCoverageMetric(_StateMetric):
  """AURC and AUGRC (``"step"`` convention) from binned confidences, with guaranteed bounds.

  ``compute()`` returns the :class:`~cwsa_jax.streaming.BinnedRiskCoverage` of
  :class:`~cwsa_jax.streaming.RiskCoverageState`: the estimate, a lower and an
  upper bound, and whether it is exact (every bin held one distinct
  confidence).

  Args:
    mantissa_bits: ``2^mantissa_bits`` bins per octave of ``c`` below 1/2 and
      of ``1 - c`` above it (default 8: 64,513 bins of 40 bytes, about 2.6 MB
      of state). An update writes only the bins its batch touches: donate the
      metric to ``nnx.jit`` (``donate_argnums``) so that XLA writes them in
      place; without donation every step copies the whole state.
  """

  def __init__(self, mantissa_bits: int = 8):
    super().__init__(streaming.RiskCoverageState.configure(mantissa_bits=mantissa_bits))

  def compute(self) -> streaming.BinnedRiskCoverage:
    """The :class:`~cwsa_jax.streaming.BinnedRiskCoverage` of every sample added since the
    last :meth:`reset`."""
    return super().compute()

  def ranking(self, tpr: float = 0.95) -> streaming.BinnedRanking:
    """AUROC, FPR at ``tpr`` and average precision (success and error as positive) of every
    sample added since the last :meth:`reset`, with bounds:
    :meth:`~cwsa_jax.streaming.RiskCoverageState.ranking`."""
    return self.streaming_state().ranking(tpr)
