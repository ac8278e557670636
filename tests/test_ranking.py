"""AUROC, FPR@TPR and average precision against slow float64 references and scikit-learn."""

from __future__ import annotations

import fractions
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cwsa_jax
from cwsa_jax._ranking import auroc, average_precision, fpr_at_tpr
from reference import auroc as ref_auroc
from reference import average_precision as ref_average_precision
from reference import fpr_at_tpr as ref_fpr_at_tpr
from cwsa_jax._risk_coverage import augrc

RTOL, ATOL = 1e-6, 1e-7
# Most tests share one sample count so that the jitted kernels compile once per option.
N = 64
TARGETS = (0.3, 0.5, 0.9, 0.95, 1.0)


def _float32(x):
  # The library orders float32 input by its float32 values: compare on those.
  return np.asarray(x, np.float32).astype(np.float64)


def _check_all(scores, correct, targets=TARGETS):
  """Every metric of one row against the references."""
  s64 = _float32(scores) if np.asarray(scores).dtype == np.float32 else np.asarray(scores)
  np.testing.assert_allclose(auroc(scores, correct), ref_auroc(s64, correct), RTOL, ATOL)
  np.testing.assert_allclose(fpr_at_tpr(scores, correct, np.asarray(targets, np.float32)),
                             [ref_fpr_at_tpr(s64, correct, t) for t in targets], RTOL, ATOL)
  for positive in ("correct", "error"):
    np.testing.assert_allclose(average_precision(scores, correct, positive=positive),
                               ref_average_precision(s64, correct, positive), RTOL, ATOL)


def _data(seed, n=N, decimals=1, accuracy=0.7, scale=1.0):
  """Scores with many ties (rounded), float32, and boolean correctness that follows them."""
  rng = np.random.default_rng(seed)
  correct = rng.random(n) < accuracy
  scores = scale * np.round(rng.normal(size=n) + correct, decimals)
  return scores.astype(np.float32), correct


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_random_data_with_ties_matches_reference(seed):
  scores, correct = _data(seed, decimals=seed % 2, accuracy=0.3 + 0.15 * seed)
  assert np.unique(scores).size < N  # ties
  _check_all(scores, correct)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(-4, 4), st.booleans()), min_size=N, max_size=N))
def test_property_matches_reference(pairs):
  scores = np.asarray([s for s, _ in pairs], np.float32) * np.float32(0.25)
  correct = np.asarray([c for _, c in pairs])
  _check_all(scores, correct)


def test_equals_scikit_learn():
  from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
  for seed in range(3):
    scores, correct = _data(10 + seed, decimals=seed)
    s = scores.astype(np.float64)
    np.testing.assert_allclose(auroc(scores, correct), roc_auc_score(correct, s), RTOL, ATOL)
    np.testing.assert_allclose(average_precision(scores, correct),
                               average_precision_score(correct, s), RTOL, ATOL)
    np.testing.assert_allclose(average_precision(scores, correct, positive="error"),
                               average_precision_score(~correct, -s), RTOL, ATOL)
    for drop in (False, True):
      fpr, tpr, _ = roc_curve(correct, s, drop_intermediate=drop)
      np.testing.assert_allclose(fpr_at_tpr(scores, correct), fpr[tpr >= 0.95].min(), RTOL, ATOL)


def test_edge_cases():
  nan = np.nan
  # n = 1: one class only.
  for c in (True, False):
    assert np.isnan(auroc([0.3], [c])) and np.isnan(fpr_at_tpr([0.3], [c]))
  assert float(average_precision([0.3], [True])) == 1.0
  assert np.isnan(average_precision([0.3], [True], positive="error"))
  # Two samples, ordered either way or tied.
  for scores, value in (([2.0, 1.0], 1.0), ([1.0, 2.0], 0.0), ([1.0, 1.0], 0.5)):
    assert float(auroc(scores, [True, False])) == value
    _check_all(np.asarray(scores, np.float32), np.asarray([True, False]))
  # All correct, all wrong, all tied (n = N).
  s, _ = _data(3)
  every, none = np.ones(N, bool), np.zeros(N, bool)
  assert np.isnan(auroc(s, every)) and np.isnan(auroc(s, none))
  assert np.isnan(fpr_at_tpr(s, every)) and np.isnan(fpr_at_tpr(s, none))
  np.testing.assert_allclose([average_precision(s, every), average_precision(s, none)], [1.0, nan])
  np.testing.assert_allclose(average_precision(s, none, positive="error"), 1.0)
  tied = np.full(N, 0.25, np.float32)
  _, correct = _data(4)
  assert float(auroc(tied, correct)) == 0.5 and float(fpr_at_tpr(tied, correct)) == 1.0
  np.testing.assert_allclose(average_precision(tied, correct), correct.mean(), RTOL)
  np.testing.assert_allclose(average_precision(tied, correct, positive="error"),
                             1 - correct.mean(), RTOL)


