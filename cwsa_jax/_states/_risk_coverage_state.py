"""The binned mergeable state of AURC and AUGRC (:class:`RiskCoverageState`), its result
(:class:`BinnedRiskCoverage`) and the confidence-key layout of its bins.

The key layout (:func:`confidence_key`, :data:`HALF_BITS`, :data:`KEY_MAX`,
:func:`num_rc_bins`) is an internal surface: ``cwsa-jax evaluate --stream`` builds the
same bins on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _areas
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax._risk_coverage_kernels import _TARGET_SLACK
from cwsa_jax._kernels import _sort
from cwsa_jax import _stats
from cwsa_jax import _validation
from cwsa_jax._states._common import _CAPACITY_TEXT
from cwsa_jax._states._common import _batched
from cwsa_jax._states._common import _check_capacity
from cwsa_jax._states._common import _clu_scalar
from cwsa_jax._states._common import _configured
from cwsa_jax._states._common import _empty_sums
from cwsa_jax._states._common import _merged
from cwsa_jax._states._common import _model_outputs
from cwsa_jax._states._common import _past_capacity
from cwsa_jax._states._common import _prepare_batch
from cwsa_jax._states._common import _reduced
from cwsa_jax._states._common import _sum_leading
from cwsa_jax._states._common import public

HALF_BITS = 0x3F000000  # int32 bit pattern of 0.5f
KEY_MAX = 2 * HALF_BITS  # key of c = 1
_EMPTY_MIN = np.iinfo(np.int32).max
_RC_WIDTH = _stats.LOSS_COLUMNS  # count, loss digits


@public
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


@public
class BinnedRanking(NamedTuple):
  """AUROC, FPR at a TPR and average precision of the confidence from a :class:`RiskCoverageState`.

  The failure-detection metrics of :func:`~cwsa_jax.auroc`, :func:`~cwsa_jax.fpr_at_tpr`
  and :func:`~cwsa_jax.average_precision`, with the confidence as the score and
  0/1 correctness. Sort the bins by decreasing confidence; bin ``b`` holds
  ``m_b`` samples, ``c_b`` correct and ``e_b`` wrong; the bins above it hold
  ``C_b`` correct, ``E_b`` wrong and ``K_b = C_b + E_b`` samples, those below it
  ``C'_b``, ``E'_b`` and ``K'_b``; ``P`` correct and ``N`` wrong in all. Treating
  each bin as one tie group gives the estimates

  .. math::

    \\widehat{\\mathrm{AUROC}} = \\frac{1}{PN} \\sum_b c_b \\left(E'_b + \\tfrac{1}{2} e_b\\right),
    \\qquad
    \\widehat{\\mathrm{FPR}}(q) = \\frac{E_{b^*} + e_{b^*}}{N},\\quad
    b^* = \\text{the first bin with } \\frac{C_b + c_b}{P} \\ge q,

    \\widehat{\\mathrm{AP}} = \\sum_b \\frac{c_b}{P} \\frac{C_b + c_b}{K_b + m_b},
    \\qquad
    \\widehat{\\mathrm{AP}}_{\\mathrm{error}} = \\sum_b \\frac{e_b}{N}
      \\frac{E'_b + e_b}{K'_b + m_b},

  which are the exact values (those of the one-shot functions on the float32
  confidences) when every bin holds one distinct confidence; ``FPR`` needs
  only bin ``b^*`` to. In a bin with several distinct confidences the order of
  its samples is unknown, and whatever it is (ties included):

  * AUROC: a pair of a correct and a wrong sample of the same bin counts 0, 1/2
    or 1, so ``c_b e_b / 2`` lies in ``[0, c_b e_b]``: the low and high bounds
    take ``c_b E'_b`` and ``c_b (E'_b + e_b)``. Both are attained and the
    estimate is their midpoint.
  * FPR: a threshold inside a bin above ``b^*`` accepts fewer correct samples
    than the whole bin, so it cannot reach ``q``; one inside ``b^*`` accepts
    at least the ``E_{b^*}`` wrong samples above, and one inside a lower bin
    at least ``E_{b^*} + e_{b^*}``: ``FPR`` lies in ``[E_{b^*}, E_{b^*} + e_{b^*}] / N``
    (attained).
  * AP: a correct sample of bin ``b`` whose tie group ends after ``x`` correct
    (``1 <= x <= c_b``) and ``y`` wrong (``0 <= y <= e_b``) samples of its bin
    has precision ``(C_b + x) / (K_b + x + y)``, increasing in ``x`` (as
    ``C_b <= K_b``) and decreasing in ``y``. So it lies in
    ``[(C_b + 1) / (K_b + e_b + 1), (C_b + c_b) / (K_b + c_b)]``, and for AP-error
    (ranked by increasing confidence) an error's in
    ``[(E'_b + 1) / (K'_b + c_b + 1), (E'_b + e_b) / (K'_b + e_b)]``.

  Summing the bins' extremes gives ``low`` and ``high``, guaranteed bounds on
  the exact value (up to float32 rounding). The AUROC numerators (sums of
  products of counts, past 2^64 for large states) are exact integers rounded
  once, then divided once by ``2 P N``; the counts above and below each bin are
  exact integers (prefix sums, no float cancellation) converted to float32
  once, and AP sums its per-bin float32 terms (recall gained times precision)
  exactly, as :func:`~cwsa_jax.average_precision` does.

  Undefined values are NaN, as in the one-shot functions: AUROC and FPR where
  every sample is correct or every one is wrong (``P N = 0``), AP where there is
  no correct sample, AP-error where there is no wrong one (all correct: AUROC
  and FPR NaN, AP 1, AP-error NaN); every field of an empty or invalid state.

  Attributes:
    auroc, auroc_low, auroc_high: float32 [...].
    fpr_at_tpr, fpr_at_tpr_low, fpr_at_tpr_high: float32 ``[...] + tpr.shape``.
    average_precision, average_precision_low, average_precision_high: float32
      [...], the correct predictions positive (``positive="correct"``).
    average_precision_error, average_precision_error_low, average_precision_error_high:
      float32 [...], the wrong ones positive (``positive="error"``).
    exact: bool [...], every non-empty bin holds a single distinct confidence
      (then low = estimate = high for every metric).
  """
  auroc: jax.Array
  auroc_low: jax.Array
  auroc_high: jax.Array
  fpr_at_tpr: jax.Array
  fpr_at_tpr_low: jax.Array
  fpr_at_tpr_high: jax.Array
  average_precision: jax.Array
  average_precision_low: jax.Array
  average_precision_high: jax.Array
  average_precision_error: jax.Array
  average_precision_error_low: jax.Array
  average_precision_error_high: jax.Array
  exact: jax.Array


# The fields of a BinnedRiskCoverage that compute_value can give clu (all but ``exact``).
_SCALAR_FIELDS = BinnedRiskCoverage._fields[:-1]


@public
def confidence_key(c: jax.Array) -> jax.Array:
  """An int32 key, strictly increasing in ``c`` in [0, 1], fine near 0 and near 1.

  ``bits(c)`` below 1/2 and ``2 bits(1/2) - bits(1 - c)`` from 1/2 up (``1 - c``
  is exact there), where ``bits`` is the float32 bit pattern, so the key
  resolves ``c`` and ``1 - c`` to full float32 precision.
  """
  c = _sort.clip_unit(c)
  low = jax.lax.bitcast_convert_type(c, jnp.int32)  # _sort.float_key of the clipped c
  high = KEY_MAX - jax.lax.bitcast_convert_type(jnp.float32(1.0) - c, jnp.int32)
  return jnp.where(c < 0.5, low, high)


@public
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

  # Class options (not fields), set by configure().
  _mantissa_bits = 8
  _metric = "aurc"
  _CONFIGURED_FIELDS = ()  # see SweepState

  @classmethod
  def configure(cls, *, mantissa_bits: int = 8, metric: str = "aurc") -> type[RiskCoverageState]:
    """A subclass whose bins have ``mantissa_bits`` (clu's protocol; see :meth:`SweepState.configure`).

    The unconfigured class already follows the protocol with the default 8 bits.
    ``metric``: the :class:`BinnedRiskCoverage` field that :meth:`compute_value`
    gives clu as a scalar: ``"aurc"`` (default), ``"augrc"`` or one of their
    bounds (``"aurc_low"``, ...); :meth:`compute` still returns them all.
    """
    num_rc_bins(mantissa_bits)
    if metric not in _SCALAR_FIELDS:
      raise ValueError(f"metric must be one of {', '.join(map(repr, _SCALAR_FIELDS))}, "
                       f"got {metric!r}")
    return _configured(cls, _mantissa_bits=int(mantissa_bits), _metric=metric)

  @classmethod
  def empty(cls, *, mantissa_bits: int | None = None) -> RiskCoverageState:
    """The state of no samples; ``mantissa_bits`` defaults to the class's (8 unless configured)."""
    mantissa_bits = cls._mantissa_bits if mantissa_bits is None else mantissa_bits
    bins = num_rc_bins(mantissa_bits)
    top, hi, lo = _empty_sums((bins, _RC_WIDTH))
    return cls(hi, lo, top, jnp.full((bins,), _EMPTY_MIN, jnp.int32),
               jnp.full((bins,), -1, jnp.int32), jnp.zeros((), bool), mantissa_bits)

  @classmethod
  def from_batch(cls, confidences: Any, correct: Any, *, mantissa_bits: int | None = None,
                 mask: Any = None) -> RiskCoverageState:
    """The state of one batch [..., n] (leading axes kept as batch axes of the state).

    ``mask``: optional bool, integer or float array broadcastable to [..., n];
    0 marks padding (see :meth:`SweepState.from_batch`).
    """
    return cls._from_batch(confidences, correct, mantissa_bits, mask, one_stream=False)

  @classmethod
  def from_model_output(cls, *, confidences: Any = None, correct: Any = None, logits: Any = None,
                        labels: Any = None, probs: Any = None, mask: Any = None,
                        **_: Any) -> RiskCoverageState:
    """The state of one batch of model outputs, all leading axes one stream (clu's protocol);
    see :meth:`SweepState.from_model_output`."""
    c, k = _model_outputs(cls.__name__, confidences, correct, logits, labels, probs)
    return cls._from_batch(c, k, None, mask, one_stream=True)

  @classmethod
  @_public.entry
  def _from_batch(cls, confidences: Any, correct: Any, mantissa_bits: int | None, mask: Any, *,
                  one_stream: bool) -> RiskCoverageState:
    mantissa_bits = cls._mantissa_bits if mantissa_bits is None else mantissa_bits
    num_rc_bins(mantissa_bits)
    c, k, mask = _prepare_batch(confidences, correct, mask, one_stream=one_stream)
    fn = _batched(functools.partial(_rc_state_1d, mantissa_bits=mantissa_bits), c.ndim - 1,
                  (0, 0, None if mask is None else 0))
    hi, lo, key_min, key_max, invalid = fn(c, k, mask)
    top, hi, lo = _exact.widen(hi, lo)
    return cls(hi, lo, top, key_min, key_max, invalid, mantissa_bits)

  def _add_model_output(self, **outputs: Any) -> "RiskCoverageState":
    """``self.merge(type(self).from_model_output(**outputs))`` (``cwsa_jax.nnx``'s update), the
    same arrays bit for bit within capacity, touching only the batch's bins (:func:`_rc_add`).

    Past capacity, an eager update raises as :meth:`merge` does; under ``jit`` the
    sticky mark (every ``top`` -1) is kept, while a state the updates carry past
    the capacity is marked by its next :meth:`merge` and computes NaN at once.
    """
    cls = type(self)
    c, k = _model_outputs(cls.__name__, outputs.get("confidences"), outputs.get("correct"),
                          outputs.get("logits"), outputs.get("labels"), outputs.get("probs"))
    n = int(np.prod(np.shape(c), dtype=np.int64))
    if self.hi.ndim != 2 or self.mantissa_bits != cls._mantissa_bits or n > _ADD_MAX:
      return self.merge(cls._from_batch(c, k, None, outputs.get("mask"), one_stream=True))
    return self._add(c, k, outputs.get("mask"))

  @_public.entry
  def _add(self, confidences: Any, correct: Any, mask: Any) -> "RiskCoverageState":
    c, k, mask = _prepare_batch(confidences, correct, mask, one_stream=True)
    hi, lo, top, key_min, key_max, invalid = _rc_add(
        self.hi, self.lo, self.top, self.key_min, self.key_max, self.invalid, c, k, mask,
        mantissa_bits=self.mantissa_bits)
    if _validation.is_concrete(top) and bool(_past_capacity(top, hi)):
      raise ValueError(f"{type(self).__name__}: the merged state is past its capacity; a state "
                       f"is {_CAPACITY_TEXT}")
    return dataclasses.replace(self, hi=hi, lo=lo, top=top, key_min=key_min, key_max=key_max,
                               invalid=invalid)

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
    _check_capacity(self, columns=True)
    fn = _batched(_rc_compute, self.hi.ndim - 2, (0, 0, 0, 0, 0, 0))
    return fn(self.hi, self.lo, self.top, self.key_min, self.key_max, self.invalid)

  @_public.entry
  def ranking(self, tpr: Any = 0.95) -> BinnedRanking:
    """AUROC, FPR at ``tpr`` and average precision of the confidence, with bounds.

    The estimates and guaranteed bounds of :class:`BinnedRanking`, from the
    same bins as :meth:`compute`: each equals the one-shot
    :func:`~cwsa_jax.auroc`, :func:`~cwsa_jax.fpr_at_tpr` or
    :func:`~cwsa_jax.average_precision` (``positive="correct"`` and
    ``"error"``) of the float32 confidences where every bin holds one distinct
    confidence, and any split of the data merged gives the one-pass result.
    Works under ``jit`` and ``vmap``; batch axes of the state are kept.

    Args:
      tpr: target true positive rate(s) in (0, 1], a scalar or any shape
        (default 0.95); ``TPR >= q`` is tested with the slack of
        :func:`~cwsa_jax.fpr_at_tpr`.

    Returns:
      :class:`BinnedRanking`, the FPR fields of shape ``[...] + tpr.shape``.

    Raises:
      ValueError: a concrete state past its capacity, a ``tpr`` outside (0, 1],
        or a state of graded correctness (some bin's summed loss is not a whole
        number): these metrics are defined for 0/1 correctness only. Under
        ``jit`` these give NaN instead. The state keeps only sums, so graded
        losses that happen to add up to whole numbers in every bin (two samples
        of ``kappa = 0.5`` read as one correct and one wrong) cannot be told
        apart from 0/1 ones: use :meth:`ranking` only on states of 0/1
        correctness.
    """
    _check_capacity(self, columns=True)
    t = _validation.as_float_array(tpr, "tpr").astype(jnp.float32)
    target_flag = _validation.check_range(t, "tpr", low_open=True)
    fn = _batched(_ranking_compute, self.hi.ndim - 2, (0, 0, 0, 0, 0, 0, None))
    result, graded = fn(self.hi, self.lo, self.top, self.key_min, self.key_max, self.invalid, t)
    if _validation.is_concrete(graded) and bool(np.any(np.asarray(graded))):
      raise ValueError(f"{type(self).__name__}.ranking: the state holds graded correctness (a "
                       "bin's summed loss is not a whole number); AUROC, FPR@TPR and average "
                       "precision need 0/1 correctness")
    fpr = _validation.poison(result[3:6], items=target_flag)
    return result._replace(fpr_at_tpr=fpr[0], fpr_at_tpr_low=fpr[1], fpr_at_tpr_high=fpr[2])

  def compute_value(self) -> Any:
    """clu's ``Metric.compute_value``: ``clu.values.Scalar`` of the class's metric (the AURC
    estimate unless :meth:`configure` chose another field of :meth:`compute`).

    Needs clu (imported here) and a state without batch axes.
    """
    return _clu_scalar(self, getattr(self.compute(), type(self)._metric))


def num_rc_bins(mantissa_bits: Any) -> int:
  """The number of bins of a :class:`RiskCoverageState` with ``mantissa_bits`` (checked)."""
  if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, (int, np.integer)) \
      or not 0 <= mantissa_bits <= 12:
    raise ValueError(f"mantissa_bits must be an int in [0, 12], got {mantissa_bits!r}")
  return (KEY_MAX >> (23 - int(mantissa_bits))) + 1


