"""Risk-coverage curve, AURC, AUGRC, E-AURC and working points against float64 NumPy references."""

from __future__ import annotations

import functools
import zlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference

from cwsa_jax._risk_coverage import (
    aurc, augrc, coverage_at_risk, eaurc, risk_at_coverage, risk_coverage_curve,
    risk_coverage_summary)

CONVENTIONS = ("step", "trapezoid", "published_code")
TOL = 2e-6
# Most tests share one sample count so the jitted functions compile once per option.
N = 256


# ---------------------------------------------------------------------------
# Slow float64 references (tests/reference.py): one threshold at a time, no sorting tricks.
# ---------------------------------------------------------------------------

ref_points = reference.risk_coverage_points  # (threshold, accepted count, summed loss)
ref_aurc = reference.aurc  # (conf, correct, convention, generalized=False)


def _f64(conf):
  # The library computes in float32; compare on the same (float32) confidences.
  return np.asarray(conf, np.float32).astype(np.float64)


def ref_published(conf, correct):
  return reference.aurc(conf, correct, "published_code")


def ref_min_aurc_bruteforce(correct, convention):
  """Smallest AURC over *every* scoring (all weak orders via score levels) of tiny inputs."""
  n = len(correct)
  best = np.inf
  for levels in itertools.product(range(n), repeat=n):
    best = min(best, ref_aurc(np.asarray(levels) / n, correct, convention))
  return best


def ref_auroc(conf, correct):
  """AUROC of confidence separating correct (positive) from wrong, ties count 1/2."""
  conf = _f64(conf)
  correct = np.asarray(correct, bool)
  pos, neg = conf[correct], conf[~correct]
  greater = (pos[:, None] > neg[None, :]).sum()
  ties = (pos[:, None] == neg[None, :]).sum()
  return (greater + 0.5 * ties) / (len(pos) * len(neg))


def random_case(rng, n, *, decimals=None, accuracy=0.7):
  conf = rng.random(n)
  if decimals is not None:
    conf = np.round(conf, decimals)  # many ties
  correct = rng.random(n) < accuracy
  return conf.astype(np.float32), correct


# ---------------------------------------------------------------------------
# Worked examples from the issue
# ---------------------------------------------------------------------------


def test_worked_example_aurc():
  conf, correct = [0.7, 0.6, 0.8], [True, False, True]
  assert float(aurc(conf, correct)) == pytest.approx(1 / 9, abs=TOL)
  assert float(aurc(conf, correct, convention="step")) == pytest.approx(1 / 9, abs=TOL)
  assert float(aurc(conf, correct, convention="trapezoid")) == pytest.approx(1 / 18, abs=TOL)
  # The published code's trapezoid over [1/n, 1] (PAPER_NOTES: 0.0556 on this input).
  assert float(aurc(conf, correct, convention="published_code")) == pytest.approx(1 / 18, abs=TOL)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_all_equal_confidences_half_wrong_is_half_in_any_order(convention):
  rng = np.random.default_rng(0)
  correct = np.array([True, False] * (N // 2))
  for _ in range(5):
    perm = rng.permutation(N)
    value = aurc(np.full(N, 0.6), correct[perm], convention=convention)
    assert float(value) == pytest.approx(0.5, abs=TOL)


def test_published_code_depends_on_order_of_ties():
  conf = np.full(N, 0.6)
  first = np.arange(N) < N // 2
  a = float(aurc(conf, first, convention="published_code"))
  b = float(aurc(conf, ~first, convention="published_code"))
  assert a == pytest.approx(ref_published(conf, first), abs=TOL)
  assert b == pytest.approx(ref_published(conf, ~first), abs=TOL)
  assert a < b  # the tie order changes the number: why it is not the default


def test_input_order_never_matters_for_tie_grouped_conventions():
  rng = np.random.default_rng(1)
  conf, correct = random_case(rng, N, decimals=1)
  perm = rng.permutation(N)
  for convention in ("step", "trapezoid"):
    for fn in (aurc, augrc, eaurc):
      a = fn(conf, correct, convention=convention)
      b = fn(conf[perm], correct[perm], convention=convention)
      assert float(a) == pytest.approx(float(b), abs=1e-7)


# ---------------------------------------------------------------------------
# Against the references
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("decimals", [None, 2, 1])
def test_aurc_augrc_match_reference(convention, decimals):
  rng = np.random.default_rng(zlib.crc32(repr((convention, decimals)).encode()))
  conf, correct = random_case(rng, N, decimals=decimals)
  assert float(aurc(conf, correct, convention=convention)) == pytest.approx(
      ref_aurc(conf, correct, convention), abs=TOL)
  assert float(augrc(conf, correct, convention=convention)) == pytest.approx(
      ref_aurc(conf, correct, convention, generalized=True), abs=TOL)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.9, 1.0]), st.booleans()),
                min_size=8, max_size=8),  # one size: one compilation per convention
       st.sampled_from(CONVENTIONS))
