"""Gradients of every public metric: exact, exact and zero almost everywhere, relaxed, or refused.

Every derivative is compared with central finite differences of an independent float64
reference (``reference``), at points away from thresholds, bin edges and ties, where the
metrics are differentiable; the custom derivatives are also checked with
``jax.test_util.check_grads`` (forward and reverse mode, second order), and every gradient
must stay finite at extreme inputs. Nothing may return a silent zero where the true
derivative is not zero.

XLA compilation dominates the time of this file, so every derivative is taken inside one
``jax.jit`` per test (or per parametrization): one program each, instead of one per
primitive of an op-by-op ``jax.grad``. All tests share one sample size ``N`` and float32
confidences; the extreme inputs of one size share one program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import cwsa_jax as cw
import reference
from cwsa_jax._bootstrap import _sampler
from cwsa_jax import losses
from cwsa_jax import streaming

N = 12
THRESHOLDS = np.array([0.3, 0.55, 0.8], np.float32)
TAU = np.float32(0.55)


def _data(seed: int = 0, graded: bool = False):
  """Confidences at least 0.01 away from every threshold (and from 0 and 1), correctness."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.05, 0.97, size=4 * N)
  far = np.min(np.abs(c[:, None] - THRESHOLDS[None, :]), axis=1) > 0.01
  c = c[far][:N].astype(np.float32)
  assert c.size == N
  c[:2] = (0.9, 0.85)  # something retained at every threshold
  if graded:
    return c, rng.uniform(0.0, 1.0, size=N).astype(np.float32)
  k = rng.uniform(size=N) < 0.6
  k[:2] = (True, False)  # both kinds retained at every threshold
  return c, k


def _fd(f, x, h):
  """Central finite differences of f (float64 NumPy, scalar or array output) along each x_i."""
  x = np.asarray(x, np.float64)
  columns = []
  for i in range(x.size):
    step = np.zeros_like(x)
    step.flat[i] = h
    columns.append((np.asarray(f(x + step), np.float64) - np.asarray(f(x - step), np.float64))
                   / (2 * h))
  return np.stack(columns, axis=-1).reshape(np.shape(f(x)) + x.shape)


def _column(metric):
  return {"coverage": 0, "selective_accuracy": 1, "cwsa": 2, "cwsa_plus": 3}[metric]


# --------------------------------------------------------------------------- exact (custom JVP)


@functools.partial(jax.jit, static_argnames=("metric", "normalize"))
def _hard_gradients(c, k, metric, normalize):
  """d metric(c, k, TAU) / dc [n] and the sweep's Jacobian d metric(c, k, THRESHOLDS) / dc
  [T, n], in one program."""
  one = cw.cwsa_plus if metric == "cwsa_plus" else (
      lambda c, k, tau: cw.cwsa(c, k, tau, normalize=normalize))
  got = jax.grad(lambda x: one(x, k, TAU))(c)
  jac = jax.jacrev(lambda x: getattr(cw.sweep(x, k, THRESHOLDS, normalize=normalize), metric))(c)
  return got, jac


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("metric, normalize", [("cwsa", "retained"), ("cwsa", "all"),
                                               ("cwsa_plus", "retained")])
def test_hard_cwsa_gradient_matches_float64_finite_differences(metric, normalize, graded):
  c, k = _data(1, graded)
  col = _column(metric)
  kappa = np.asarray(k, np.float64)
  ref = lambda cc: reference.hard_metrics(cc, kappa, TAU, normalize)[col]
  expected = _fd(ref, c, 1e-6)
  got, jac = _hard_gradients(jnp.asarray(c), jnp.asarray(k), metric, normalize)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  # The closed form: (2 kappa - 1) / ((1 - tau) |S|) on the retained set (kappa for CWSA+).
  retained = c >= TAU
  weight = kappa if metric == "cwsa_plus" else 2 * kappa - 1
  denominator = retained.sum() if normalize == "retained" else N
  np.testing.assert_allclose(got, retained * weight / ((1 - TAU) * denominator), rtol=1e-5,
                             atol=1e-7)
  # The sweep: every threshold at once (the Jacobian [T, n]), bucketed tangents.
  ref_sweep = lambda cc: reference.sweep(cc, kappa, THRESHOLDS, normalize)[:, col]
  np.testing.assert_allclose(jac, _fd(ref_sweep, c, 1e-6), rtol=1e-5, atol=1e-6)