def test_fd_shifts_vectors():
  # fd-shifts' test cases: equal confidences with alternating correctness, and all wrong.
  equal = np.full(N, 0.7, np.float32)
  alternating = np.arange(N) % 2 == 0
  assert float(auroc(equal, alternating)) == 0.5
  assert float(fpr_at_tpr(equal, alternating)) == 1.0
  assert float(average_precision(equal, alternating)) == 0.5
  assert float(average_precision(equal, alternating, positive="error")) == 0.5
  assert np.isnan(auroc(equal, np.zeros(N, bool)))


def test_real_valued_scores():
  # Any finite real score: negative, huge, tiny, float32's extremes, and -0.0 tied with 0.0.
  rng = np.random.default_rng(5)
  specials = np.float32([-3.4e38, -1e30, -2.5, -1e-30, -0.0, 0.0, 1e-45, 1.5, 1e30, 3.4e38])
  scores = rng.choice(specials, size=N).astype(np.float32)
  correct = rng.random(N) < 0.5
  _check_all(scores, correct)
  assert float(auroc(np.float32([-0.0, 0.0]), [True, False])) == 0.5
  # Only the order matters: an increasing map of the scores changes nothing.
  s, k = _data(6)
  for metric in (auroc, fpr_at_tpr, average_precision):
    assert float(metric(s, k)) == float(metric(np.float32(-1000.0) + 8 * s, k))


def test_permutation_invariant():
  s, k = _data(7)
  perm = np.random.default_rng(0).permutation(N)
  for metric in (auroc, fpr_at_tpr, average_precision):
    assert float(metric(s, k)) == float(metric(s[perm], k[perm]))


def test_float64_order_is_kept():
  scores = 1 - np.array([1e-9, 1e-10, 1e-11, 1e-12])  # one float32 value: 1.0
  correct = np.array([False, True, True, True])
  assert float(auroc(scores, correct)) == ref_auroc(scores, correct) == 1.0
  assert float(auroc(scores.astype(np.float32), correct)) == 0.5  # what float32 would give
  assert float(fpr_at_tpr(scores, correct)) == 0.0
  assert float(average_precision(scores, correct)) == 1.0
  assert float(average_precision(scores, correct, positive="error")) == 1.0
  # Rows of float64 scores closer than float32 can tell, and Python floats.
  rng = np.random.default_rng(8)
  rows = 0.5 + 1e-12 * np.round(rng.normal(size=(2, 3, N)), 1)  # the batch test's shape
  correct = rng.random((2, 3, N)) < 0.6
  for metric, ref in ((auroc, ref_auroc), (average_precision, ref_average_precision)):
    expected = [ref(r, c) for r, c in zip(rows.reshape(6, N), correct.reshape(6, N))]
    np.testing.assert_allclose(metric(rows, correct), np.reshape(expected, (2, 3)), RTOL, ATOL)
  assert float(auroc(list(scores), [False, True, False, True])) == 0.75  # Python floats
  # JAX float64 arrays (64-bit mode) too.
  with jax.enable_x64(True):
    assert float(auroc(jnp.asarray(scores), jnp.asarray([False, True, True, True]))) == 1.0
    # Traced 64-bit scores are rounded to float32 by the kit's entry (documented).
    assert float(jax.jit(auroc)(jnp.asarray(scores), jnp.asarray([False, True, True, True]))) == 0.5


