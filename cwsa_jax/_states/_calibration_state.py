"""The exact mergeable state of the ECE family and reliability bins (:class:`CalibrationState`)
and its kernels.

Concrete float64 confidences (and the maxima of concrete float64 probabilities)
fall in their float64 bins, as in :func:`~cwsa_jax.ece`: each is replaced on
the host by the float32 stand-in of ``_calibration._float64_bins`` (edges
``j / B`` in float64) before the kernels round their input to float32. Inside
``jit`` the inputs are float32 already: nothing changes there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _calibration
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax import _stats
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
from cwsa_jax._states._sweep_state import float64_kept
from cwsa_jax._states._sweep_state import float64_outputs

_CAL_WIDTH = _stats.CALIBRATION_COLUMNS  # count, kappa digits, (1 - c) digits


@public
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
  bit. Concrete float64 confidences (and probabilities, in
  :meth:`from_model_output`) fall in their float64 bins (edges ``j / B``),
  as :func:`~cwsa_jax.ece` puts them; inside ``jit`` the inputs are float32
  already, so nothing changes there.

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
  _CONFIGURED_FIELDS = ()  # see SweepState

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
  def from_batch(cls, confidences: Any, correct: Any, *, num_bins: int | None = None,
                 mask: Any = None) -> CalibrationState:
    """The state of one batch [..., n] (leading axes kept as batch axes of the state).

    ``mask``: optional bool, integer or float array broadcastable to [..., n];
    0 marks padding (see :meth:`SweepState.from_batch`). Concrete float64
    confidences fall in their float64 bins (see the class).
    """
    confidences = cls._kept(confidences, num_bins, mask)
    return cls._from_batch(confidences, correct, num_bins, mask, one_stream=False)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, probs: Any = None, mask: Any = None,
                        **_: Any) -> CalibrationState:
    """The state of one batch of model outputs, all leading axes one stream (clu's protocol);
    see :meth:`SweepState.from_model_output` (concrete float64 probabilities: the float64
    maximum, in its float64 bin, and ``argmax == label`` in float64)."""
    c, k = float64_outputs(confidences, correct, logits, labels, probs, _model_outputs(
        cls.__name__, confidences, correct, logits, labels, probs))
    c = cls._kept(c, None, mask)
    return cls._from_batch(c, k, None, mask, one_stream=True)

  @classmethod
  def _kept(cls, confidences: Any, num_bins: int | None, mask: Any) -> Any:
    """``confidences`` with concrete float64 values as the stand-ins of their float64 bins."""
    options = {"num_bins": cls._num_bins if num_bins is None else num_bins, "binning": "width"}
    return float64_kept(confidences, mask, lambda c64: _calibration._float64_bins(c64, options))

  @classmethod
  @_public.entry
  def _from_batch(cls, confidences: Any, correct: Any, num_bins: int | None, mask: Any, *,
                  one_stream: bool) -> CalibrationState:
    num_bins = cls._num_bins if num_bins is None else num_bins
    _calibration._check_options(num_bins, "width")
    c, k, mask = _prepare_batch(confidences, correct, mask, one_stream=one_stream)
    fn = _batched(functools.partial(_calibration_state_1d, num_bins=int(num_bins)), c.ndim - 1,
                  (0, 0, None if mask is None else 0))
    hi, lo, invalid = fn(c, k, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(hi, lo, top, invalid)

  def _add_model_output(self, **outputs: Any) -> "CalibrationState":
    """``self.merge(type(self).from_model_output(**outputs))`` (``cwsa_jax.nnx``'s update)."""
    return self.merge(type(self).from_model_output(**outputs))

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

  def compute_value(self) -> Any:
    """clu's ``Metric.compute_value``: ``clu.values.Scalar(compute())`` (clu is imported here).

    Needs a state without batch axes (``reduce()`` one first).
    """
    return _clu_scalar(self, self.compute())

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