def test_hypothesis_small_inputs(pairs, convention):
  conf = np.array([p[0] for p in pairs], np.float32)
  correct = np.array([p[1] for p in pairs])
  s = risk_coverage_summary(conf, correct, convention=convention)
  assert float(s.aurc) == pytest.approx(ref_aurc(conf, correct, convention), abs=TOL)
  assert float(s.augrc) == pytest.approx(ref_aurc(conf, correct, convention, True), abs=TOL)
  assert float(s.eaurc) >= 0.0


def test_graded_correctness_matches_reference():
  rng = np.random.default_rng(2)
  conf = np.round(rng.random(N), 2).astype(np.float32)
  kappa = rng.random(N).astype(np.float32)
  for convention in CONVENTIONS:
    assert float(aurc(conf, kappa, convention=convention)) == pytest.approx(
        ref_aurc(conf, kappa, convention), abs=TOL)
    assert float(augrc(conf, kappa, convention=convention)) == pytest.approx(
        ref_aurc(conf, kappa, convention, True), abs=TOL)
  pts = ref_points(conf, kappa)
  curve = risk_coverage_curve(conf, kappa)
  m = int(curve.num_points)
  assert m == len(pts)
  np.testing.assert_allclose(curve.risk[:m], [e / k for _, k, e in pts], atol=TOL)
  assert float(risk_at_coverage(conf, kappa, 0.5)) == pytest.approx(
      ref_risk_at_coverage(conf, kappa, 0.5), abs=TOL)


def test_float_zero_one_correctness_equals_boolean():
  rng = np.random.default_rng(3)
  conf, correct = random_case(rng, N, decimals=2)
  for convention in CONVENTIONS:
    assert float(aurc(conf, correct.astype(np.float32), convention=convention)) == float(
        aurc(conf, correct, convention=convention))
  # Inside jit a float array takes the graded path: same value within float32 rounding.
  jitted = jax.jit(aurc)
  assert float(jitted(conf, correct.astype(np.float32))) == pytest.approx(
      float(aurc(conf, correct)), abs=TOL)


def test_float32_accuracy_at_larger_n():
  rng = np.random.default_rng(4)
  n = 200_000
  conf = np.round(rng.random(n), 4).astype(np.float32)
  correct = rng.random(n) < 0.9
  # Vectorised float64 reference (the loop reference above is too slow at this n).
  c64 = conf.astype(np.float64)
  order = np.argsort(-c64, kind="stable")
  cum = np.cumsum(~correct[order]).astype(np.float64)
  k = np.arange(1, n + 1, dtype=np.float64)
  ends = np.r_[c64[order][:-1] != c64[order][1:], True]
  ke, ee = k[ends], cum[ends]
  widths = np.diff(np.r_[0.0, ke])
  step = np.sum(widths * ee / ke) / n
  assert float(aurc(conf, correct)) == pytest.approx(step, abs=TOL)
  assert float(augrc(conf, correct)) == pytest.approx(np.sum(widths * ee) / n / n, abs=TOL)


# ---------------------------------------------------------------------------
# E-AURC and the optimal scorings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("correct", [
    [True, False, True, True, False],
    [False, True, True, True, True],
    [True, True, True, True, False],
    [False, False, True, False, False],
])
def test_eaurc_optimum_equals_bruteforce_minimum(convention, correct):
  correct = np.array(correct)
  minimum = ref_min_aurc_bruteforce(correct, convention)
  rng = np.random.default_rng(5)
  for _ in range(4):
    conf = rng.choice([0.2, 0.4, 0.6, 0.8], size=len(correct)).astype(np.float32)
    expected = ref_aurc(conf, correct, convention) - minimum
    assert float(eaurc(conf, correct, convention=convention)) == pytest.approx(expected, abs=TOL)


