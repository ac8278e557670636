"""Tests of the soft (sigmoid-relaxed) CWSA and CWSA+ in cwsa_jax._soft."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from cwsa_jax._soft import (band_thresholds, soft_cwsa, soft_cwsa_band_area, soft_cwsa_plus,
                            soft_cwsa_sweep)


# ---------------------------------------------------------------------------
# float64 NumPy references, written from the definitions (no shared code).

def hard_reference(c, kappa, tau, *, plus=False, normalize="retained"):
  """Hard CWSA / CWSA+ at one threshold, float64, one sample at a time."""
  c = np.asarray(c, np.float64).ravel()
  kappa = np.asarray(kappa, np.float64).ravel()
  total, count = 0.0, 0
  for ci, ki in zip(c, kappa):
    if ci >= tau:
      count += 1
      phi = (ci - tau) / (1.0 - tau)
      total += phi * (ki if plus else 2.0 * ki - 1.0)
  if count == 0:
    return 0.0
  return total / (count if (plus or normalize == "retained") else c.size)


def soft_reference(c, kappa, tau, temperature, *, plus=False, normalize="retained"):
  """Soft CWSA / CWSA+ from the module docstring's formula, float64."""
  c = np.asarray(c, np.float64).ravel()
  kappa = np.asarray(kappa, np.float64).ravel()
  z = (c - tau) / temperature
  log_gate = -np.logaddexp(0.0, -z)
  weight = np.maximum(c - tau, 0.0) / (1.0 - tau)
  score = kappa if plus else 2.0 * kappa - 1.0
  if normalize == "all" and not plus:
    return float(np.mean(np.exp(log_gate) * weight * score))
  gates = np.exp(log_gate - log_gate.max())
  return float(np.sum(gates * weight * score) / np.sum(gates))


# Most random cases share one size (and the gradient checks another), so the
# compiled programs of the public functions are reused across tests.
N = 256
N_GRAD = 24


def random_case(seed, n=N, *, graded=False):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.0, 1.0, n).astype(np.float32)
  kappa = rng.uniform(0, 1, n).astype(np.float32) if graded else rng.random(n) < c
  return c, kappa


def away_from(c, thresholds, gap=0.02):
  """Moves every confidence at least ``gap`` away from every threshold."""
  c = np.array(c, np.float64)
  for tau in np.atleast_1d(thresholds):
    near = np.abs(c - tau) < gap
    c[near] = np.where(c[near] >= tau, min(tau + gap + 1e-3, 1.0), max(tau - gap - 1e-3, 0.0))
  return c.astype(np.float32)


# ---------------------------------------------------------------------------
# Values.

@pytest.mark.parametrize("temperature", [1e-3, 0.01, 0.05, 0.3])
@pytest.mark.parametrize("tau", [0.0, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("plus", [False, True])
def test_matches_float64_reference(temperature, tau, plus):
  c, kappa = random_case(int(tau * 100 + temperature * 1e4), 256, graded=True)
  fn = soft_cwsa_plus if plus else soft_cwsa
  got = float(fn(c, kappa, tau, temperature=temperature))  # jitted inside, tau and T traced
  assert abs(got - soft_reference(c, kappa, tau, temperature, plus=plus)) <= 2e-6


def test_normalize_all_matches_reference():
  c, kappa = random_case(3, 256)
  got = float(soft_cwsa(c, kappa, 0.6, temperature=0.02, normalize="all"))
  assert abs(got - soft_reference(c, kappa, 0.6, 0.02, normalize="all")) <= 2e-6


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("graded", [False, True])
def test_converges_to_hard_metric(tau, graded):
  c, kappa = random_case(int(tau * 1000) + graded, 256, graded=graded)
  c = away_from(c, tau)
  for plus in (False, True):
    fn = soft_cwsa_plus if plus else soft_cwsa
    soft = float(fn(c, kappa, tau, temperature=1e-4))
    assert abs(soft - hard_reference(c, kappa, tau, plus=plus)) <= 1e-3
  soft_all = float(soft_cwsa(c, kappa, tau, temperature=1e-4, normalize="all"))
  assert abs(soft_all - hard_reference(c, kappa, tau, normalize="all")) <= 1e-3


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 3, N]), st.floats(0.0, 0.95), st.integers(0, 2**31 - 1),
       st.booleans())