@functools.partial(jax.jit, static_argnames=("metric",))
def _graded_gradients(c, k, metric):
  """d metric / dk [n], d metric / d tau [] and d sweep.metric / d thresholds [T, T]."""
  fn = getattr(cw, metric)
  grad_k = jax.grad(lambda x: fn(c, x, TAU))(k)
  grad_tau = jax.grad(lambda t: fn(c, k, t))(jnp.float32(TAU))
  jac_t = jax.jacfwd(lambda t: getattr(cw.sweep(c, k, t), metric))(jnp.asarray(THRESHOLDS))
  return grad_k, grad_tau, jac_t


@pytest.mark.parametrize("metric", ["cwsa", "cwsa_plus", "selective_accuracy"])
def test_gradient_in_graded_correctness_and_tau(metric):
  c, k = _data(2, graded=True)
  col = _column(metric)
  grad_k, grad_tau, jac_t = _graded_gradients(jnp.asarray(c), jnp.asarray(k), metric)
  expected = _fd(lambda kk: reference.hard_metrics(c, kk, TAU)[col], k, 1e-6)
  np.testing.assert_allclose(grad_k, expected, rtol=1e-5, atol=1e-6)
  # d/d tau: phi_i = (c_i - tau)/(1 - tau) moves by (c_i - 1)/(1 - tau)^2; S stays put.
  ref_tau = _fd(lambda t: reference.hard_metrics(c, k, t[0])[col], np.array([TAU]), 1e-6)[0]
  np.testing.assert_allclose(grad_tau, ref_tau, rtol=1e-5, atol=1e-6)
  ref_t = _fd(lambda t: reference.sweep(c, k, t)[:, col], THRESHOLDS, 1e-6)
  np.testing.assert_allclose(jac_t, ref_t, rtol=1e-5, atol=1e-6)


@jax.jit
def _group_jacobians(c, k, groups):
  """d cwsa / dc of the groups' sweep [G, T, n], and of their gap [T, n]."""
  jac = jax.jacrev(lambda x: cw.sweep_by_group(x, k, groups, THRESHOLDS, num_groups=3).cwsa)(c)
  jac_gap = jax.jacrev(lambda x: cw.group_gap(cw.sweep_by_group(x, k, groups, THRESHOLDS,
                                                                num_groups=3)))(c)
  return jac, jac_gap


def test_sweep_by_group_gradient_matches_reference():
  c, k = _data(3)
  groups = np.arange(N) % 3
  jac, jac_gap = _group_jacobians(jnp.asarray(c), jnp.asarray(k), jnp.asarray(groups))
  ref = lambda cc: reference.sweep_by_group(cc, k, groups, THRESHOLDS, 3)[..., 2]
  np.testing.assert_allclose(jac, _fd(ref, c, 1e-6), rtol=1e-5, atol=1e-6)
  # The gap between the best and the worst group, [T]: max - min of exact derivatives.
  ref_gap = lambda cc: np.ptp(ref(cc), axis=0)
  np.testing.assert_allclose(jac_gap, _fd(ref_gap, c, 1e-6), rtol=1e-5, atol=1e-6)


def _sweep_fields(c, k):
  return jnp.concatenate([cw.sweep(c, k, THRESHOLDS).cwsa, cw.sweep(c, k, THRESHOLDS).cwsa_plus,
                          cw.sweep(c, k, THRESHOLDS, normalize="all").cwsa])