def test_eaurc_exactly_zero_for_a_perfect_ranking():
  rng = np.random.default_rng(6)
  correct = rng.random(N) < 0.8
  strict = np.where(correct, 0.5 + rng.random(N) * 0.5, rng.random(N) * 0.5)
  strict = strict.astype(np.float32)
  assert len(np.unique(strict)) == N
  two_level = np.where(correct, 0.9, 0.1)
  assert float(eaurc(strict, correct, convention="step")) == 0.0
  assert float(eaurc(strict, correct, convention="published_code")) == 0.0
  assert float(eaurc(two_level, correct, convention="trapezoid")) == 0.0
  # Ties among the correct samples cost nothing under "step" either.
  tied_correct = np.where(correct, 1.0, strict)
  assert float(eaurc(tied_correct, correct, convention="step")) == 0.0
  # ...but a strict order is not optimal under "trapezoid" (its curve is concave).
  assert float(eaurc(strict, correct, convention="trapezoid")) > 0.0
  # ...and tying the errors is not optimal under "step".
  assert float(eaurc(two_level, correct, convention="step")) > 0.0


def test_eaurc_nonnegative_on_random_data():
  rng = np.random.default_rng(7)
  for trial in range(10):
    conf, correct = random_case(rng, N, decimals=trial % 3 + 1, accuracy=0.5 + 0.05 * trial)
    for convention in CONVENTIONS:
      assert float(eaurc(conf, correct, convention=convention)) >= 0.0


def test_summary_equals_separate_functions():
  rng = np.random.default_rng(8)
  conf, correct = random_case(rng, N, decimals=2)
  for convention in CONVENTIONS:
    s = risk_coverage_summary(conf, correct, convention=convention)
    assert float(s.aurc) == pytest.approx(float(aurc(conf, correct, convention=convention)), abs=1e-7)
    assert float(s.augrc) == pytest.approx(float(augrc(conf, correct, convention=convention)), abs=1e-7)
    assert float(s.eaurc) == float(eaurc(conf, correct, convention=convention))
  graded = risk_coverage_summary(conf, correct * 0.5)
  assert np.isnan(float(graded.eaurc))


# ---------------------------------------------------------------------------
# AUGRC
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [N])
def test_augrc_perfect_ranking_is_half_error_rate_squared(n):
  rng = np.random.default_rng(n)
  correct = np.arange(n) < int(0.7 * n)
  rng.shuffle(correct)
  err = 1.0 - correct.mean()
  strict = np.where(correct, 1.0 - np.arange(n) / (2 * n), 0.4 - np.arange(n) / (4 * n))
  two_level = np.where(correct, 0.9, 0.2)
  # Trapezoid: exactly 0.5 err^2 for both optimal scorings (the curve is the straight line).
  assert float(augrc(two_level, correct, convention="trapezoid")) == pytest.approx(0.5 * err**2, abs=TOL)
  assert float(augrc(strict, correct, convention="trapezoid")) == pytest.approx(0.5 * err**2, abs=TOL)
  # Step: 0.5 err^2 + err / (2n), i.e. + O(1/n).
  step = float(augrc(strict, correct, convention="step"))
  assert step == pytest.approx(0.5 * err**2 + err / (2 * n), abs=TOL)
  assert step - 0.5 * err**2 <= 1.0 / n


def test_augrc_trapezoid_auroc_identity():
  # Traub et al. (2024): AUGRC = (1 - AUROC_f) acc (1 - acc) + 0.5 (1 - acc)^2,
  # exact for the tie-grouped trapezoid with ties counted 1/2 in the AUROC.
  rng = np.random.default_rng(9)
  for decimals in (None, 1, 2):
    conf, correct = random_case(rng, N, decimals=decimals, accuracy=0.6)
    acc = correct.mean()
    expected = (1 - ref_auroc(conf, correct)) * acc * (1 - acc) + 0.5 * (1 - acc) ** 2
    assert float(augrc(conf, correct, convention="trapezoid")) == pytest.approx(expected, abs=TOL)