def test_converges_to_hard_metric_random(n, tau, seed, graded):
  c, kappa = random_case(seed, n, graded=graded)
  c = away_from(c, np.float32(tau))
  tau = float(np.float32(tau))
  assert abs(float(soft_cwsa(c, kappa, tau, temperature=1e-4))
             - hard_reference(c, kappa, tau)) <= 1e-3
  assert abs(float(soft_cwsa_plus(c, kappa, tau, temperature=1e-4))
             - hard_reference(c, kappa, tau, plus=True)) <= 1e-3


@pytest.mark.parametrize("c, kappa, tau", [
    ([0.9], [True], 0.5),                        # one sample
    ([0.9, 0.7, 1.0, 0.8], [1, 1, 1, 1], 0.5),    # all correct, a confidence of exactly 1
    ([0.9, 0.7, 1.0, 0.8], [0, 0, 0, 0], 0.5),    # all wrong
    ([0.8, 0.8, 0.8, 0.2], [1, 0, 1, 1], 0.6),    # ties
    ([0.0, 0.1, 1.0], [0, 1, 1], 0.4),            # confidences exactly 0 and 1
    ([0.1, 0.2, 0.3], [1, 0, 1], 0.9),            # nothing retained: hard is 0
    ([0.0, 0.0], [1, 1], 0.5),
])
def test_edge_cases_at_small_temperature(c, kappa, tau):
  for plus in (False, True):
    fn = soft_cwsa_plus if plus else soft_cwsa
    got = float(fn(np.float32(c), np.asarray(kappa), tau, temperature=1e-4))
    assert abs(got - hard_reference(c, kappa, tau, plus=plus)) <= 1e-3
    ref = soft_reference(np.float32(c), kappa, tau, 1e-4, plus=plus)
    assert abs(got - ref) <= 2e-6


def test_confidence_exactly_at_tau_is_half_retained():
  # At c = tau the gate is 1/2 and phi = 0: the sample is half counted in the
  # denominator and adds nothing to the numerator.
  got = float(soft_cwsa(np.float32([0.5, 0.9]), [1, 1], 0.5, temperature=1e-3))
  ref = soft_reference(np.float32([0.5, 0.9]), [1, 1], 0.5, 1e-3)
  assert abs(got - ref) <= 2e-6
  assert abs(got - 0.8 / 1.5) < 2e-3


def test_phi_below_tau_is_clipped_at_zero():
  # One sample far below tau among retained ones contributes nothing.
  c = np.float32([0.95, 0.85, 0.1])
  with_low = float(soft_cwsa(c, [1, 0, 1], 0.5, temperature=0.01))
  without = float(soft_cwsa(c[:2], [1, 0], 0.5, temperature=0.01))
  assert abs(with_low - without) < 1e-7
  # Confidences 10 T away from tau: gates within e^-10 of 0 or 1.
  c, kappa = random_case(7, N)
  for temperature in (1e-3, 1e-2):
    for tau in (0.3, 0.7):
      gap = abs(float(soft_cwsa(away_from(c, tau, 10 * temperature), kappa, tau,
                                temperature=temperature))
                - hard_reference(away_from(c, tau, 10 * temperature), kappa, tau))
      assert gap <= 1e-3