# Every custom derivative (the retained-set sums of the three kernels, the curve's points),
# and what is built on them.
@pytest.mark.parametrize("fn", [
    lambda c, k: cw.cwsa(c, k, TAU),
    lambda c, k: cw.cwsa_plus(c, k, TAU),
    _sweep_fields,
    lambda c, k: cw.sweep_by_group(c, k, np.arange(N) % 2, THRESHOLDS, num_groups=2).cwsa,
    lambda c, k: cw.aumcc(c, k, THRESHOLDS),
    lambda c, k: cw.risk_coverage_curve(c, k).thresholds,
], ids=["cwsa", "cwsa_plus", "sweep", "sweep_by_group", "aumcc", "risk_coverage_curve"])
def test_check_grads_of_the_custom_derivatives(fn):
  c, k = _data(4, graded=True)
  # jit: one program per derivative check_grads takes, not one per primitive.
  check_grads(jax.jit(fn), (jnp.asarray(c), jnp.asarray(k)), order=1, modes=("fwd", "rev"), eps=1e-3,
              atol=2e-2, rtol=2e-2)


def test_check_grads_second_order_and_in_tau():
  c, k = _data(4, graded=True)
  # The tangent rule is itself differentiable (d^2 CWSA / dc dkappa != 0).
  check_grads(jax.jit(lambda c, k: cw.sweep(c, k, THRESHOLDS).cwsa),
              (jnp.asarray(c), jnp.asarray(k)), order=2, modes=("rev",), eps=1e-3, atol=2e-2, rtol=2e-2)
  check_grads(jax.jit(lambda t: cw.sweep(c, k, t).cwsa), (jnp.asarray(THRESHOLDS),), order=1, eps=1e-3,
              atol=2e-2, rtol=2e-2)


def test_primal_is_unchanged_by_the_custom_derivative():
  c, k = _data(5)
  sweep = cw.sweep(c, k, THRESHOLDS)
  primal, tangent = jax.jit(lambda c, k: jax.jvp(lambda x: cw.sweep(x, k, THRESHOLDS).cwsa,
                                                 (c,), (jnp.ones(N, jnp.float32),)))(
      jnp.asarray(c), jnp.asarray(k))
  np.testing.assert_array_equal(primal, sweep.cwsa)
  # Bit for bit the exact integer path of the streaming state, too.
  state = streaming.SweepState.from_batch(c, k, THRESHOLDS).compute()
  np.testing.assert_array_equal(primal, state.cwsa)
  assert np.all(np.isfinite(np.asarray(tangent)))


@jax.jit
def _contributions_and_aumcc_gradients(c, k):
  return (jax.grad(lambda x: cw.contributions(x, k, TAU).terms.sum())(c),
          jax.grad(lambda x: cw.aumcc(x, k, THRESHOLDS))(c))