# ---------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_all_correct_all_wrong_one_sample(convention):
  n = N
  conf = np.linspace(0.0, 1.0, n)
  assert float(aurc(conf, np.ones(n, bool), convention=convention)) == 0.0
  assert float(augrc(conf, np.ones(n, bool), convention=convention)) == 0.0
  assert float(eaurc(conf, np.ones(n, bool), convention=convention)) == 0.0
  wrong = np.zeros(n, bool)
  expected = (n - 1) / n if convention == "published_code" else 1.0
  assert float(aurc(conf, wrong, convention=convention)) == pytest.approx(expected, abs=TOL)
  assert float(eaurc(conf, wrong, convention=convention)) == 0.0
  # One sample: the curve is one point. The published recipe integrates over [1, 1] -> 0.
  for value in (True, False):
    single = float(aurc([0.3], [value], convention=convention))
    assert single == pytest.approx(ref_aurc([0.3], [value], convention), abs=TOL)
    assert float(eaurc([0.3], [value], convention=convention)) == 0.0


def test_confidences_zero_and_one_and_negative_zero():
  conf = np.resize(np.array([0.0, 1.0, -0.0, 1.0, 0.5, 0.0], np.float32), N)
  correct = np.resize(np.array([True, True, False, False, True, False, True]), N)
  for convention in CONVENTIONS:
    assert float(aurc(conf, correct, convention=convention)) == pytest.approx(
        ref_aurc(conf, correct, convention), abs=TOL)
  curve = risk_coverage_curve(conf, correct)
  assert int(curve.num_points) == 3  # -0.0 and 0.0 are one tie group
  np.testing.assert_allclose(curve.thresholds[:3], [1.0, 0.5, 0.0])


# ---------------------------------------------------------------------------
# Curve and working points
# ---------------------------------------------------------------------------


def test_curve_matches_reference_and_is_padded():
  rng = np.random.default_rng(10)
  conf, correct = random_case(rng, N, decimals=2)
  curve = risk_coverage_curve(conf, correct)
  pts = ref_points(conf, correct)
  m = int(curve.num_points)
  assert m == len(pts)
  np.testing.assert_allclose(curve.thresholds[:m], [p[0] for p in pts], atol=0)
  np.testing.assert_allclose(curve.coverage[:m], [p[1] / N for p in pts], atol=TOL)
  np.testing.assert_allclose(curve.risk[:m], [p[2] / p[1] for p in pts], atol=TOL)
  np.testing.assert_allclose(curve.generalized_risk[:m], [p[2] / N for p in pts], atol=TOL)
  # Padding repeats the last point.
  np.testing.assert_array_equal(curve.coverage[m:], 1.0)
  np.testing.assert_array_equal(curve.risk[m:], curve.risk[m - 1])


def _f32_quotient(a, b: int) -> np.float32:
  """a / b rounded once to float32, for a float32 (or a half-integer) and an integer b < 2^23.

  The float64 quotient is then rounded again, which is exact here: a / b lies at least
  2^-49 (relative) from any float32 midpoint, far more than float64's 2^-53.
  """
  return np.float32(np.float64(a) / b)


def test_divisions_by_n_rounded_once():
  # n = 255 is static in every kernel, and XLA turns x / n into x * (1/n): 1 ulp off in about
  # half the cases. Binary outcomes at n = 255 make every numerator exact (integers, or
  # half-integers for the trapezoids), so each result must be the correctly rounded quotient.
  n = 255
  rng = np.random.default_rng(14)
  parallel = _kernels(False)[0]
  for draw in range(6):
    conf, correct = random_case(rng, n, decimals=2)
    for conv in CONVENTIONS:
      twice_sum = round(2 * n * n * ref_aurc(conf, correct, conv, generalized=True))
      want = _f32_quotient(_f32_quotient(twice_sum / 2, n), n)
      assert np.float32(augrc(conf, correct, convention=conv)) == want, (draw, conv)
      assert np.float32(parallel[conv](conf, correct).augrc) == want, (draw, conv)
    curve = risk_coverage_curve(conf, correct)
    points = ref_points(conf, correct)
    m = int(curve.num_points)
    assert [_f32_quotient(k, n) for _, k, _ in points] == list(np.asarray(curve.coverage[:m]))
    assert ([_f32_quotient(round(e), n) for _, _, e in points]
            == list(np.asarray(curve.generalized_risk[:m])))
  achievable = {_f32_quotient(k, n) for k in range(n + 1)}
  found = np.asarray(coverage_at_risk(conf, correct, np.linspace(0.05, 0.6, 12)))
  assert set(found.tolist()) <= achievable


def ref_risk_at_coverage(conf, correct, q):
  for _, k, e in ref_points(conf, correct):
    if k / len(conf) >= q:
      return e / k
  raise AssertionError