def test_bounded_and_large_temperature_limit():
  c, kappa = random_case(8, N)
  for temperature in (0.3, 10.0, 1e6):
    for tau in (0.0, 0.5, 0.99):
      value = float(soft_cwsa(c, kappa, tau, temperature=temperature))
      plus = float(soft_cwsa_plus(c, kappa, tau, temperature=temperature))
      assert -1.0 <= value <= 1.0 and 0.0 <= plus <= 1.0
  # As T -> infinity every gate tends to 1/2: the mean over all samples.
  got = float(soft_cwsa(c, kappa, 0.6, temperature=1e6))
  assert abs(got - hard_reference(c, kappa, 0.6, normalize="all")) <= 1e-5


# ---------------------------------------------------------------------------
# Sweep, batching, band area.

@pytest.mark.parametrize("plus", [False, True])
def test_sweep_equals_loop_of_single_calls(plus):
  c, kappa = random_case(11, N, graded=True)
  thresholds = np.float32([0.9, 0.0, 0.5, 0.31, 0.75, 0.5, 0.99])
  swept = np.asarray(soft_cwsa_sweep(c, kappa, thresholds, temperature=0.02, plus=plus))
  fn = soft_cwsa_plus if plus else soft_cwsa
  loop = np.array([float(fn(c, kappa, t, temperature=0.02)) for t in thresholds])
  np.testing.assert_allclose(swept, loop, atol=1e-7, rtol=0)
  assert swept.shape == thresholds.shape


def test_sweep_normalize_all_equals_loop():
  c, kappa = random_case(12, N)
  thresholds = np.float32([0.2, 0.6])
  swept = soft_cwsa_sweep(c, kappa, thresholds, temperature=0.05, normalize="all")
  loop = [float(soft_cwsa(c, kappa, t, temperature=0.05, normalize="all")) for t in thresholds]
  np.testing.assert_allclose(swept, loop, atol=1e-7)


def test_batch_axes_equal_per_row_calls():
  rng = np.random.default_rng(5)
  c = rng.uniform(size=(3, 2, N)).astype(np.float32)
  kappa = rng.random((3, 2, N)) < c
  batched = np.asarray(soft_cwsa(c, kappa, 0.4, temperature=0.03))
  assert batched.shape == (3, 2)
  rows = np.array([[float(soft_cwsa(c[i, j], kappa[i, j], 0.4, temperature=0.03))
                    for j in range(2)] for i in range(3)])
  np.testing.assert_allclose(batched, rows, atol=1e-7)
  vmapped = jax.jit(jax.vmap(lambda a, b: soft_cwsa_plus(a, b, 0.4, temperature=0.03)))(
      c[:, 0], kappa[:, 0])
  direct = np.asarray(soft_cwsa_plus(c, kappa, 0.4, temperature=0.03))[:, 0]
  np.testing.assert_allclose(vmapped, direct, atol=1e-7)
  swept = np.asarray(soft_cwsa_sweep(c, kappa, np.float32([0.4, 0.8]), temperature=0.03))
  assert swept.shape == (3, 2, 2)
  np.testing.assert_allclose(swept[..., 0], batched, atol=1e-7)


def test_vmap_over_thresholds_matches_sweep():
  c, kappa = random_case(13, N)
  thresholds = np.linspace(0.1, 0.9, 5, dtype=np.float32)
  vm = jax.jit(jax.vmap(lambda t: soft_cwsa(c, kappa, t, temperature=0.02)))(thresholds)
  np.testing.assert_allclose(vm, soft_cwsa_sweep(c, kappa, thresholds, temperature=0.02), atol=1e-7)


@pytest.mark.parametrize("plus", [False, True])
def test_band_area_matches_trapezoid_reference(plus):
  c, kappa = random_case(17, N, graded=True)
  grid = np.linspace(0.4, 0.8, 5)
  values = [soft_reference(c, kappa, t, 0.03, plus=plus) for t in np.float32(grid)]
  area = np.trapezoid(values, np.float32(grid))
  got = soft_cwsa_band_area(c, kappa, band=(0.4, 0.8), num_thresholds=5, temperature=0.03,
                            plus=plus, average=False)
  assert abs(float(got) - area) <= 2e-6
  got_mean = soft_cwsa_band_area(c, kappa, band=(0.4, 0.8), num_thresholds=5, temperature=0.03,
                                 plus=plus)
  assert abs(float(got_mean) - area / 0.4) <= 5e-6
  np.testing.assert_allclose(band_thresholds((0.4, 0.8), 5), np.float32(grid))