@functools.partial(jax.jit, static_argnames=("mantissa_bits",))
def _rc_state_1d(c, k, mask, *, mantissa_bits):
  bins = num_rc_bins(mantissa_bits)
  key = confidence_key(c)
  ids = key >> (23 - mantissa_bits)
  seg = ids if mask is None else jnp.where(mask, ids, bins)  # padding: dropped

  def columns_fn(cid, kappa):
    return cid, jnp.stack(_stats.loss_columns(kappa), axis=0)

  hi, lo = _exact.segment_sums(columns_fn, [seg, k], bins, counted=True)
  key_min = jax.ops.segment_min(key, seg, num_segments=bins)  # empty: int32 max
  key_max = jnp.maximum(jax.ops.segment_max(key, seg, num_segments=bins), -1)
  return hi, lo, key_min, key_max, _stats.invalid_inputs(c, k)


# The most samples an in-place update adds (_rc_add): their loss digits (at most 4096 each)
# summed into one bin's low limb stay below 2^31.
_ADD_MAX = (1 << 19) - 2


@functools.partial(jax.jit, static_argnames=("mantissa_bits",))
def _rc_add(hi, lo, top, key_min, key_max, invalid, c, k, mask, *, mantissa_bits):
  """The arrays of the state plus the batch (c, k, mask [n]), only the batch's bins rewritten.

  :meth:`RiskCoverageState.merge` of :meth:`~RiskCoverageState.from_batch` builds the
  batch's sums in tables of every bin and adds them to the whole state: about ten passes
  over its 2.6 MB. Here each sample's columns ``(1, loss digits)`` are scatter-added
  into the low limbs ``lo`` of its bin, and only the touched bins are gathered and
  carried back to canonical limbs,

  .. math::

    h' = h + \\lfloor l / 2^{12} \\rfloor,\\quad l' = l \\bmod 2^{12},\\quad
    t' = t + \\lfloor h' / 2^{24} \\rfloor,\\quad h' \\leftarrow h' \\bmod 2^{24},

  the same canonical integers as the merge's (a bin's ``lo`` stays below
  ``4095 + 4096 n < 2^31`` for ``n <= _ADD_MAX``). Under ``jit`` with the state
  donated, every scatter writes the state's buffers in place: work proportional to
  the batch, not to the bins. A marked state (``top`` -1 everywhere, see ``_exact.seal``)
  stays marked; the capacity of the column totals is checked by :func:`_rc_compute`
  and the next merge instead (a full pass over the state each step otherwise).
  """
  bins = hi.shape[0]
  key = confidence_key(c)
  ids = key >> (23 - mantissa_bits)
  keep = (ids >= 0) & (ids < bins)  # at[] would wrap a negative index
  if mask is not None:
    keep = keep & mask
  ids = jnp.where(keep, ids, bins)  # padding and stray keys: dropped by every scatter
  for j, col in enumerate(_stats.loss_columns(k)):  # one 1-D scatter per column (as _exact)
    lo = lo.at[ids, j].add(col, mode="drop")
  # The touched bins (a repeated bin gathers the same sums, so writes the same limbs).
  rows = lambda x: x.at[ids].get(mode="fill", fill_value=0)  # noqa: E731
  carry, t_hi, t_lo = _exact.widen(rows(hi), rows(lo))
  old_top = rows(top)
  marked = (top[0, 0] < 0) | jnp.any(old_top < 0)
  t_top = jnp.where(marked, _exact.OVER_CAPACITY, old_top + carry)
  lo = lo.at[ids].set(t_lo, mode="drop")
  hi = hi.at[ids].set(t_hi, mode="drop")
  top = top.at[ids].set(t_top, mode="drop")
  key_min = key_min.at[ids].min(key, mode="drop")
  key_max = key_max.at[ids].max(key, mode="drop")
  return hi, lo, top, key_min, key_max, invalid | _stats.invalid_inputs(c, k)