def ref_coverage_at_risk(conf, correct, r):
  ok = [k / len(conf) for _, k, e in ref_points(conf, correct) if e / k <= r]
  return max(ok, default=0.0)


def test_working_points_match_reference():
  rng = np.random.default_rng(11)
  conf, correct = random_case(rng, N, decimals=2, accuracy=0.8)
  qs = np.array([0.013, 0.1, 0.25, 0.5, 0.777, 1.0])
  got = risk_at_coverage(conf, correct, qs)
  assert got.shape == qs.shape
  np.testing.assert_allclose(got, [ref_risk_at_coverage(conf, correct, q) for q in qs], atol=TOL)
  rs = np.array([0.0, 0.031, 0.1, 0.15, 0.213, 1.0])
  got = coverage_at_risk(conf, correct, rs)
  np.testing.assert_allclose(got, [ref_coverage_at_risk(conf, correct, r) for r in rs], atol=TOL)
  assert float(risk_at_coverage(conf, correct, 0.5)) == pytest.approx(
      ref_risk_at_coverage(conf, correct, 0.5), abs=TOL)


def test_working_points_with_ties_and_no_qualifying_point():
  conf = [0.9, 0.9, 0.5, 0.5]
  correct = [True, False, True, True]
  # Coverage 0.25 is not achievable: the first tie group already covers 0.5.
  assert float(risk_at_coverage(conf, correct, 0.25)) == pytest.approx(0.5, abs=TOL)
  assert float(coverage_at_risk(conf, correct, 0.2)) == pytest.approx(0.0, abs=TOL)
  assert float(coverage_at_risk(conf, correct, 0.25)) == pytest.approx(1.0, abs=TOL)


# ---------------------------------------------------------------------------
# jit, vmap, batches
# ---------------------------------------------------------------------------


def test_jit_vmap_and_batch_axes_agree_with_a_loop():
  rng = np.random.default_rng(12)
  conf = np.round(rng.random((3, N)), 1).astype(np.float32)
  correct = rng.random((3, N)) < 0.7
  loop = np.array([float(aurc(conf[i], correct[i], convention="trapezoid")) for i in range(3)])
  np.testing.assert_allclose(aurc(conf, correct, convention="trapezoid"), loop, atol=1e-7)
  loop = np.array([float(aurc(conf[i], correct[i])) for i in range(3)])
  np.testing.assert_allclose(jax.vmap(aurc)(conf, correct), loop, atol=1e-7)
  np.testing.assert_allclose(jax.jit(aurc)(conf[0], correct[0]), loop[0], atol=1e-7)
  trap = functools.partial(eaurc, convention="trapezoid")
  e_loop = [float(trap(conf[i], correct[i])) for i in range(3)]
  np.testing.assert_allclose(jax.vmap(trap)(conf, correct), e_loop, atol=1e-7)
  curves = jax.vmap(risk_coverage_curve)(conf, correct)
  assert curves.coverage.shape == (3, N) and curves.num_points.shape == (3,)
  qs = jnp.array([0.3, 0.9])
  r = jax.jit(risk_at_coverage)(conf, correct, qs)
  assert r.shape == (3, 2)
  np.testing.assert_allclose(r[1], risk_at_coverage(conf[1], correct[1], qs), atol=1e-7)
  cov = jax.vmap(coverage_at_risk, in_axes=(0, 0, None))(conf, correct, 0.2)
  np.testing.assert_allclose(cov[2], coverage_at_risk(conf[2], correct[2], 0.2), atol=1e-7)


def test_eaurc_inside_jit_needs_binary_correctness():
  conf = jnp.array([0.2, 0.8])
  # Traced 0/1 floats are read as booleans; graded values cannot be checked to raise: NaN.
  assert float(jax.jit(eaurc)(conf, jnp.array([1.0, 0.0]))) == float(eaurc(conf, [True, False]))
  assert np.isnan(float(jax.jit(eaurc)(conf, jnp.array([0.5, 1.0]))))
  assert float(jax.jit(eaurc)(conf, jnp.array([False, True]))) == 0.0


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [aurc, augrc, eaurc, risk_coverage_curve, risk_coverage_summary])
def test_bad_input(fn):
  with pytest.raises(ValueError, match="NaN"):
    fn([0.5, np.nan], [True, False])
  with pytest.raises(ValueError, match="inf"):
    fn([0.5, np.inf], [True, False])
  fn([0.5, 1.5], [True, False])  # real-valued scores: only their order counts (test_real_scores)
  with pytest.raises(ValueError, match="same shape"):
    fn([0.5, 0.4], [True])
  with pytest.raises(ValueError, match="empty"):
    fn([], [])
  with pytest.raises(ValueError, match="scalar"):
    fn(0.5, True)
  with pytest.raises(ValueError, match="correct"):
    fn([0.5, 0.4], [2, 0])