def test_band_area_converges_to_hard_trapezoid():
  grid = band_thresholds((0.5, 0.9), 9)
  c, kappa = random_case(19, N)
  c = away_from(c, grid, gap=0.01)
  hard = np.trapezoid([hard_reference(c, kappa, t) for t in grid], grid) / 0.4
  soft = float(soft_cwsa_band_area(c, kappa, temperature=1e-4))
  assert abs(soft - hard) <= 1e-3


def test_band_area_of_one_interval_is_the_mean_of_its_ends():
  c, kappa = random_case(23, N)
  ends = soft_cwsa_sweep(c, kappa, np.float32([0.2, 0.7]), temperature=0.05)
  got = soft_cwsa_band_area(c, kappa, band=(0.2, 0.7), num_thresholds=2, temperature=0.05)
  assert abs(float(got) - float(jnp.mean(ends))) <= 1e-6


# ---------------------------------------------------------------------------
# Gradients.

def test_check_grads_soft_metrics():
  c, kappa = random_case(29, N_GRAD, graded=True)
  c = jnp.asarray(0.05 + 0.9 * c)  # keep finite differences inside [0, 1]
  kappa = jnp.asarray(kappa)
  for fn, modes in ((soft_cwsa, ("rev", "fwd")), (soft_cwsa_plus, ("rev",))):
    f = jax.jit(lambda c, k, tau: fn(c, k, tau, temperature=0.1))
    check_grads(f, (c, kappa, jnp.float32(0.45)), order=1, modes=modes,
                atol=5e-3, rtol=5e-3, eps=1e-3)
  band = jax.jit(lambda c, k: soft_cwsa_band_area(c, k, band=(0.3, 0.7), num_thresholds=5,
                                                  temperature=0.1))
  check_grads(band, (c, kappa), order=1, modes=("rev",), atol=5e-3, rtol=5e-3, eps=1e-3)


@functools.partial(jax.jit, static_argnames="plus")
def _grad_wrt_confidences(c, kappa, tau, temperature, plus=False):
  # One program per shape and metric; tau and temperature are traced.
  fn = soft_cwsa_plus if plus else soft_cwsa
  return jax.grad(lambda x: fn(x, kappa, tau, temperature=temperature))(c)


@jax.jit
def _grad_wrt_kappa(c, kappa, tau, temperature):
  return jax.grad(lambda k: soft_cwsa(c, k, tau, temperature=temperature))(kappa)


def test_gradient_matches_float64_finite_differences():
  # A sharper check than check_grads' float32 differences: the analytic
  # gradient against central differences of the float64 reference.
  c, kappa = random_case(31, N_GRAD, graded=True)
  tau, temperature = 0.5, 0.05
  grad = np.asarray(_grad_wrt_confidences(c, np.float32(kappa), tau, temperature))
  h = 1e-6
  for i in range(c.size):
    up, down = c.astype(np.float64), c.astype(np.float64)
    up[i] += h
    down[i] -= h
    fd = (soft_reference(up, kappa, tau, temperature)
          - soft_reference(down, kappa, tau, temperature))
    assert abs(grad[i] - fd / (2 * h)) <= 1e-4 * max(1.0, abs(fd / (2 * h)))


def _all_finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@functools.partial(jax.jit, static_argnames="plus")
def _value_and_grads(c, kappa, tau, temperature, plus):
  fn = soft_cwsa_plus if plus else soft_cwsa
  f = lambda *args: fn(args[0], args[1], args[2], temperature=args[3])
  return jax.value_and_grad(f, argnums=(0, 1, 2, 3))(c, kappa, tau, temperature)