def test_integer_scores_keep_their_order():
  big = np.array([2**40, 2**40 + 1, 2**40 + 2, 2**40 + 3], np.int64)  # equal in float32
  correct = np.array([False, True, False, True])
  assert float(auroc(big, correct)) == ref_auroc(big, correct) == 0.75
  wide = np.array([2**30, 2**30 + 1, 2**30 + 2, 2**30 + 3], np.int32)
  assert float(jax.jit(auroc)(wide, correct)) == 0.75


def test_batch_axes_jit_and_vmap():
  rows = [_data(20 + i) for i in range(6)]
  scores = np.stack([s for s, _ in rows]).reshape(2, 3, N)
  correct = np.stack([k for _, k in rows]).reshape(2, 3, N)
  targets = np.float32([0.5, 0.95])
  expected = {
      "auroc": [[ref_auroc(s, k) for s, k in zip(*r)] for r in zip(scores, correct)],
      "ap": [[ref_average_precision(s, k) for s, k in zip(*r)] for r in zip(scores, correct)],
      "fpr": [[[ref_fpr_at_tpr(s, k, t) for t in targets] for s, k in zip(*r)]
              for r in zip(scores, correct)]}
  np.testing.assert_allclose(auroc(scores, correct), expected["auroc"], RTOL, ATOL)
  np.testing.assert_allclose(average_precision(scores, correct), expected["ap"], RTOL, ATOL)
  out = fpr_at_tpr(scores, correct, targets)
  assert out.shape == (2, 3, 2) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, expected["fpr"], RTOL, ATOL)
  # jit and vmap (over models) give the same values.
  np.testing.assert_allclose(jax.jit(auroc)(scores, correct), expected["auroc"], RTOL, ATOL)
  np.testing.assert_allclose(jax.vmap(fpr_at_tpr, in_axes=(0, 0, None))(scores, correct, targets),
                             expected["fpr"], RTOL, ATOL)


def test_bootstrap_ci():
  scores, correct = _data(30)
  scores = (scores - scores.min()) / (scores.max() - scores.min())  # bootstrap_ci wants [0, 1]
  for fn in (auroc, functools.partial(fpr_at_tpr, tpr=0.9)):
    r = cwsa_jax.bootstrap_ci(fn, scores, correct, key=jax.random.key(0), num_resamples=32)
    np.testing.assert_allclose(r.estimate, fn(scores, correct), RTOL, ATOL)
    assert float(r.low) <= float(r.estimate) <= float(r.high)


def test_consistent_with_augrc():
  # AUGRC (trapezoid) = (1 - AUROC) acc (1 - acc) + (1 - acc)^2 / 2 (see augrc's docstring).
  scores, correct = _data(31, decimals=2)
  scores = (scores - scores.min()) / (scores.max() - scores.min())
  acc = correct.mean()
  expected = (1 - float(auroc(scores, correct))) * acc * (1 - acc) + 0.5 * (1 - acc) ** 2
  np.testing.assert_allclose(augrc(scores, correct, convention="trapezoid"), expected, 1e-5)


def test_exact_beyond_int32():
  # P N > 2^31: the AUROC numerator leaves int32 and is still summed exactly.
  from scipy.stats import rankdata
  from sklearn.metrics import average_precision_score, roc_auc_score
  n = 1 << 17
  rng = np.random.default_rng(9)
  correct = rng.random(n) < 0.5
  scores = np.round(rng.normal(size=n) + 0.3 * correct, 2).astype(np.float32)
  p, m = correct.sum(), (~correct).sum()
  assert p * m > 2**31
  ranks = rankdata(scores.astype(np.float64))  # mid-ranks: ties count one half
  expected = (ranks[correct].sum() - p * (p + 1) / 2) / (p * m)
  np.testing.assert_allclose(auroc(scores, correct), expected, RTOL, ATOL)
  np.testing.assert_allclose(auroc(scores, correct), roc_auc_score(correct, scores), RTOL, ATOL)
  np.testing.assert_allclose(average_precision(scores, correct),
                             average_precision_score(correct, scores.astype(np.float64)),
                             RTOL, ATOL)


def test_gradients_are_zero():
  scores, correct = _data(40)
  for fn in (auroc, fpr_at_tpr, average_precision):
    g = jax.grad(lambda s: fn(s, correct))(jnp.asarray(scores))
    assert g.shape == (N,) and not np.any(g)