@jax.jit
def _rc_compute(hi, lo, top, key_min, key_max, invalid):
  # Suffix sums over ascending bins = totals of the bins at or above each bin.
  wide = (top, hi, lo)
  above = _exact.wide_suffix_sums(wide)
  # The bins strictly above, exactly (integer difference, rounded once).
  excl = _exact.wide_sub(above, wide)
  # The three sets of sums converted by one (elementwise) call, stacked: one copy of its
  # exact rounding in the program instead of three (the first compute() compiles it).
  (m, k_incl, k_excl), (e, e_incl, e_excl) = _stats.loss_totals(
      *(jnp.stack(limb) for limb in zip((hi, lo, top), above[1:] + above[:1],
                                        excl[1:] + excl[:1])))
  invalid = invalid | _past_capacity(top, hi)
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
      _areas.areas(jnp.sum(where(a)), jnp.sum(where(g)), n)
      for a, g in ((tie, g_tie), (low, g_low), (high, g_tie)))
  return BinnedRiskCoverage(
      aurc=fin(aurc), aurc_low=fin(aurc_low), aurc_high=fin(aurc_high),
      augrc=fin(augrc), augrc_low=fin(augrc_low), augrc_high=fin(augrc_high),
      exact=jnp.all(single | ~nonempty) & ~bad)


