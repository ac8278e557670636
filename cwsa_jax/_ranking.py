"""Failure-detection ranking metrics: AUROC, FPR at a TPR target and average precision.

These metrics ask how well a score separates correct from wrong predictions,
whatever its scale: the maximum softmax probability, a logit, an energy or a
negative entropy. Only the order of the scores matters, so any finite real
score is accepted, eagerly and inside ``jit`` / ``vmap`` alike (the keys below order
float32 values of any sign, so no stand-ins are needed in the program).

Notation: ``P`` correct and ``N`` wrong predictions; a threshold ``t`` accepts
the samples with ``score >= t``. Thresholds run over the distinct scores, so
tied samples are accepted or rejected together ("tie groups").

How it is computed, per row: the scores become int32 keys that order like
them (the float32 bit pattern, negative values' bits flipped so that they sort
below the positive ones), inside the jitted kernel. AUROC and AP: one sort of
the (key, correctness) pairs (:func:`_sorted_outcomes`: on the CPU one NumPy
sort of packed words, 32 bits wide when the keys allow; no stable order, as
only tie groups' counts are read); int32 prefix counts over the sorted flags
give, at each tie group's start, the correct and wrong samples below it, and a
table indexed by the group number hands every sample its group's counts.
FPR@TPR needs no sort above a few ten thousand samples: the target fixes the
fewest correct samples a threshold must accept (a binary search over the
integers of the rate test), and a radix select finds that threshold's key.
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
from cwsa_jax import _stats
from cwsa_jax import _validation
from cwsa_jax._kernels import _dispatch
from cwsa_jax._kernels import _sort
from cwsa_jax._risk_coverage import _batched
from cwsa_jax._risk_coverage_kernels import _TARGET_SLACK

POSITIVES = ("correct", "error")

# --------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------


# int32 keys that order like the scores (``_order.order_keys``: float bits, negatives flipped).
_score_keys = _order.order_keys


def _inputs(scores: Any, correct: Any):
  """Checked ``(scores, correct, row flag)`` [..., n] for the jitted kernels, which make the
  keys (:func:`_kernel_inputs`): no eager pass over the samples beyond the checks."""
  c, k, invalid = _validation.samples(scores, correct, scores=True, unit_scores=False,
                                      graded=False)
  # Integer scores (host ranks among them) keep their exact order; ``c`` is their float32.
  integer = isinstance(scores, (np.ndarray, jax.Array)) and scores.dtype.kind in "iu"
  return (jnp.asarray(scores) if integer else c), k, invalid


def _kernel_inputs(scores: jax.Array, correct: jax.Array):
  """int32 keys and bool correctness [..., n] of checked inputs; int32 keys stay as they are."""
  if correct.dtype != jnp.bool_:
    correct = correct == 1.0  # checked to be 0/1 (flagged otherwise)
  return _score_keys(scores), correct


def _prepare(scores: Any, correct: Any):
  """int32 score keys and bool correctness [..., n], and the row flag (None when checked)."""
  s, k, invalid = _inputs(scores, correct)
  return *_kernel_inputs(s, k), invalid


# --------------------------------------------------------------------------
# Kernels (one row; ``_batched`` maps them over the leading axes)
# --------------------------------------------------------------------------


def _host_sorted_outcomes(keys: jax.Array, correct: jax.Array):
  """:func:`_sorted_outcomes` in NumPy: one sort of packed words, the flag in the low bit."""
  def fill(outs, keys, correct):
    out_keys, out_flags = outs
    if keys.size == 0:
      return
    low, high = int(keys.min()), int(keys.max())
    if high - low < 2**31:  # the usual case ([0, 1] confidences, ranks): 32-bit words
      words = (keys - np.int32(low)).view(np.uint32) << np.uint32(1)
      low_key = np.int32(low)
    else:  # keys spread over more than 31 bits (negative and positive scores): 64-bit words
      words = keys.astype(np.int64) << 1
      low_key = None
    words |= correct
    words.sort(axis=-1)
    np.bitwise_and(words, 1, out=out_flags, casting="unsafe")
    words >>= 1
    if low_key is None:
      out_keys[...] = words
    else:
      np.add(words.view(np.int32), low_key, out=out_keys)

  shape = jax.ShapeDtypeStruct(keys.shape, jnp.int32)
  return _sort._host(fill, (shape, shape), keys, correct)


def _device_sorted_outcomes(keys: jax.Array, correct: jax.Array):
  return lax.sort((keys, correct.astype(jnp.int32)), num_keys=2)


def _sorted_outcomes(keys: jax.Array, correct: jax.Array, kernels: _dispatch.Kernels):
  """``(sorted keys, flags)`` int32 [n]: the keys in ascending order and the 0/1 correctness
  beside them, wrong before correct within a tie group.

  Every metric here reads a tie group's counts only, never which sample sits
  where inside it, so no stable order (and no gather of the flags by it) is
  needed: on the CPU one NumPy sort of words ``(key - min) << 1 | flag``
  (32 bits wide when the keys span fewer than 2^31 values, else 64), on
  other platforms ``lax.sort`` of the (key, flag) pairs; the same result.
  """
  return kernels.pick("sort", keys, correct, cpu=_host_sorted_outcomes,
                      default=_device_sorted_outcomes)


def _tie_groups(keys: jax.Array, correct: jax.Array, kernels: _dispatch.Kernels):
  """Counts per tie group after one sort of the keys [n] in ascending order.

  Returns ``(correct_sorted, new, group, correct_start, wrong_start, P, N)``:
  the int32 0/1 flags in ascending score order, whether each sorted position
  starts a tie group, its group number, and tables [n + 1] of the correct and
  wrong samples below each group's start (entries from the number of groups on
  hold the totals ``P`` and ``N``), all exact int32.
  """
  n = keys.shape[-1]
  flags, new, correct_below, num_correct = _group_starts(keys, correct, kernels)
  group = _sort.cumsum(new.astype(jnp.int32), kernels=kernels) - 1
  wrong_below = lax.iota(jnp.int32, n) - correct_below
  num_wrong = n - num_correct
  slot = jnp.where(new, group, n + 1)  # positions inside a group write nothing
  table = lambda below, total: jnp.full((n + 1,), total, jnp.int32).at[slot].set(  # noqa: E731
      below, mode="drop")
  return (flags, new, group, table(correct_below, num_correct), table(wrong_below, num_wrong),
          num_correct, num_wrong)


def _group_starts(keys: jax.Array, correct: jax.Array, kernels: _dispatch.Kernels):
  """``(flags, new, correct_below, P)`` after one sort of the keys [n]: the sorted int32
  flags, whether each sorted position starts a tie group, the correct samples below each
  position (exact at a group's start, whatever the order inside the groups) and their total."""
  sorted_keys, flags = _sorted_outcomes(keys, correct, kernels)
  new = jnp.concatenate([jnp.ones((1,), bool), sorted_keys[1:] != sorted_keys[:-1]])
  correct_below = _sort.cumsum(flags, kernels=kernels) - flags
  return flags, new, correct_below, correct_below[-1] + flags[-1]


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
  keys, correct = _kernel_inputs(keys, correct)
  flags, _, group, _, wrong_start, num_correct, num_wrong = _tie_groups(keys, correct, kernels)
  # Twice the numerator, per correct sample: the wrong ones below its tie group plus those
  # up to its group's end (a tie counts one half). Each term is below 2 N (int32 for n < 2^30).
  twice = flags * (wrong_start[group] + wrong_start[group + 1])
  total = _exact_sum(twice, _int_digits, (0, 1, 2), kernels)
  pairs = 2.0 * num_correct.astype(jnp.float32) * num_wrong.astype(jnp.float32)
  return _nan_unless(pairs > 0, total / jnp.maximum(pairs, 1.0))


# Radix select: two levels of 16-bit digits of the unsigned keys; below this many samples one
# sort costs less than the two 2^16-bucket histograms and their prefix sums.
_DIGIT_BITS = 16
_SELECT_MIN_N = 1 << 15


def _fewest_correct(num_correct: jax.Array, tpr: jax.Array) -> jax.Array:
  """int32 [*tpr.shape]: the least ``A`` in [0, P] with ``f32(A) / f32(max(P, 1)) >= tpr - slack``
  (``P + 1`` where there is none).

  The rate test of a threshold accepting ``A`` correct samples, exactly as written, is
  monotone in ``A``: a binary search over the integers (32 steps cover int32) finds
  where it turns true, so it is evaluated only at integers and never inverted in floats.
  """
  target = tpr - _TARGET_SLACK
  total = jnp.maximum(num_correct, 1).astype(jnp.float32)

  def step(_, bounds):
    low, high = bounds  # the answer lies in [low, high]
    mid = low + (high - low) // 2
    ok = mid.astype(jnp.float32) / total >= target
    return jnp.where(ok, low, mid + 1), jnp.where(ok, mid, high)

  start = (jnp.zeros(tpr.shape, jnp.int32), jnp.full(tpr.shape, num_correct + 1, jnp.int32))
  return lax.fori_loop(0, 32, step, start)[1]


def _fewest_wrong_by_sort(keys, correct, fewest_correct, kernels):
  """Wrong samples accepted at the highest tie-group start that accepts at least
  ``fewest_correct`` [T] correct ones (all N where none does): one sort, read at the starts."""
  n = keys.shape[-1]
  _, new, correct_below, num_correct = _group_starts(keys, correct, kernels)
  accepted_correct = num_correct - correct_below
  accepted_wrong = (n - num_correct) - (lax.iota(jnp.int32, n) - correct_below)
  reaches = new & (accepted_correct >= fewest_correct[:, None])  # [T, n]
  return jnp.min(jnp.where(reaches, accepted_wrong, n - num_correct), axis=-1)


def _fewest_wrong_by_select(keys, correct, fewest_correct, kernels):
  """As :func:`_fewest_wrong_by_sort`, with no sort: that threshold is the ``A``-th largest
  correct key (the largest key where ``A = 0``), found by a radix select of the ``r = P - A``-th
  smallest: a histogram of the high digits of the correct keys locates its bucket and its rank
  inside, a second of the low digits inside that bucket its key; one more pass counts the
  wrong samples at or above it."""
  size = 1 << _DIGIT_BITS
  unsigned = lax.bitcast_convert_type(keys, jnp.uint32) ^ jnp.uint32(0x80000000)  # same order
  high = (unsigned >> _DIGIT_BITS).astype(jnp.int32)
  low = (unsigned & (size - 1)).astype(jnp.int32)
  flags = correct.astype(jnp.int32)
  hist = jax.ops.segment_sum(flags, high, num_segments=size)
  cum = _sort.cumsum(hist, kernels=kernels)  # correct keys in buckets <= b
  num_correct = cum[-1]

  def select(rank):  # the rank-th smallest correct key (0-based; rank < P)
    bucket = jnp.searchsorted(cum, rank, side="right").astype(jnp.int32)
    inside = rank - (cum[bucket] - hist[bucket])
    ids = jnp.where(high == bucket, low, size)  # other buckets: out of range, dropped
    cum_low = _sort.cumsum(jax.ops.segment_sum(flags, ids, num_segments=size), kernels=kernels)
    digit = jnp.searchsorted(cum_low, inside, side="right").astype(jnp.uint32)
    return (bucket.astype(jnp.uint32) << _DIGIT_BITS) | digit

  rank = jnp.clip(num_correct - fewest_correct, 0, jnp.maximum(num_correct - 1, 0))
  threshold = jnp.where(fewest_correct == 0, jnp.max(unsigned), jax.vmap(select)(rank))
  above = jnp.sum(~correct & (unsigned >= threshold[:, None]), axis=-1, dtype=jnp.int32)
  return jnp.where(fewest_correct > num_correct, keys.shape[-1] - num_correct, above)


@functools.partial(jax.jit, static_argnames=("kernels",))
def _fpr_at_tpr_impl(keys, correct, tpr, *, kernels):
  keys, correct = _kernel_inputs(keys, correct)
  n = keys.shape[-1]
  num_correct = jnp.sum(correct, dtype=jnp.int32)
  num_wrong = n - num_correct
  # The threshold at each tie group's start accepts that group and every group above it; the
  # rate it reaches falls as the threshold rises, so the fewest wrong ones accepted among the
  # starts that reach the target are those of the highest such start.
  need = _fewest_correct(num_correct, tpr).reshape(-1)
  by_sort = functools.partial(_fewest_wrong_by_sort, kernels=kernels)
  if n < _SELECT_MIN_N:
    fewest = by_sort(keys, correct, need)
  else:  # a sort on CUDA GPUs, whose scatter-adds contend (as ``_sort.order_statistics``)
    by_select = functools.partial(_fewest_wrong_by_select, kernels=kernels)
    fewest = kernels.pick("select", keys, correct, need,
                          cuda=by_sort if kernels.select_by_sort else None, default=by_select)
  fpr, = _stats.divide((fewest.reshape(tpr.shape).astype(jnp.float32),
                        jnp.maximum(num_wrong, 1).astype(jnp.float32)))
  return _nan_unless((num_correct > 0) & (num_wrong > 0), fpr)


@functools.partial(jax.jit, static_argnames=("error", "kernels"))
def _average_precision_impl(keys, correct, *, error, kernels):
  keys, correct = _kernel_inputs(keys, correct)
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
  keys, k, invalid = _inputs(scores, correct)
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
  keys, k, invalid = _inputs(scores, correct)
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
  keys, k, invalid = _inputs(scores, correct)
  fn = functools.partial(_average_precision_impl, error=positive == "error",
                         kernels=_dispatch.DEFAULT)
  return _validation.poison(_batched(fn, keys.ndim)(keys, k), rows=invalid)