def test_contributions_and_aumcc_gradients():
  c, k = _data(6)
  kappa = np.asarray(k, np.float64)
  got, got_aumcc = _contributions_and_aumcc_gradients(jnp.asarray(c), jnp.asarray(k))
  size = (c >= TAU).sum()
  expected = size * _fd(lambda cc: reference.hard_metrics(cc, kappa, TAU)[2], c, 1e-6)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

  def ref_aumcc(cc):
    table = reference.sweep(cc, kappa, THRESHOLDS)
    cov, value = table[:, 0], table[:, 2]
    return sum((cov[t] - cov[t + 1]) * (value[t] + value[t + 1]) / 2
               for t in range(len(THRESHOLDS) - 1) if cov[t] > 0 and cov[t + 1] > 0)

  np.testing.assert_allclose(got_aumcc, _fd(ref_aumcc, c, 1e-6), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- exact (autodiff)


@functools.partial(jax.jit, static_argnames=("norm", "binning"))
def _ece_gradients(c, k, norm, binning):
  """(d ECE / dc, d ECE / dk), each [n]."""
  return jax.grad(lambda *a: cw.ece(*a, num_bins=5, norm=norm, binning=binning),
                  argnums=(0, 1))(c, k)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("binning", ["width", "mass"])
def test_ece_gradient_matches_reference(norm, binning):
  rng = np.random.default_rng(7)
  c = rng.uniform(0.05, 0.95, size=N).astype(np.float32)
  c = np.where(np.abs(c * 5 - np.round(c * 5)) < 0.02, c + 0.03, c).astype(np.float32)  # off edges
  k = rng.uniform(size=N).astype(np.float32)
  grads = _ece_gradients(jnp.asarray(c), jnp.asarray(k), norm, binning)
  for argnum, (x, h) in enumerate(((c, 1e-3), (k, 1e-6))):
    args = [c, k]

    def ref(v, argnum=argnum):
      args_v = list(args)
      args_v[argnum] = v
      return reference.ece(*args_v, num_bins=5, norm=norm, binning=binning)

    np.testing.assert_allclose(grads[argnum], _fd(ref, x, h), rtol=1e-3, atol=1e-4)


def test_calibration_bins_gradient_matches_reference():
  rng = np.random.default_rng(8)
  c = rng.uniform(0.05, 0.45, size=N).astype(np.float32)  # two bins of [0, 0.5)
  c[N // 2:] += 0.5
  jac = jax.jit(jax.jacrev(
      lambda x: cw.calibration_bins(x, np.ones(N), num_bins=2).mean_confidence))(jnp.asarray(c))
  ref = lambda cc: reference.calibration_bins(cc, np.ones(N), 2)[2]
  np.testing.assert_allclose(jac, _fd(ref, c, 1e-3), rtol=1e-3, atol=1e-4)


@jax.jit
def _brier_nll_and_confidences_gradients(logits, probs, labels):
  """d/d logits and d/d probs [n, K] of brier_score and nll, and the Jacobians [n, n, K] of
  the confidences from logits and from probs."""
  grads = [(jax.grad(lambda z: fn(z, labels, from_logits=True))(logits),
            jax.grad(lambda p: fn(p, labels))(probs)) for fn in (cw.brier_score, cw.nll)]
  jac_logits = jax.jacrev(lambda z: cw.confidences_from_logits(z, labels).confidences)(logits)
  jac_probs = jax.jacrev(lambda p: cw.confidences_from_probs(p, labels).confidences)(probs)
  return grads, jac_logits, jac_probs


def test_brier_nll_and_confidences_gradients_match_reference():
  rng = np.random.default_rng(9)
  logits = rng.normal(size=(N, 4)).astype(np.float32)
  labels = rng.integers(0, 4, size=N)
  probs = reference.softmax(logits).astype(np.float32)
  grads, jac_logits, jac_probs = _brier_nll_and_confidences_gradients(
      jnp.asarray(logits), jnp.asarray(probs), jnp.asarray(labels))
  for (fn, ref), (got_logits, got_probs) in zip(
      ((cw.brier_score, reference.brier_score), (cw.nll, reference.nll)), grads, strict=True):
    expected = _fd(lambda z: ref(reference.softmax(z), labels), logits, 1e-6)
    np.testing.assert_allclose(got_logits, expected, rtol=1e-4, atol=1e-6, err_msg=fn.__name__)
    np.testing.assert_allclose(got_probs, _fd(lambda p: ref(p, labels), probs, 1e-6), rtol=1e-4,
                               atol=1e-5, err_msg=fn.__name__)
  expected = _fd(lambda z: reference.softmax(z).max(axis=-1), logits, 1e-6)
  np.testing.assert_allclose(jac_logits, expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(jac_probs, _fd(lambda p: p.max(axis=-1), probs, 1e-6), atol=1e-6)


@jax.jit
def _rank_metric_gradients(c, k):
  """d aurc / dk and d augrc / dk [n] per convention, and d risk_at_coverage(0.5) / dk."""
  grads = {(convention, generalized): jax.grad(lambda x: fn(c, x, convention=convention))(k)
           for convention in ("step", "trapezoid", "published_code")
           for generalized, fn in ((False, cw.aurc), (True, cw.augrc))}
  return grads, jax.grad(lambda x: cw.risk_at_coverage(c, x, 0.5))(k)


def test_rank_metrics_gradient_in_graded_correctness():
  c, k = _data(10, graded=True)
  grads, got = _rank_metric_gradients(jnp.asarray(c), jnp.asarray(k))
  for (convention, generalized), got_k in grads.items():
    ref = lambda kk: reference.aurc(c, kk, convention, generalized)
    np.testing.assert_allclose(got_k, _fd(ref, k, 1e-6), rtol=1e-5, atol=1e-6,
                               err_msg=f"{convention} generalized={generalized}")
  order = np.argsort(-c)[: N // 2]
  expected = np.zeros(N)
  expected[order] = -1.0 / (N // 2)  # risk = mean over the top half of (1 - kappa)
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_bootstrap_gradient_is_the_metric_gradient_on_each_resample():
  c, k = _data(11)
  kappa = np.asarray(k, np.float64)
  indices = np.asarray(_sampler._resample_indices(jax.random.key(3), N, 16))
  r = jax.jit(jax.jacrev(lambda x: cw.bootstrap_ci(lambda a, b: cw.cwsa(a, b, TAU), x, k,
                                                   key=jax.random.key(3), num_resamples=16)))(
      jnp.asarray(c))
  ref = lambda cc: np.array(reference.bootstrap(
      lambda a, b: reference.hard_metrics(a, b, TAU)[2], cc, kappa, indices))
  expected = _fd(ref, c, 1e-6)  # [3 (estimate, low, high), n]
  np.testing.assert_allclose(np.stack([r.estimate, r.low, r.high]), expected, rtol=1e-4,
                             atol=1e-5)


def test_risk_coverage_curve_thresholds_move_with_the_confidences():
  c, k = _data(16)
  c[3] = c[2]  # one tie group of two samples
  jac = np.asarray(jax.jit(jax.jacrev(lambda x: cw.risk_coverage_curve(x, k).thresholds))(
      jnp.asarray(c)))
  m = N - 1  # distinct points; the padding repeats the last one
  untied = np.flatnonzero((np.arange(N) != 2) & (np.arange(N) != 3))

  def ref(x_untied):
    x = c.astype(np.float64)
    x[untied] = x_untied
    return reference.risk_coverage_curve(x, k)[0]

  np.testing.assert_allclose(jac[:m][:, untied], _fd(ref, c[untied], 1e-3), atol=1e-4)
  # The tie group's point moves with its samples' mean (the two-sided derivative
  # exists only when they move together).
  point = int(np.flatnonzero(np.unique(c)[::-1] == c[2])[0])
  np.testing.assert_allclose(jac[point][[2, 3]], [0.5, 0.5], atol=1e-7)
  np.testing.assert_array_equal(jac[m:], np.repeat(jac[m - 1:m], N - m, axis=0))


# --------------------------------------------------------------------------- zero almost everywhere


@pytest.mark.parametrize("fn", [
    lambda c, k: cw.coverage(c, TAU),
    lambda c, k: cw.selective_accuracy(c, k, TAU),
    lambda c, k: cw.sweep(c, k, THRESHOLDS).coverage,
    lambda c, k: cw.sweep(c, k, THRESHOLDS).selective_accuracy,
    lambda c, k: cw.aurc(c, k),
    lambda c, k: cw.augrc(c, k, convention="trapezoid"),
    lambda c, k: cw.eaurc(c, k),
    lambda c, k: jnp.stack(cw.risk_coverage_summary(c, k)),
    lambda c, k: jnp.stack(cw.risk_coverage_curve(c, k)[1:4]),
    lambda c, k: cw.risk_at_coverage(c, k, jnp.array([0.25, 0.5, 1.0])),
    lambda c, k: cw.coverage_at_risk(c, k, jnp.array([0.0, 0.3])),
], ids=["coverage", "selective_accuracy", "sweep_coverage", "sweep_selective_accuracy", "aurc",
        "augrc", "eaurc", "risk_coverage_summary", "risk_coverage_curve", "risk_at_coverage",
        "coverage_at_risk"])
def test_piecewise_constant_metrics_have_zero_gradient_in_confidences(fn):
  c, k = _data(12)
  jac = np.asarray(jax.jit(jax.jacrev(fn))(jnp.asarray(c), jnp.asarray(k)))
  assert np.all(jac == 0.0)
  # Exact: moving every confidence by less than the gap to the nearest tie or
  # threshold changes nothing (the finite difference is 0 too).
  gap = np.min(np.abs(c[:, None] - c[None, :]) + np.eye(N))
  shift = np.float32(min(gap, 0.01) / 4)
  np.testing.assert_array_equal(fn(c + shift, k), fn(c, k))
  np.testing.assert_array_equal(fn(c - shift, k), fn(c, k))


# --------------------------------------------------------------------------- relaxed


def test_relaxed_gradients_are_exact_for_the_relaxation():
  c, k = _data(13, graded=True)
  args = (jnp.asarray(c), jnp.asarray(k))
  # soft_cwsa_plus and soft_cwsa_band_area run the same two kernels.
  for fn in (lambda c, k: cw.soft_cwsa(c, k, TAU, temperature=0.05),
             lambda c, k: cw.soft_cwsa_sweep(c, k, THRESHOLDS, temperature=0.05)):
    check_grads(jax.jit(fn), args, order=1, modes=("fwd", "rev"), eps=1e-3, atol=2e-2,
                rtol=2e-2)
  logits = jnp.asarray(np.random.default_rng(14).normal(size=(N, 3)), jnp.float32)
  labels = jnp.arange(N) % 3
  for loss in (losses.cwsa_regularized_loss, lambda z, y: losses.focal_loss(z, y, gamma=2.0),
               lambda z, y: losses.soft_aurc_regularized_loss(z, y, temperature=0.1)):
    check_grads(jax.jit(lambda z: loss(z, labels)), (logits,), order=1, modes=("rev",), eps=1e-3,
                atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------- refused


def test_functions_without_a_derivative_refuse_to_differentiate():
  c, k = _data(15)
  for state in (lambda x: streaming.SweepState.from_batch(x, k, THRESHOLDS).compute().cwsa,
                lambda x: streaming.CalibrationState.from_batch(x, k).compute(),
                lambda x: streaming.RiskCoverageState.from_batch(x, k).compute().aurc):
    with pytest.raises(TypeError, match="streaming states"):
      jax.grad(lambda x: jnp.sum(state(x)))(jnp.asarray(c))
  with pytest.raises(TypeError, match="bootstrap_sweep"):
    jax.grad(lambda x: cw.bootstrap_sweep(x, k, THRESHOLDS, key=jax.random.key(0),
                                          num_resamples=4).estimate.cwsa.sum())(jnp.asarray(c))
  with pytest.raises(TypeError, match="select_threshold"):
    jax.grad(lambda x: cw.select_threshold(x, k).value)(jnp.asarray(c))
  # Without differentiation the states work inside jit as before.
  jitted = jax.jit(lambda x: streaming.SweepState.from_batch(x, k, THRESHOLDS).compute().cwsa)
  np.testing.assert_allclose(jitted(c), cw.sweep(c, k, THRESHOLDS).cwsa, rtol=1e-6)


# --------------------------------------------------------------------------- extreme inputs


EXTREMES = {
    "at_tau_and_at_1": (np.array([0.55, 1.0, 0.0, 0.7], np.float32), np.array([1, 0, 1, 1])),
    "nothing_retained": (np.array([0.1, 0.2, 0.3, 0.0], np.float32), np.array([1, 0, 1, 0])),
    "one_sample": (np.array([0.9], np.float32), np.array([0])),
    "all_equal_at_1": (np.ones(4, np.float32), np.array([1, 1, 0, 1])),
}


def _extreme_functions(k, n):
  """name -> scalar function of the confidences, for correctness ``k`` of ``n`` samples."""
  functions = {
      "cwsa": lambda x: cw.cwsa(x, k, TAU), "cwsa_tau_0": lambda x: cw.cwsa(x, k, 0.0),
      "cwsa_tau_0.999_all": lambda x: cw.cwsa(x, k, 0.999, normalize="all"),
      "cwsa_plus": lambda x: cw.cwsa_plus(x, k, TAU),
      "sweep_cwsa": lambda x: cw.sweep(x, k, THRESHOLDS).cwsa.sum(),
      "sweep_cwsa_plus_graded": lambda x: cw.sweep(x, k.astype(np.float32),
                                                   THRESHOLDS).cwsa_plus.sum(),
      "contributions": lambda x: cw.contributions(x, k, TAU).terms.sum(),
      "ece": lambda x: cw.ece(x, k),
      "ece_l2_mass": lambda x: cw.ece(x, k, norm="l2", binning="mass"),
      "aurc": lambda x: cw.aurc(x, k),
      "soft_cwsa_cold": lambda x: cw.soft_cwsa(x, k, TAU, temperature=1e-6),
      "soft_cwsa_hot": lambda x: cw.soft_cwsa(x, k, TAU, temperature=1e6),
  }
  if n > 1:
    functions["aumcc"] = lambda x: cw.aumcc(x, k, THRESHOLDS)
  return functions


# One program per sample size (the cases of one size share it): every gradient at once.
@jax.jit
def _extreme_gradients(c, k):
  return {name: jax.grad(fn)(c) for name, fn in _extreme_functions(k, c.shape[0]).items()}


@jax.jit
def _extreme_logit_gradients(logits, labels):
  return {
      "nll": jax.grad(lambda z: cw.nll(z, labels, from_logits=True))(logits),
      "brier_score": jax.grad(lambda z: cw.brier_score(z, labels, from_logits=True))(logits),
      "confidences_from_logits": jax.grad(
          lambda z: cw.confidences_from_logits(z, labels).confidences.sum())(logits),
      "cwsa_regularized_loss": jax.grad(
          lambda z: losses.cwsa_regularized_loss(z, labels))(logits),
  }


@pytest.mark.parametrize("case", list(EXTREMES))
def test_gradients_stay_finite_at_extreme_inputs(case):
  c, k = EXTREMES[case]
  grads = _extreme_gradients(jnp.asarray(c), jnp.asarray(k, jnp.int32))
  assert len(grads) == (13 if c.shape[0] > 1 else 12)
  for name, grad in grads.items():
    assert np.all(np.isfinite(np.asarray(grad))), (name, grad)
  logits = jnp.array([[1e4, -1e4, 0.0], [0.0, 0.0, 0.0]], jnp.float32)
  labels = jnp.array([1, 2])
  for name, grad in _extreme_logit_gradients(logits, labels).items():
    assert np.all(np.isfinite(np.asarray(grad))), (name, grad)


@jax.jit
def _margin_and_temperature_gradients(logits, labels):
  """The Jacobian [n, n, K] of the margin scores and d T* / d logits [n, K]."""
  return (jax.jacrev(lambda z: cw.confidence_scores(z, method="margin"))(logits),
          jax.grad(lambda z: cw.fit_temperature(z, labels))(logits))


def test_confidence_scores_and_fit_temperature_gradients_match_reference():
  rng = np.random.default_rng(17)
  logits = (2.0 * rng.normal(size=(N, 3))).astype(np.float32)
  labels = np.argmax(logits, axis=-1)
  labels[:3] = (labels[:3] + 1) % 3  # a few confident errors: the best T is interior

  def margin(z):
    p = np.sort(reference.softmax(z), axis=-1)
    return p[..., -1] - p[..., -2]

  jac, got = _margin_and_temperature_gradients(jnp.asarray(logits), jnp.asarray(labels))
  np.testing.assert_allclose(jac, _fd(margin, logits, 1e-6), rtol=1e-4, atol=1e-6)

  def fit(z):  # float64 Newton on beta = 1/T of the convex mean NLL(softmax(beta z))
    beta = 1.0
    for _ in range(60):
      p = reference.softmax(beta * z)
      mean_z = np.sum(p * z, axis=-1)
      slope = np.mean(mean_z - z[np.arange(N), labels])
      curvature = np.mean(np.sum(p * z * z, axis=-1) - mean_z ** 2)
      beta -= slope / curvature
    return 1.0 / beta

  np.testing.assert_allclose(got, _fd(fit, logits.astype(np.float64), 1e-5), rtol=2e-3, atol=2e-3)