# ------------------------------------------------------------------ ranking metrics


def _units(w: _exact.Wide) -> _exact.Wide:
  """``w / 4096`` of canonical ``(top, hi, lo)`` whose ``lo`` is 0 (the errors from a loss column
  of 0/1 losses, 4096 units a wrong sample)."""
  top, hi, _ = w
  return top >> 12, (hi >> 12) | ((top & 4095) << 12), hi & 4095


_PIECE_BITS = 6


def _limbs(w: _exact.Wide) -> list[jax.Array]:
  """The five base-4096 limbs, least significant first, of canonical ``(top, hi, lo)`` below
  2^53 (a count of a state within capacity)."""
  top, hi, lo = w
  return [lo, hi & 4095, hi >> 12, top & 4095, top >> 12]


def _product_limbs(a: _exact.Wide, b: _exact.Wide) -> list[jax.Array]:
  """The ten base-4096 limbs in [0, 4096) of the exact product of two counts below 2^53.

  Schoolbook: a column adds at most five products of limbs, below ``5 * 2^24``.
  """
  a, b = _limbs(a), _limbs(b)
  out, carry = [], 0
  for place in range(9):
    column = carry + sum(a[i] * b[place - i] for i in range(max(0, place - 4), min(place, 4) + 1))
    out.append(column & 4095)
    carry = column >> 12
  return out + [carry]


