"""Failure-detection ranking metrics: AUROC, FPR at a TPR target and average precision.

These metrics ask how well a score separates correct from wrong predictions,
whatever its scale: the maximum softmax probability, a logit, an energy or a
negative entropy. Only the order of the scores matters, so any finite real
score is accepted (the risk-coverage metrics require [0, 1]).

Notation: ``P`` correct and ``N`` wrong predictions; a threshold ``t`` accepts
the samples with ``score >= t``. Thresholds run over the distinct scores, so
tied samples are accepted or rejected together ("tie groups").

How it is computed, per row: the scores become int32 keys that order like
them (the float32 bit pattern, negative values' bits flipped so that they sort
below the positive ones); one stable sort of the keys (``_sort.sort_with_order``)
orders the correctness flags; int32 prefix counts over the sorted flags give,
at each tie group's start, the correct and wrong samples below it, and a
table indexed by the group number hands every sample its group's counts.
Every count is exact; sums too large for int32 (the AUROC numerator reaches
``P N``) are exact digit sums (``_exact.segment_sums``), and each metric is
rounded to float32 once, or a few times, at the end.

Float64 inputs: float32 cannot tell apart scores such as ``1 - 1e-9`` and
``1 - 1e-10``. Concrete float64 scores (NumPy, Python floats or, with
``jax_enable_x64``, JAX arrays) and integers wider than int32 are therefore
replaced by their dense int32 ranks on the host (NumPy, per row) before the
jitted kernel runs, so their order is the float64 one. Traced scores keep their
float32 order (64-bit tracers are rounded by the kit's entry, ``_public``).

Invalid values: NaN or infinite scores, correctness other than 0/1 (graded
values included), a ``tpr`` outside (0, 1] raise ``ValueError`` on concrete
inputs and give NaN inside a user's ``jax.jit`` / ``jax.vmap`` (for the
invalid row, or target). Gradients: the results are step functions of the
scores and of the correctness; their gradients are 0.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _exact
from cwsa_jax import _order
from cwsa_jax import _public
from cwsa_jax import _validation
from cwsa_jax._kernels import _dispatch
from cwsa_jax._kernels import _sort
from cwsa_jax._risk_coverage import _batched
from cwsa_jax._risk_coverage_kernels import _TARGET_SLACK

POSITIVES = ("correct", "error")

# --------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------


def _score_keys(scores: jax.Array) -> jax.Array:
  """int32 keys that order like ``scores`` [..., n] (any finite values; ties stay ties).

  Integers up to 32 bits are their own keys. Float32: the bit pattern, which
  orders non-negative floats like their values; for negative ones the low 31
  bits are flipped so that a larger magnitude gives a smaller key; -0.0 is
  0.0 first; subnormals keep their order. No derivative (the results are step
  functions of the scores).
  """
  if scores.dtype == jnp.uint32:
    return lax.bitcast_convert_type(scores ^ jnp.uint32(1 << 31), jnp.int32)
  if jnp.issubdtype(scores.dtype, jnp.integer):
    return scores.astype(jnp.int32)
  bits = lax.bitcast_convert_type(lax.stop_gradient(scores).astype(jnp.float32), jnp.int32)
  # On the bits, not the values: XLA:CPU flushes subnormals, so ``x == 0`` would tie them with 0.
  bits = jnp.where(bits == jnp.int32(-2**31), 0, bits)  # -0.0
  return jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _prepare(scores: Any, correct: Any):
  """int32 score keys and bool correctness [..., n], and the row flag (None when checked)."""
  c, k, invalid = _validation.samples(scores, correct, scores=True, unit_scores=False,
                                      graded=False)
  # Integer scores (host ranks among them) keep their exact order; ``c`` is their float32.
  integer = isinstance(scores, (np.ndarray, jax.Array)) and scores.dtype.kind in "iu"
  if k.dtype != jnp.bool_:
    k = k == 1.0  # checked to be 0/1 (flagged otherwise)
  return _score_keys(jnp.asarray(scores) if integer else c), k, invalid


# --------------------------------------------------------------------------
# Kernels (one row; ``_batched`` maps them over the leading axes)
# --------------------------------------------------------------------------


def _tie_groups(keys: jax.Array, correct: jax.Array, kernels: _dispatch.Kernels):
  """Counts per tie group after one sort of the keys [n] in ascending order.

  Returns ``(correct_sorted, new, group, correct_start, wrong_start, P, N)``:
  the int32 0/1 flags in ascending score order, whether each sorted position
  starts a tie group, its group number, and tables [n + 1] of the correct and
  wrong samples below each group's start (entries from the number of groups on
  hold the totals ``P`` and ``N``), all exact int32.
  """
  n = keys.shape[-1]
  sorted_keys, order = _sort.sort_with_order(keys, kernels=kernels)
  flags = jnp.take(correct.astype(jnp.int32), order)
  new = jnp.concatenate([jnp.ones((1,), bool), sorted_keys[1:] != sorted_keys[:-1]])
  group = _sort.cumsum(new.astype(jnp.int32), kernels=kernels) - 1
  correct_below = _sort.cumsum(flags, kernels=kernels) - flags  # below each position
  wrong_below = lax.iota(jnp.int32, n) - correct_below
  num_correct = correct_below[-1] + flags[-1]
  num_wrong = n - num_correct
  slot = jnp.where(new, group, n + 1)  # positions inside a group write nothing
  table = lambda below, total: jnp.full((n + 1,), total, jnp.int32).at[slot].set(  # noqa: E731
      below, mode="drop")
  return (flags, new, group, table(correct_below, num_correct), table(wrong_below, num_wrong),
          num_correct, num_wrong)


def _exact_sum(values: jax.Array, digits, places, kernels: _dispatch.Kernels) -> jax.Array:
  """float32 of the exact sum of ``values`` [n], written as digit columns in [0, 4096]
  (``digits(values)``) of weight ``4096^place``; rounded once."""
  def columns(chunk):
    return jnp.zeros(chunk.shape, jnp.int32), jnp.stack(digits(chunk))

  hi, lo = _exact.segment_sums(columns, [values], 1, kernels=kernels)
  return _exact.exact_float([(1, hi[0, j], lo[0, j], place) for j, place in enumerate(places)])


def _int_digits(t: jax.Array) -> list[jax.Array]:
  """Base-4096 digits of int32 ``t`` in [0, 2^31), least significant first."""
  return [t & 4095, (t >> 12) & 4095, t >> 24]


def _nan_unless(ok: jax.Array, value: jax.Array) -> jax.Array:
  return jnp.where(ok, value, jnp.float32(jnp.nan))


@functools.partial(jax.jit, static_argnames=("kernels",))
def _auroc_impl(keys, correct, *, kernels):
  flags, _, group, _, wrong_start, num_correct, num_wrong = _tie_groups(keys, correct, kernels)
  # Twice the numerator, per correct sample: the wrong ones below its tie group plus those
  # up to its group's end (a tie counts one half). Each term is below 2 N (int32 for n < 2^30).
  twice = flags * (wrong_start[group] + wrong_start[group + 1])
  total = _exact_sum(twice, _int_digits, (0, 1, 2), kernels)
  pairs = 2.0 * num_correct.astype(jnp.float32) * num_wrong.astype(jnp.float32)
  return _nan_unless(pairs > 0, total / jnp.maximum(pairs, 1.0))


@functools.partial(jax.jit, static_argnames=("kernels",))
def _fpr_at_tpr_impl(keys, correct, tpr, *, kernels):
  _, new, group, correct_start, wrong_start, num_correct, num_wrong = _tie_groups(
      keys, correct, kernels)
  # The threshold at each tie group's start accepts that group and every group above it.
  accepted_correct = num_correct - correct_start[group]
  accepted_wrong = num_wrong - wrong_start[group]
  rate = accepted_correct.astype(jnp.float32) / jnp.maximum(num_correct, 1).astype(jnp.float32)
  reaches = new & (rate >= tpr[..., None] - _TARGET_SLACK)  # [*tpr.shape, n]
  fewest = jnp.min(jnp.where(reaches, accepted_wrong, num_wrong), axis=-1)
  fpr = fewest.astype(jnp.float32) / jnp.maximum(num_wrong, 1).astype(jnp.float32)
  return _nan_unless((num_correct > 0) & (num_wrong > 0), fpr)


@functools.partial(jax.jit, static_argnames=("error", "kernels"))
def _average_precision_impl(keys, correct, *, error, kernels):
  n = keys.shape[-1]
  _, new, group, correct_start, wrong_start, num_correct, num_wrong = _tie_groups(
      keys, correct, kernels)
  count_start = correct_start + wrong_start  # samples below each group's start
  if error:  # ranked by the negated score: a threshold accepts a group and those below it
    positives = num_wrong
    retrieved = wrong_start[group + 1]
    in_group = retrieved - wrong_start[group]
    accepted = count_start[group + 1]
  else:  # ranked by the score: a threshold accepts a group and those above it
    positives = num_correct
    retrieved = num_correct - correct_start[group]
    in_group = correct_start[group + 1] - correct_start[group]
    accepted = n - count_start[group]
  # One term per tie group (at its first sorted position): recall gained times precision.
  # Each float32 term lies in [0, 1] and carries a relative error of a few 2^-24.
  to_float = lambda x: x.astype(jnp.float32)  # noqa: E731
  gain = to_float(in_group) / to_float(jnp.maximum(positives, 1))
  precision = to_float(retrieved) / to_float(jnp.maximum(accepted, 1))
  terms = jnp.where(new, gain * precision, 0.0)
  total = _exact_sum(terms, lambda x: _exact.wide_digits(x, 4), (-1, -2, -3, -4), kernels)
  return _nan_unless(positives > 0, total)


# --------------------------------------------------------------------------
# Public metrics
# --------------------------------------------------------------------------


@_order.host_ranked
@_public.entry
def auroc(scores: Any, correct: Any) -> jax.Array:
  r"""Area under the ROC curve of telling correct from wrong predictions by the score.

  .. math::
    \mathrm{AUROC} = \frac{1}{P N} \sum_{i:\,\kappa_i = 1} \sum_{j:\,\kappa_j = 0}
      \left( [s_i > s_j] + \tfrac{1}{2} [s_i = s_j] \right)

  the probability that a random correct prediction scores above a random wrong
  one, ties counting one half (the Mann-Whitney statistic; equal to
  ``sklearn.metrics.roc_auc_score(correct, scores)``). The numerator is summed
  exactly in integers and divided once.

  Args:
    scores: [..., n] any finite real scores; higher means more likely correct.
      Leading axes are batch axes (the function is also ``jax.vmap``-able).
      Concrete float64 scores are ordered by their float64 values.
    correct: [..., n] boolean or 0/1 correctness.

  Returns:
    float32 of shape [...] in [0, 1]; 0.5 is chance, higher is better. NaN
    where every prediction is correct or every one is wrong (``P N = 0``:
    scikit-learn raises there).

  Examples:
    >>> from cwsa_jax import auroc
    >>> print(float(auroc([2.0, -1.0, 0.5, 0.5], [True, False, True, False])))
    0.875

  References:
    Hendrycks & Gimpel, "A baseline for detecting misclassified and
    out-of-distribution examples in neural networks", ICLR 2017; Jaeger et al.,
    "A call to reflect on evaluation practices for failure detection in image
    classification", ICLR 2023 (fd-shifts).
  """
  keys, k, invalid = _prepare(scores, correct)
  fn = functools.partial(_auroc_impl, kernels=_dispatch.DEFAULT)
  return _validation.poison(_batched(fn, keys.ndim)(keys, k), rows=invalid)


@_order.host_ranked
@_public.entry
def fpr_at_tpr(scores: Any, correct: Any, tpr: Any = 0.95) -> jax.Array:
  r"""Fraction of wrong predictions accepted at the first threshold that accepts ``tpr`` of the
  correct ones (FPR@95TPR for the default).

  .. math::
    \mathrm{FPR@TPR}(q) = \min_t \left\{ \frac{\#\{j : \kappa_j = 0,\ s_j \ge t\}}{N}
      \;:\; \frac{\#\{i : \kappa_i = 1,\ s_i \ge t\}}{P} \ge q \right\}

  over the distinct scores ``t`` (ties are accepted together, no
  interpolation): the convention of fd-shifts' ``fpr@95tpr``, equal to the
  smallest ``fpr`` of ``sklearn.metrics.roc_curve`` among its points with
  ``tpr >= q``. ``TPR >= q`` is tested with a slack of 2**-22 so that a
  decimal target such as 0.95 matches a rate of exactly 19/20.

  Args:
    scores: [..., n] any finite real scores; higher means more likely correct.
    correct: [..., n] boolean or 0/1 correctness.
    tpr: target true positive rate(s) in (0, 1], a scalar or any shape.

  Returns:
    float32 of shape ``[...] + tpr.shape`` in [0, 1]; lower is better. NaN where
    every prediction is correct or every one is wrong.

  Examples:
    >>> from cwsa_jax import fpr_at_tpr
    >>> s, ok = [0.9, 0.8, 0.7, 0.6, 0.5], [True, True, False, True, False]
    >>> print([round(float(x), 2) for x in fpr_at_tpr(s, ok, [0.5, 0.95])])
    [0.0, 0.5]

  References:
    Hendrycks & Gimpel, ICLR 2017; Jaeger et al., ICLR 2023 (fd-shifts).
  """
  keys, k, invalid = _prepare(scores, correct)
  t = _validation.as_float_array(tpr, "tpr").astype(jnp.float32)
  target_flag = _validation.check_range(t, "tpr", low_open=True)
  fn = functools.partial(_fpr_at_tpr_impl, kernels=_dispatch.DEFAULT)
  result = _batched(fn, keys.ndim, 1)(keys, k, t)
  return _validation.poison(result, rows=invalid, items=target_flag)


@_order.host_ranked
@_public.entry
def average_precision(scores: Any, correct: Any, *, positive: str = "correct") -> jax.Array:
  r"""Average precision (area under the step-wise precision-recall curve) of the score.

  .. math::
    \mathrm{AP} = \sum_{j=1}^{G} (R_j - R_{j-1})\, \mathrm{Prec}_j,
    \qquad R_j = \frac{TP_j}{TP_G},\quad \mathrm{Prec}_j = \frac{TP_j}{K_j},\quad R_0 = 0

  over the ``G`` distinct thresholds in decreasing order of the ranking
  score, ties forming one threshold; ``TP_j`` positives and ``K_j`` samples
  are accepted at the j-th. No interpolation: equal to
  ``sklearn.metrics.average_precision_score``. ``positive="correct"``: the
  positives are the correct predictions, ranked by the score (AUPR-success);
  ``"error"``: the wrong ones, ranked by the negated score (AUPR-error, as
  fd-shifts reports it).

  Args:
    scores: [..., n] any finite real scores; higher means more likely correct.
    correct: [..., n] boolean or 0/1 correctness.
    positive: ``"correct"`` (default) or ``"error"``.

  Returns:
    float32 of shape [...] in [0, 1]; higher is better. NaN where there is no
    positive.

  Examples:
    >>> from cwsa_jax import average_precision
    >>> s, ok = [0.9, 0.8, 0.7, 0.6], [True, False, False, True]
    >>> print(round(float(average_precision(s, ok)), 4),
    ...       round(float(average_precision(s, ok, positive="error")), 4))
    0.75 0.5833

  References:
    Jaeger et al., "A call to reflect on evaluation practices for failure
    detection in image classification", ICLR 2023 (fd-shifts).
  """
  if positive not in POSITIVES:
    raise ValueError(f"positive must be one of {POSITIVES}, got {positive!r}")
  keys, k, invalid = _prepare(scores, correct)
  fn = functools.partial(_average_precision_impl, error=positive == "error",
                         kernels=_dispatch.DEFAULT)
  return _validation.poison(_batched(fn, keys.ndim)(keys, k), rows=invalid)