def test_bad_options_and_targets():
  with pytest.raises(ValueError, match="convention"):
    aurc([0.5], [True], convention="trapz")
  with pytest.raises(ValueError, match="convention"):
    eaurc([0.5], [True], convention="mean")
  with pytest.raises(ValueError, match="binary|0/1"):
    eaurc([0.5, 0.6], [0.5, 1.0])
  with pytest.raises(ValueError, match="coverage"):
    risk_at_coverage([0.5], [True], 0.0)
  with pytest.raises(ValueError, match="coverage"):
    risk_at_coverage([0.5], [True], 1.5)
  with pytest.raises(ValueError, match="risk"):
    coverage_at_risk([0.5], [True], -0.1)
  with pytest.raises(ValueError, match="risk"):
    coverage_at_risk([0.5], [True], np.nan)


def test_decimal_targets_hit_exact_fractions():
  # 0.3 and 0.1 are not float32 numbers, yet coverage 3/10 and risk 1/10 must count.
  conf = np.linspace(1.0, 0.1, 10)
  correct = np.array([True, True, True, False, True, True, True, True, True, False])
  assert float(risk_at_coverage(conf, correct, 0.3)) == 0.0  # k = 3, not k = 4
  assert float(risk_at_coverage(conf, correct, 0.4)) == pytest.approx(0.25, abs=TOL)
  assert float(coverage_at_risk(conf, correct, 0.2)) == pytest.approx(1.0, abs=TOL)  # 2/10
  assert float(coverage_at_risk(conf, correct, 0.125)) == pytest.approx(0.9, abs=TOL)  # 1/9
  one_error = np.arange(10) != 9
  assert float(coverage_at_risk(conf, one_error, 0.1)) == pytest.approx(1.0, abs=TOL)  # 1/10
  assert float(coverage_at_risk(conf, one_error, 0.09)) == pytest.approx(0.9, abs=TOL)


# ---------------------------------------------------------------------------
# Backends: the parallel scan (accelerators) equals the sequential one (CPU)
# ---------------------------------------------------------------------------


def _kernels(sequential, running_max=True):
  from cwsa_jax import _risk_coverage_kernels as rc
  forms = dict(sequential=sequential, running_max=running_max)
  summary = {conv: jax.jit(functools.partial(rc._summary_kernel, convention=conv, with_eaurc=True,
                                             **forms)) for conv in CONVENTIONS}
  return (summary, jax.jit(functools.partial(rc._curve_kernel, **forms)),
          jax.jit(functools.partial(rc._risk_at_coverage_kernel, **forms)),
          jax.jit(functools.partial(rc._coverage_at_risk_kernel, **forms)))


@pytest.mark.parametrize("graded,running_max", [(False, True), (False, False), (True, True)])
def test_parallel_scan_equals_sequential_scan_across_chunks(graded, running_max):
  # 40,000 samples: three CPU chunks, with tie groups straddling their borders. Binary
  # losses: the group starts by running maxima and by scatter and gather.
  rng = np.random.default_rng(11)
  conf, correct = random_case(rng, 40_000, decimals=3)
  kappa = rng.random(40_000).astype(np.float32) if graded else correct
  targets = jnp.array([0.05, 0.3, 0.5, 0.99, 1.0])
  sequential, parallel = _kernels(True), _kernels(False, running_max)
  for conv in CONVENTIONS:
    a, b = sequential[0][conv](conf, kappa), parallel[0][conv](conf, kappa)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)
    assert float(a.aurc) == pytest.approx(ref_aurc(conf, kappa, conv), rel=1e-6)
  a, b = sequential[1](conf, kappa), parallel[1](conf, kappa)
  assert int(a.num_points) == int(b.num_points) == len(np.unique(conf))
  for x, y in zip(a, b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
  for s, p in zip(sequential[2:], parallel[2:]):
    np.testing.assert_allclose(s(conf, kappa, targets), p(conf, kappa, targets), rtol=1e-6)