def _column_totals(columns: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact sums ``(hi, lo)`` [K] over the bins of int32 columns [bins, K] in [0, 4096].

  One reduction of the columns cut into 6-bit pieces (below ``2^7``), whose sums
  stay below 2^31 for up to ``2^24`` bins: ``sum = 64 high + low``, returned as
  ``hi = high >> 6``, ``lo = low + 64 (high & 63)`` (``lo`` not reduced below
  4096: :func:`_exact.exact_float` takes any non-negative pair).
  """
  mask = (1 << _PIECE_BITS) - 1
  sums = jnp.sum(jnp.stack([columns & mask, columns >> _PIECE_BITS]), axis=1)
  low, high = sums[0], sums[1]
  return high >> _PIECE_BITS, low + ((high & mask) << _PIECE_BITS)


def _column(w: _exact.Wide, j: int) -> _exact.Wide:
  """Entry ``j`` of the last axis of each limb."""
  return tuple(x[..., j] for x in w)


def _stack_wide(wides: list) -> _exact.Wide:
  """Canonical ``(top, hi, lo)`` stacked along a new leading axis."""
  return tuple(jnp.stack(limb) for limb in zip(*wides))


@jax.jit
def _ranking_compute(hi, lo, top, key_min, key_max, invalid, tpr):
  """:class:`BinnedRanking` of one state ([bins, 4] sums, bins ascending in confidence) and
  whether its losses are graded; ``tpr`` any shape.

  The bins' quantities are stacked and each step runs once on the stack (one conversion
  to float, one product, one sum over the bins, one exact rounding): the program, and its
  compilation, stay small.
  """
  count = (top[:, 0], hi[:, 0], lo[:, 0])
  loss = (top[:, 1], hi[:, 1], lo[:, 1])
  # 0/1 losses add whole multiples of 4096 in the first loss digit and nothing below it.
  graded = jnp.any(loss[2] != 0) | jnp.any(
      (top[:, 2:] != 0) | (hi[:, 2:] != 0) | (lo[:, 2:] != 0))
  errors = _units(loss)
  # Per bin [bins, 2]: (wrong, correct); then at or above it, strictly above and strictly below.
  own = tuple(jnp.stack(pair, axis=-1) for pair in zip(errors, _exact.wide_sub(count, errors)))
  upto = _exact.wide_suffix_sums(own)
  above = _exact.wide_sub(upto, own)
  below = _exact.wide_sub(tuple(x[0] for x in upto), upto)
  e, c = _column(own, 0), _column(own, 1)
  single = key_min == key_max

  # AUROC: twice the numerator, sum_b c_b (2 E'_b + e_b), in exact integers: the limbs of the
  # products c_b E'_b and c_b e_b, the latter split by whether the bin holds one confidence.
  products = _product_limbs(c, _stack_wide([_column(below, 0), e]))  # ten limbs [2, bins]
  pair_columns = ([x[0] for x in products] + [jnp.where(single, x[1], 0) for x in products]
                  + [jnp.where(single, 0, x[1]) for x in products])

  # The exact counts as float32 [bins, 2] each (one conversion): (wrong, correct) in the bin,
  # at or above it, strictly above and strictly below. Sums of these are exact below 2^24.
  floats = _exact.wide_to_float(tuple(jnp.concatenate(limbs, axis=-1)
                                      for limbs in zip(own, upto, above, below)))
  e_f, c_f, e_upto_f, c_upto_f, e_above_f, c_above_f, e_below_f, c_below_f = floats.T
  n_wrong, n_right = e_upto_f[0], c_upto_f[0]  # the lowest bin's "at or above": the totals
  invalid = invalid | _past_capacity(top, hi)
  bad = invalid | (n_right + n_wrong == 0) | graded
  nonempty = (e_f + c_f) > 0
  k_above, k_below = e_above_f + c_above_f, e_below_f + c_below_f

  # Average precision: per bin, recall gained times precision, each float32 term in [0, 1]
  # summed exactly (as average_precision); a bin of one confidence takes the estimate's.
  of_correct = jnp.arange(6) < 3  # rows: AP (estimate, low, high), AP-error (the same)
  estimate = jnp.arange(6) % 3 == 0
  numerators = jnp.stack([c_upto_f, c_above_f + 1.0, c_upto_f, e_below_f + e_f, e_below_f + 1.0,
                          e_below_f + e_f])
  denominators = jnp.stack([k_above + (c_f + e_f), k_above + (e_f + 1.0), k_above + c_f,
                            k_below + (c_f + e_f), k_below + (c_f + 1.0), k_below + e_f])
  precision = numerators / jnp.maximum(denominators, 1.0)
  precision = jnp.where(single | estimate[:, None], precision[jnp.array([0, 0, 0, 3, 3, 3])],
                        precision)
  gained = jnp.where(of_correct[:, None], c_f, e_f)
  gain = gained / jnp.maximum(jnp.where(of_correct, n_right, n_wrong), 1.0)[:, None]
  terms = jnp.where(gained > 0, gain * precision, 0.0)
  digit_columns = list(jnp.concatenate(_exact.wide_digits(terms, 4)))  # 24 [bins], digit-major

  sums_hi, sums_lo = _column_totals(jnp.stack(pair_columns + digit_columns, axis=-1))
  # One exact rounding of nine values: the AUROC (estimate, low, high) twice-numerators
  # 2 S1 + S2_single + (1, 0, 2) S2_other, then the six AP sums.
  auroc_signs = ((0, [(1, 1, 1), (1, 1, 1)]), (10, [(1, 1, 1)]), (20, [(1, 0, 1), (0, 0, 1)]))
  parts = [(jnp.array(sign + (0,) * 6, jnp.int32), sums_hi[first + place],
            sums_lo[first + place], place)
           for first, signs in auroc_signs for sign in signs for place in range(10)]
  pad = jnp.zeros((3,), jnp.int32)
  ap_sums = lambda sums, j: jnp.concatenate([pad, sums[30 + 6 * j:36 + 6 * j]])  # noqa: E731
  parts += [(jnp.array((0,) * 3 + (1,) * 6, jnp.int32), ap_sums(sums_hi, j), ap_sums(sums_lo, j),
             -1 - j) for j in range(4)]
  values = _exact.exact_float(parts)
  pairs = 2.0 * n_right * n_wrong
  both = (n_right > 0) & (n_wrong > 0)
  auroc = jnp.where(both, _stats.divide((values[:3], jnp.maximum(pairs, 1.0)))[0], jnp.nan)
  ap = jnp.where(jnp.where(of_correct, n_right > 0, n_wrong > 0), values[3:], jnp.nan)

  # FPR: the first bin from the top (the last in ascending order) whose threshold reaches tpr.
  rate = _stats.divide((c_upto_f, jnp.maximum(n_right, 1.0)))[0]
  target = tpr.reshape(-1) - _TARGET_SLACK
  reaches = nonempty & (rate >= target[:, None])  # [T, bins]
  star = jnp.max(jnp.where(reaches, jnp.arange(rate.shape[0], dtype=jnp.int32), -1), axis=1)
  at = jnp.maximum(star, 0)
  fpr_high, fpr_low = _stats.divide((e_upto_f[at], jnp.maximum(n_wrong, 1.0)),
                                    (e_above_f[at], jnp.maximum(n_wrong, 1.0)))
  fpr_low = jnp.where(single[at], fpr_high, fpr_low)
  fpr = [jnp.where(both & (star >= 0), x, jnp.nan).reshape(tpr.shape)
         for x in (fpr_high, fpr_low, fpr_high)]

  fin = lambda x: jnp.where(bad, jnp.nan, x)  # noqa: E731
  return BinnedRanking(
      auroc=fin(auroc[0]), auroc_low=fin(auroc[1]), auroc_high=fin(auroc[2]),
      fpr_at_tpr=fin(fpr[0]), fpr_at_tpr_low=fin(fpr[1]), fpr_at_tpr_high=fin(fpr[2]),
      average_precision=fin(ap[0]), average_precision_low=fin(ap[1]),
      average_precision_high=fin(ap[2]), average_precision_error=fin(ap[3]),
      average_precision_error_low=fin(ap[4]), average_precision_error_high=fin(ap[5]),
      exact=jnp.all(single | ~nonempty) & ~bad), graded
