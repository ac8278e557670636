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
  :class:`BinnedRiskCoverage`). The failure-detection metrics of the confidence
  stream from the same bins: :meth:`RiskCoverageState.ranking` gives AUROC,
  FPR at a TPR and average precision (success or error positive), exact where
  every bin holds one distinct value and bounded otherwise
  (:class:`BinnedRanking`), for 0/1 correctness only. They rank the
  confidences in [0, 1] the state bins; AUROC, FPR@TPR and AP of other
  scores (logits, energies, float64 ranks) and the E-AURC oracle's exact
  order do not stream: use the one-shot functions.

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

Masks: ``from_batch`` and ``from_model_output`` take ``mask=`` as
``nnx.metrics`` does: bool, integer or float, broadcastable to the samples'
shape [..., n]; an entry 0 drops its sample (padding), any other value keeps
it whole (a 0/1 float mask gives the boolean mask's state bit for bit). A NaN
or infinite entry raises ``ValueError``, or under ``jit`` marks the state
invalid. Leading axes: ``from_batch`` keeps them as batch axes of the state
(one state per row, :meth:`~SweepState.reduce` merges them);
``from_model_output`` (clu's and nnx's protocol) flattens them, every sample
one of the same stream.

clu's ``Metric`` protocol: ``configure(...)`` returns a subclass holding the
options (thresholds, bins), whose ``empty()`` takes no arguments and whose
``from_model_output(**outputs)`` takes ``confidences=``/``correct=``,
``logits=``/``labels=`` or ``probs=``/``labels=`` (optional ``mask=``, other
outputs ignored), so a ``clu.metrics.Collection`` can hold the states.
``compute_value()`` gives clu a ``clu.values.Scalar``: the ECE of a
:class:`CalibrationState`, the AURC (or the field ``configure(metric=...)``
names) of a :class:`RiskCoverageState`, and for CWSA the one-threshold
:meth:`SweepState.at` (a sweep over T thresholds has no scalar and says so):

.. code-block:: python

  Metrics = clu.metrics.Collection.create(
      sweep=SweepState.configure(thresholds=thresholds),
      ece=CalibrationState.configure(num_bins=15), aurc=RiskCoverageState)
  metrics = Metrics.empty()
  metrics = metrics.merge(Metrics.single_from_model_output(logits=logits, labels=labels))
  metrics.compute()  # {"sweep": SweepResult, "ece": ..., "aurc": BinnedRiskCoverage}

  Scalars = clu.metrics.Collection.create(
      cwsa_50=SweepState.at(0.5), coverage_50=SweepState.at(0.5, metric="coverage"),
      ece=CalibrationState.configure(num_bins=15), aurc=RiskCoverageState)
  ...  # the same loop
  clu.metric_writers.write_values(writer, step, scalars.compute_values())

``cwsa_jax.nnx`` wraps the same states as ``flax.nnx`` metrics.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import jax
import numpy as np

from cwsa_jax import _calibration
from cwsa_jax import _sweep
from cwsa_jax import _validation
# The states live in private modules (cwsa_jax._states) whose public names say they are here.
from cwsa_jax._states._calibration_state import CalibrationState
from cwsa_jax._states._merge import process_merge
from cwsa_jax._states._risk_coverage_state import BinnedRanking
from cwsa_jax._states._risk_coverage_state import BinnedRiskCoverage
from cwsa_jax._states._risk_coverage_state import RiskCoverageState
from cwsa_jax._states._risk_coverage_state import confidence_key  # noqa: F401 (cli, tests)
from cwsa_jax._states._sweep_state import SweepState

__all__ = [
    "BinnedRanking",
    "BinnedRiskCoverage",
    "CalibrationState",
    "EvaluationResult",
    "RiskCoverageState",
    "SweepState",
    "evaluate_batches",
    "process_merge",
]


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