@jax.jit
def _band_value_and_grad(c, kappa, temperature):
  f = lambda c: soft_cwsa_band_area(c, kappa, band=(0.5, 0.95), temperature=temperature)
  return jax.value_and_grad(f)(c)


@pytest.mark.parametrize("temperature", [1e-6, 1e-4, 1.0, 1e6])
@pytest.mark.parametrize("case", ["nothing_retained", "at_tau", "at_one", "at_zero", "mixed"])
def test_values_and_gradients_finite_at_extremes(temperature, case):
  tau = jnp.float32(0.9)
  c = {"nothing_retained": [0.1, 0.2, 0.0],
       "at_tau": [0.9, 0.9, 0.9],
       "at_one": [1.0, 1.0, 0.95],
       "at_zero": [0.0, 0.0, 0.0],
       "mixed": [0.0, 0.9, 1.0]}[case]
  c = jnp.float32(c)
  kappa = jnp.float32([1.0, 0.0, 1.0])
  temperature = jnp.float32(temperature)
  for plus in (False, True):
    result = _value_and_grads(c, kappa, tau, temperature, plus)
    assert _all_finite(result), (plus, case, temperature, result)
  assert _all_finite(_band_value_and_grad(c, kappa, temperature))


def test_nothing_retained_is_zero_like_the_hard_metric():
  c = jnp.float32([0.1, 0.2, 0.3])
  for temperature in (1e-6, 1e-4, 1e-2):
    assert abs(float(soft_cwsa(c, [1, 0, 1], 0.9, temperature=temperature))) < 1e-6
    assert abs(float(soft_cwsa_plus(c, [1, 1, 1], 0.9, temperature=temperature))) < 1e-6


@pytest.mark.parametrize("temperature", [1e-3, 0.02, 0.1])
def test_gradient_direction(temperature):
  # Well above tau: raising a correct sample's confidence raises soft CWSA,
  # raising a wrong sample's confidence lowers it.
  c = jnp.float32([0.95, 0.9, 0.8, 0.75, 0.3])
  kappa = jnp.float32([1, 0, 1, 0, 1])
  for tau in (0.5, 0.6):
    grad = _grad_wrt_confidences(c, kappa, tau, temperature)
    assert grad[0] > 0 and grad[2] > 0
    assert grad[1] < 0 and grad[3] < 0
    grad_plus = _grad_wrt_confidences(c, kappa, tau, temperature, plus=True)
    assert grad_plus[0] > 0 and grad_plus[2] > 0
  # Graded correctness: d/d kappa > 0 for retained samples.
  grad_k = _grad_wrt_kappa(c, kappa, 0.5, temperature)
  assert bool(jnp.all(grad_k[:4] > 0))


def test_traced_temperature_and_invalid_traced_options_give_nan_not_a_number():
  c, kappa = random_case(37, N)
  f = jax.jit(lambda t, tau: soft_cwsa(c, kappa, tau, temperature=t))
  assert abs(float(f(0.02, 0.5)) - soft_reference(c, kappa, 0.5, 0.02)) <= 2e-6
  # Invalid traced options give NaN, and NaN gradients, never a plausible number.
  for t, tau in ((0.0, 0.5), (-1.0, 0.5), (0.02, 1.0), (0.02, -0.1), (np.inf, 0.5)):
    value = f(t, tau)
    grads = jax.grad(lambda t, tau: f(t, tau), argnums=(0, 1))(jnp.float32(t), jnp.float32(tau))
    assert np.isnan(float(value)) and np.all(np.isnan(np.asarray(grads)))


# ---------------------------------------------------------------------------
# Bad input.