def test_kernel_forms_agree():
  # The accelerators' forms (lax.sort, parallel scans, every chunk at once) and the CPU's other
  # stable order, with chunks of the exact sums smaller than the data, give the same values.
  from cwsa_jax._kernels._dispatch import Kernels
  from cwsa_jax._ranking import _auroc_impl, _average_precision_impl, _prepare
  scores, correct = _data(60)
  keys, k, _ = _prepare(scores, correct)
  for kernels in (Kernels(platform="cuda", chunk_size=16),
                  Kernels(platform="cpu", chunk_size=16, stable_by_radix=True)):
    assert float(_auroc_impl(keys, k, kernels=kernels)) == float(auroc(scores, correct))
    assert float(_average_precision_impl(keys, k, error=True, kernels=kernels)) == float(
        average_precision(scores, correct, positive="error"))


# ---------------------------------------------------------------------------
# Invalid inputs
# ---------------------------------------------------------------------------


def test_invalid_inputs_raise_eagerly():
  scores, correct = _data(50)
  for bad in (np.nan, np.inf, -np.inf):
    s = scores.copy()
    s[3] = bad
    for fn in (auroc, fpr_at_tpr, average_precision):
      with pytest.raises(ValueError, match="NaN or infinite"):
        fn(s, correct)
    with pytest.raises(ValueError, match="NaN or infinite"):
      auroc(s.astype(np.float64), correct)  # the float64 path too
  graded = correct.astype(np.float32) * 0.5
  with pytest.raises(ValueError, match="graded"):
    auroc(scores, graded)
  with pytest.raises(ValueError, match="0/1"):
    average_precision(scores, correct.astype(np.int32) * 2)
  with pytest.raises(ValueError, match="same shape"):
    auroc(scores, correct[:-1])
  with pytest.raises(ValueError, match="empty"):
    auroc(np.zeros(0, np.float32), np.zeros(0, bool))
  with pytest.raises(ValueError, match="samples axis"):
    auroc(np.float32(0.5), True)
  for tpr in (0.0, 1.5, np.nan):
    with pytest.raises(ValueError, match="tpr"):
      fpr_at_tpr(scores, correct, tpr)
  with pytest.raises(ValueError, match="positive"):
    average_precision(scores, correct, positive="wrong")


def test_invalid_inputs_give_nan_under_jit():
  scores, correct = _data(51)
  batch = np.stack([scores, scores, scores]).reshape(3, N)
  batch[1, 5] = np.nan
  labels = np.stack([correct] * 3).astype(np.float32)
  labels[2, 7] = 0.5  # graded
  for fn in (auroc, average_precision, fpr_at_tpr):
    out = np.asarray(jax.jit(fn)(batch, labels))
    assert np.isfinite(out[0]) and np.isnan(out[1]) and np.isnan(out[2])
    np.testing.assert_allclose(out[0], fn(scores, correct), RTOL, ATOL)
  out = jax.jit(fpr_at_tpr)(scores, correct, jnp.float32([0.9, 1.5]))
  assert np.isfinite(out[0]) and np.isnan(out[1])


def test_fpr_at_tpr_is_the_correctly_rounded_fraction():
  """j of 95 wrong predictions above every correct one: FPR = j / 95 rounded once (a division
  by a broadcast count must not become a multiplication by its rounded reciprocal)."""
  wrong = 95
  j = np.arange(wrong + 1)[:, None]
  scores = np.where(np.arange(wrong)[None, :] < j, 0.9, 0.1).astype(np.float32)
  scores = np.concatenate([scores, np.full((wrong + 1, 1), 0.5, np.float32)], axis=1)
  correct = np.zeros(scores.shape, bool)
  correct[:, -1] = True
  # One row, two targets: the row's count divides a [2] vector.
  got = np.array([cwsa_jax.fpr_at_tpr(s, k, [0.5, 0.95]) for s, k in zip(scores, correct)])
  want = np.array([[np.float32(float(fractions.Fraction(int(i), wrong)))] * 2 for i in j[:, 0]])
  np.testing.assert_array_equal(got, want)
