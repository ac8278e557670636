"""The rank metrics on scores float32 [0, 1] keys would not order: real values and float64.

Only the order of the scores enters AURC, AUGRC, E-AURC, the curve and its working points, so
each must equal the same call on the scores' dense ranks mapped into [0, 1], and float64 scores
that float32 cannot tell apart must keep their float64 order (``cwsa_jax._order``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
import reference

N = 400


def _ranked(x: np.ndarray) -> np.ndarray:
  """Dense ranks of each row, mapped into [0, 1] (float32 keeps them apart at these sizes)."""
  out = np.empty(x.shape, np.float32)
  for row in np.ndindex(x.shape[:-1]):
    distinct, rank = np.unique(x[row], return_inverse=True)
    out[row] = rank.reshape(-1) / max(distinct.size - 1, 1)
  return out


def _metrics(c, k):
  summary = cw.risk_coverage_summary(c, k, convention="trapezoid")
  curve = cw.risk_coverage_curve(c, k)
  return [cw.aurc(c, k), cw.augrc(c, k), cw.eaurc(c, k), *summary,
          curve.coverage, curve.risk, curve.generalized_risk, curve.num_points,
          cw.risk_at_coverage(c, k, [0.3, 0.5, 1.0]), cw.coverage_at_risk(c, k, [0.0, 0.2])]


def _case(seed, shape=(N,)):
  rng = np.random.default_rng(seed)
  logits = np.round(rng.normal(size=shape) * 4, 1)  # real values with ties
  correct = rng.random(shape) < 1 / (1 + np.exp(-logits))
  return logits, correct


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_scores_equal_the_call_on_their_ranks(dtype):
  logits, correct = _case(0, (2, N))
  got = _metrics(logits.astype(dtype), correct)
  want = _metrics(_ranked(logits), correct)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  # The curve's thresholds are the scores' own values, in decreasing order.
  curve = cw.risk_coverage_curve(logits.astype(dtype), correct)
  for row in range(2):
    m = int(curve.num_points[row])
    np.testing.assert_array_equal(np.asarray(curve.thresholds[row, :m]),
                                  np.unique(logits[row].astype(np.float32))[::-1])


def test_real_scores_against_the_float64_reference():
  logits, correct = _case(1)
  for convention in ("step", "trapezoid"):
    assert float(cw.aurc(logits, correct, convention=convention)) == pytest.approx(
        reference.aurc(_ranked(logits), correct, convention), rel=2e-6)
    assert float(cw.eaurc(logits, correct, convention=convention)) == pytest.approx(
        reference.eaurc(_ranked(logits), correct, convention), rel=2e-6, abs=1e-7)


def test_float64_scores_finer_than_float32_keep_their_order():
  c = 1 - np.array([1e-9, 1e-10, 1e-11, 1e-12])
  k = np.array([False, True, True, True])
  assert np.all(c.astype(np.float32) == 1.0)  # float32 ties them all
  assert float(cw.aurc(c, k)) == pytest.approx(reference.aurc(np.arange(4.0), k, "step"))
  assert float(cw.aurc(c, k)) == pytest.approx(0.0625)
  assert float(cw.eaurc(c, k)) == 0.0  # a perfect ranking
  assert float(cw.coverage_at_risk(c, k, 0.0)) == 0.75
  assert float(cw.risk_at_coverage(c, k, 0.5)) == 0.0
  # A confident model whose confidences mostly round to 1.0 in float32.
  rng = np.random.default_rng(2)
  gap = 10.0 ** rng.uniform(-12, -2, 10_000)
  correct = rng.random(10_000) < 1 - gap * 30
  conf = 1 - gap
  for convention in ("step", "trapezoid"):
    want = reference.aurc(_ranked(conf), correct, convention)
    assert float(cw.aurc(conf, correct, convention=convention)) == pytest.approx(want, rel=2e-6)
  assert float(cw.aurc(conf, correct)) != float(cw.aurc(conf.astype(np.float32), correct))


def test_scores_in_the_unit_interval_take_the_same_path():
  """float32 scores in [0, 1] are not replaced: bit for bit the values they always had, and the
  curve's thresholds are the scores themselves (a JAX array is checked where it lives)."""
  rng = np.random.default_rng(3)
  c = rng.random(N).astype(np.float32)
  k = rng.random(N) < c
  for x in (c, jnp.asarray(c)):
    curve = cw.risk_coverage_curve(x, k)
    np.testing.assert_array_equal(np.asarray(curve.thresholds), np.sort(c)[::-1])
  assert float(cw.aurc(jnp.asarray(c) * 3 - 1, k)) == float(cw.aurc(c, k))  # same order


def test_inside_jit_real_scores_give_the_eager_value_and_nan_is_refused():
  logits, correct = _case(4)
  x = logits.astype(np.float32)
  assert float(jax.jit(cw.aurc)(x, correct)) == float(cw.aurc(x, correct))
  with pytest.raises(ValueError, match="NaN"):
    cw.aurc(np.where(np.arange(N) == 3, np.nan, logits), correct)