@pytest.mark.parametrize("kwargs, match", [
    (dict(confidences=[0.5, np.nan]), "NaN"),
    (dict(confidences=[0.5, 1.2]), r"\[0, 1\]"),
    (dict(confidences=[0.5, 0.6, 0.7]), "same shape"),
    (dict(confidences=[], correct=[]), "empty"),
    (dict(confidences=0.5, correct=1), "samples axis"),
    (dict(correct=[0.5, 2.0]), "correct"),
    (dict(tau=1.0), "tau"),
    (dict(tau=-0.1), "tau"),
    (dict(tau=[0.5, 0.6]), "scalar"),
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=np.inf), "temperature"),
    (dict(temperature=[0.1, 0.2]), "temperature"),
    (dict(normalize="mean"), "normalize"),
])
def test_bad_input_raises(kwargs, match):
  args = dict(confidences=[0.5, 0.8], correct=[1, 0], tau=0.5, temperature=0.01)
  args.update(kwargs)
  normalize = args.pop("normalize", "retained")
  with pytest.raises(ValueError, match=match):
    soft_cwsa(args["confidences"], args["correct"], args["tau"], temperature=args["temperature"],
              normalize=normalize)


@pytest.mark.parametrize("kwargs, match", [
    (dict(band=(0.9, 0.5)), "band"),
    (dict(band=(0.5, 1.0)), "band"),
    (dict(band=0.5), "band"),
    (dict(num_thresholds=1), "num_thresholds"),
    (dict(num_thresholds=4.0), "num_thresholds"),
    (dict(plus=True, normalize="all"), "normalize"),
])
def test_band_bad_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    soft_cwsa_band_area([0.5, 0.8], [1, 0], temperature=0.01, **kwargs)


def test_sweep_bad_thresholds_raise():
  with pytest.raises(ValueError, match="thresholds"):
    soft_cwsa_sweep([0.5, 0.8], [1, 0], [[0.5]], temperature=0.01)
  with pytest.raises(ValueError, match="thresholds"):
    soft_cwsa_sweep([0.5, 0.8], [1, 0], [0.5, 1.0], temperature=0.01)
  with pytest.raises(ValueError, match="empty"):
    soft_cwsa_sweep([0.5, 0.8], [1, 0], [], temperature=0.01)


# ---------------------------------------------------------------------------
# The kernels' ``keep`` (the losses' masks): the sums run over the kept samples.

@functools.partial(jax.jit, static_argnames=("plus", "normalize"))
def _kernel_value_and_grad(c, kappa, tau, temperature, keep, *, plus, normalize):
  from cwsa_jax import _soft
  return jax.value_and_grad(
      lambda x: _soft._soft_metric(x, kappa, tau, temperature, keep, plus=plus,
                                   normalize=normalize))(c)


@pytest.mark.parametrize("plus, normalize", [(False, "retained"), (False, "all"),
                                             (True, "retained")])
def test_kernel_keep_is_the_metric_of_the_kept_samples(plus, normalize):
  from cwsa_jax import _soft
  c, kappa = random_case(50, N_GRAD, graded=True)
  keep = np.random.default_rng(50).random(N_GRAD) < 0.6
  tau, temperature = jnp.float32(0.4), jnp.float32(0.05)
  kw = dict(plus=plus, normalize=normalize)
  got = float(_soft._soft_metric(jnp.asarray(c), jnp.asarray(kappa), tau, temperature,
                                 jnp.asarray(keep), **kw))
  ref = soft_reference(c[keep], kappa[keep], 0.4, 0.05, plus=plus, normalize=normalize)
  assert abs(got - ref) <= 1e-6
  sweep = _soft._sweep(jnp.asarray(c), jnp.asarray(kappa), jnp.float32([0.2, 0.4]), temperature,
                       jnp.asarray(keep), **kw)
  np.testing.assert_allclose(float(sweep[1]), ref, atol=1e-6)
  # Nothing kept: 0, with a zero (finite) gradient, at a tiny temperature too.
  none = np.zeros(N_GRAD, bool)
  value, grad = _kernel_value_and_grad(jnp.asarray(c), jnp.asarray(kappa), tau,
                                       jnp.float32(1e-6), none, **kw)
  assert float(value) == 0.0 and not np.any(np.asarray(grad))
