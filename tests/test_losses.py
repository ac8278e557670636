"""Tests of cwsa_jax.losses (CWSA-regularized cross-entropy)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from cwsa_jax._soft import soft_cwsa
from cwsa_jax.losses import cwsa_regularized_loss, cwsa_surrogate_loss


# ---------------------------------------------------------------------------
# float64 NumPy references.

def log_softmax64(logits):
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def soft_reference(c, kappa, tau, temperature, plus=False):
  z = (c - tau) / temperature
  log_gate = -np.logaddexp(0.0, -z)
  gates = np.exp(log_gate - log_gate.max())
  phi = np.maximum(c - tau, 0.0) / (1.0 - tau)
  score = kappa if plus else 2.0 * kappa - 1.0
  return np.sum(gates * phi * score) / np.sum(gates)


def loss_reference(logits, labels, *, weight=1.0, tau=0.5, temperature=0.05,
                   correctness="probability", band=None, num_thresholds=9, plus=False):
  log_p = log_softmax64(logits)
  labels = np.asarray(labels)
  n = labels.size
  true_log_p = log_p[np.arange(n), labels]
  cross_entropy = -true_log_p.mean()
  c = np.exp(log_p.max(-1))
  if correctness == "hard":
    kappa = (log_p.argmax(-1) == labels).astype(np.float64)
  else:
    kappa = np.exp(true_log_p)
  if band is None:
    soft = soft_reference(c, kappa, tau, temperature, plus)
  else:
    grid = np.linspace(band[0], band[1], num_thresholds).astype(np.float32).astype(np.float64)
    values = [soft_reference(c, kappa, t, temperature, plus) for t in grid]
    soft = np.trapezoid(values, grid) / (grid[-1] - grid[0])
  return cross_entropy + weight * (1.0 - soft), 1.0 - soft


def random_logits(seed, n=64, num_classes=5, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.normal(size=(n, num_classes))).astype(np.float32)
  labels = rng.integers(0, num_classes, n)
  # Make most predictions right so both correct and wrong samples exist above tau.
  right = rng.random(n) < 0.7
  labels = np.where(right, logits.argmax(-1), labels).astype(np.int32)
  return logits, labels


# ---------------------------------------------------------------------------
# Values.

@pytest.mark.parametrize("correctness", ["probability", "hard"])
@pytest.mark.parametrize("tau, temperature", [(0.5, 0.05), (0.0, 0.01), (0.9, 0.2), (0.3, 1e-3)])
def test_matches_float64_reference(correctness, tau, temperature):
  logits, labels = random_logits(int(tau * 10) + int(temperature * 1000))
  kw = dict(weight=0.7, tau=tau, temperature=temperature, correctness=correctness)
  got = float(cwsa_regularized_loss(logits, labels, **kw))
  ref, ref_surrogate = loss_reference(logits, labels, **kw)
  assert abs(got - ref) <= 2e-6 * max(1.0, abs(ref))
  kw.pop("weight")
  got_surrogate = float(cwsa_surrogate_loss(logits, labels, **kw))
  assert abs(got_surrogate - ref_surrogate) <= 2e-6


def test_band_and_plus_match_reference():
  logits, labels = random_logits(3)
  for plus in (False, True):
    kw = dict(weight=2.0, temperature=0.03, band=(0.4, 0.8), num_thresholds=5, plus=plus)
    got = float(cwsa_regularized_loss(logits, labels, **kw))
    ref, _ = loss_reference(logits, labels, **kw)
    assert abs(got - ref) <= 4e-6


def test_weight_zero_is_cross_entropy():
  logits, labels = random_logits(4)
  # One jitted program for both (the eager optax call compiles one per primitive).
  got, expected = jax.jit(lambda l, y: (
      cwsa_regularized_loss(l, y, weight=0.0),
      optax.softmax_cross_entropy_with_integer_labels(l, y).mean()))(logits, labels)
  assert abs(float(got) - float(expected)) <= 1e-6


def test_defaults_and_decomposition():
  logits, labels = random_logits(5)
  # The three in one jitted program (the eager optax call compiles one per primitive).
  total, ce, surrogate = map(float, jax.jit(lambda l, y: (
      cwsa_regularized_loss(l, y),
      optax.softmax_cross_entropy_with_integer_labels(l, y).mean(),
      cwsa_surrogate_loss(l, y)))(logits, labels))
  assert abs(total - (ce + surrogate)) <= 2e-6
  ref, _ = loss_reference(logits, labels)  # defaults: weight 1, tau 0.5, T 0.05, probability
  assert abs(total - ref) <= 2e-6
  assert 0.0 <= surrogate <= 2.0


def test_perfect_confident_predictions_give_zero_surrogate():
  logits = jnp.float32([[50.0, 0.0], [0.0, 50.0]])
  assert float(cwsa_surrogate_loss(logits, jnp.int32([0, 1]))) < 1e-6
  assert abs(float(cwsa_surrogate_loss(logits, jnp.int32([1, 0]))) - 2.0) < 1e-6


def test_batch_axes():
  rng = np.random.default_rng(6)
  logits = rng.normal(size=(3, 20, 4)).astype(np.float32) * 3
  labels = rng.integers(0, 4, (3, 20)).astype(np.int32)
  batched = np.asarray(cwsa_regularized_loss(logits, labels))
  assert batched.shape == (3,)
  rows = [float(cwsa_regularized_loss(logits[i], labels[i])) for i in range(3)]
  np.testing.assert_allclose(batched, rows, atol=1e-6)


# ---------------------------------------------------------------------------
# Gradients.

@functools.partial(jax.jit, static_argnames=("correctness",))
def _surrogate_value_and_grad(logits, labels, correctness="probability"):
  # One program per shape and setting, shared by the gradient tests (eager jax.grad compiles
  # one per primitive).
  return jax.value_and_grad(lambda l: cwsa_surrogate_loss(l, labels, correctness=correctness))(
      logits)


def test_hard_correctness_is_stop_gradient():
  logits, labels = random_logits(7)
  correct = (logits.argmax(-1) == labels)

  def manual(l):
    c = jnp.max(jax.nn.softmax(l), axis=-1)
    return 1.0 - soft_cwsa(c, correct, 0.5, temperature=0.05)

  _, got = _surrogate_value_and_grad(logits, labels, "hard")
  np.testing.assert_allclose(got, jax.jit(jax.grad(manual))(logits), atol=1e-6)
  # With "probability" the gradient also flows through the true-class probability.
  _, prob = _surrogate_value_and_grad(logits, labels, "probability")
  assert float(jnp.max(jnp.abs(prob - got))) > 1e-4


@pytest.mark.parametrize("kw", [
    dict(correctness="probability"),
    dict(correctness="hard"),
    dict(band=(0.3, 0.8), num_thresholds=4),
    dict(tau=0.2, temperature=0.2, plus=True),
])
def test_check_grads_loss(kw):
  logits, labels = random_logits(8, n=16, num_classes=3, scale=1.5)
  kw = {"temperature": 0.1, **kw}
  f = jax.jit(lambda l: cwsa_regularized_loss(l, labels, **kw))
  check_grads(f, (jnp.asarray(logits),), order=1, modes=("rev",), atol=1e-2, rtol=1e-2, eps=1e-3)


@functools.partial(jax.jit, static_argnames=("correctness",))
def _value_and_grad(logits, labels, tau, temperature, correctness):
  f = lambda l: cwsa_regularized_loss(l, labels, tau=tau, temperature=temperature,
                                      correctness=correctness)
  return jax.value_and_grad(f)(logits)


@pytest.mark.parametrize("case", ["huge", "huge_wrong", "uniform", "tiny_temperature", "mixed"])
@pytest.mark.parametrize("correctness", ["probability", "hard"])
def test_values_and_gradients_finite_at_extremes(case, correctness):
  labels = jnp.int32([0, 1, 2, 0])
  logits, tau, temperature = {
      # logits of magnitude 1e4: confidences exactly 1.0 in float32
      "huge": (1e4 * jax.nn.one_hot(labels, 3), 0.5, 0.05),
      "huge_wrong": (-1e4 * jax.nn.one_hot(labels, 3), 0.5, 0.05),
      # every confidence 1/3, below tau = 0.99: nothing retained
      "uniform": (jnp.zeros((4, 3)), 0.99, 1e-6),
      # confidences exactly at tau = 0.5 (two-way ties), T = 1e-6
      "tiny_temperature": (jnp.float32([[2.0, 2.0, -1e4]] * 4), 0.5, 1e-6),
      "mixed": (jnp.float32([[1e4, 0, 0], [0, -1e4, 1e4], [3, 2, 1], [0, 0, 0]]), 0.9, 1e-6),
  }[case]
  value, grad = _value_and_grad(jnp.asarray(logits, jnp.float32), labels, jnp.float32(tau),
                                jnp.float32(temperature), correctness)
  assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(grad))), (value, grad)


def test_gradient_direction_on_logits():
  # Both predictions correct and well above tau: the regulariser raises the
  # winning logit; for a confidently wrong prediction it lowers it.
  logits = jnp.float32([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
  labels = jnp.int32([0, 2])
  for correctness in ("probability", "hard"):
    _, g = _surrogate_value_and_grad(logits, labels, correctness)
    assert g[0, 0] < 0  # descent raises the correct sample's top logit
    assert g[1, 1] > 0  # and lowers the wrong sample's top logit


# ---------------------------------------------------------------------------
# Optimisation on a fixed small problem.

def _gaussian_data(seed, n, num_classes=4, dim=8):
  means = np.random.default_rng(0).normal(scale=0.9, size=(num_classes, dim))
  rng = np.random.default_rng(seed)
  y = rng.integers(0, num_classes, n)
  return jnp.float32(means[y] + rng.normal(size=(n, dim))), jnp.int32(y)


def _fit(params, x, y, loss, steps, learning_rate):
  opt = optax.adam(learning_rate)

  @jax.jit
  def run(params):
    def step(carry, _):
      p, state = carry
      grads = jax.grad(lambda p: loss(x @ p[0] + p[1], y))(p)
      updates, state = opt.update(grads, state, p)
      return (optax.apply_updates(p, updates), state), None
    return jax.lax.scan(step, (params, opt.init(params)), None, length=steps)[0][0]

  return run(params)


# Jitted: one program per data size instead of one per eager primitive.
_linear_softmax = jax.jit(lambda params, x: jax.nn.softmax(x @ params[0] + params[1]))


def _hard_accuracy_and_cwsa(params, x, y, tau):
  probs = np.asarray(_linear_softmax(params, x), np.float64)
  c = probs.max(-1)
  correct = (probs.argmax(-1) == np.asarray(y)).astype(np.float64)
  keep = c >= tau
  phi = (c[keep] - tau) / (1 - tau)
  return correct.mean(), float(np.mean(phi * (2 * correct[keep] - 1)))


def test_optimisation_raises_hard_cwsa_without_lowering_accuracy():
  # A linear softmax model on overlapping Gaussian classes, first trained to
  # convergence with cross-entropy (more cross-entropy steps change nothing);
  # 300 Adam steps of the regularised loss then raise the hard CWSA at tau on
  # the training and on a held-out set, while held-out accuracy does not drop.
  x, y = _gaussian_data(1, 1000)
  x_test, y_test = _gaussian_data(2, 4000)
  tau = 0.5
  cross_entropy = lambda l, y: optax.softmax_cross_entropy_with_integer_labels(l, y).mean()
  start = _fit((jnp.zeros((8, 4)), jnp.zeros(4)), x, y, cross_entropy, 500, 0.05)
  more_ce = _fit(start, x, y, cross_entropy, 300, 0.01)
  tuned = _fit(start, x, y, lambda l, y: cwsa_regularized_loss(l, y, tau=tau), 300, 0.01)

  acc_train0, cwsa_train0 = _hard_accuracy_and_cwsa(start, x, y, tau)
  acc_test0, cwsa_test0 = _hard_accuracy_and_cwsa(start, x_test, y_test, tau)
  _, cwsa_train1 = _hard_accuracy_and_cwsa(tuned, x, y, tau)
  acc_test1, cwsa_test1 = _hard_accuracy_and_cwsa(tuned, x_test, y_test, tau)
  _, cwsa_more_ce = _hard_accuracy_and_cwsa(more_ce, x_test, y_test, tau)

  assert abs(cwsa_more_ce - cwsa_test0) < 1e-3  # cross-entropy alone had converged
  assert cwsa_train1 > cwsa_train0 + 0.03
  assert cwsa_test1 > cwsa_test0 + 0.02
  # Not lower (allowing float-reordering noise of 2 held-out points in 4000).
  assert acc_test1 >= acc_test0 - 0.0005
  assert acc_train0 > 0.75  # the problem is neither trivial nor hopeless


# ---------------------------------------------------------------------------
# Traced options and bad input.

def test_traced_weight_and_temperature_do_not_retrace():
  logits, labels = random_logits(9)
  traces = []

  @jax.jit
  def f(weight, temperature):
    traces.append(1)
    return cwsa_regularized_loss(logits, labels, weight=weight, temperature=temperature)

  for weight, temperature in ((0.5, 0.1), (1.0, 0.05), (2.0, 0.01)):
    ref, _ = loss_reference(logits, labels, weight=weight, temperature=temperature)
    assert abs(float(f(weight, temperature)) - ref) <= 4e-6
  assert len(traces) == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(logits=np.zeros(3)), "logits"),
    (dict(logits=np.zeros((2, 1))), "2 classes"),
    (dict(logits=np.float32([[0, np.nan], [0, 1]])), "NaN"),
    (dict(labels=[0, 3]), "labels"),
    (dict(labels=[0, -1]), "labels"),
    (dict(labels=[0, 1, 1]), "shape"),
    (dict(labels=[0.5, 1.0]), "integer"),
    (dict(logits=np.zeros((0, 3)), labels=np.zeros(0, np.int32)), "empty"),
    (dict(tau=1.0), "tau"),
    (dict(temperature=0.0), "temperature"),
    (dict(weight=-1.0), "weight"),
    (dict(weight=np.nan), "weight"),
    (dict(correctness="soft"), "correctness"),
    (dict(band=(0.8, 0.2)), "band"),
    (dict(band=(0.2, 0.8), num_thresholds=1), "num_thresholds"),
])
def test_bad_input_raises(kwargs, match):
  args = dict(logits=np.zeros((2, 3), np.float32), labels=[0, 1])
  args.update(kwargs)
  logits, labels = args.pop("logits"), args.pop("labels")
  with pytest.raises(ValueError, match=match):
    cwsa_regularized_loss(logits, labels, **args)


# ---------------------------------------------------------------------------
# Focal, inverse focal and soft AURC losses.

import scipy.special  # noqa: E402  (a jax dependency: the float64 digamma reference)

import cwsa_jax as cw  # noqa: E402
from cwsa_jax.losses import (  # noqa: E402
    focal_loss, inverse_focal_loss, soft_aurc_loss, soft_aurc_regularized_loss)


def focal_reference(logits, labels, gamma, inverse=False):
  p_true = np.exp(log_softmax64(logits)[np.arange(len(labels)), np.asarray(labels)])
  base = 1.0 + p_true if inverse else 1.0 - p_true
  return float(np.mean(-(base**gamma) * np.log(p_true)))


def step_aurc_reference(confidences, errors):
  """Mean over k of the error rate of the k most confident (no ties)."""
  order = np.argsort(-np.asarray(confidences, np.float64), kind="stable")
  e = np.asarray(errors, np.float64)[order]
  return float(np.mean(np.cumsum(e) / np.arange(1, e.size + 1)))


def soft_aurc_reference(logits, labels, temperature, correctness="probability"):
  log_p = log_softmax64(logits)
  labels = np.asarray(labels)
  c = np.exp(log_p.max(-1))
  if correctness == "hard":
    errors = (log_p.argmax(-1) != labels).astype(np.float64)
  else:
    errors = 1.0 - np.exp(log_p[np.arange(labels.size), labels])
  n = c.size
  rank = np.empty(n)
  for i in range(n):  # 1 + soft number of others that are more confident
    others = np.delete(c, i)
    rank[i] = 1.0 + np.sum(scipy.special.expit((others - c[i]) / temperature))
  weight = scipy.special.digamma(n + 1) - scipy.special.digamma(rank)
  return float(np.mean(errors * weight))


_focal_jit = jax.jit(focal_loss)  # gamma and temperature traced: one compilation each
_inverse_focal_jit = jax.jit(inverse_focal_loss)
_soft_aurc_jit = jax.jit(soft_aurc_loss, static_argnames=("correctness",))


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 3.0])
def test_focal_losses_match_float64_reference(gamma):
  logits, labels = random_logits(20)
  for fn, inverse in ((_focal_jit, False), (_inverse_focal_jit, True)):
    got = float(fn(logits, labels, gamma=gamma))
    ref = focal_reference(logits, labels, gamma, inverse)
    assert abs(got - ref) <= 2e-6 * max(1.0, ref), (fn.__name__, got, ref)


def test_focal_losses_at_gamma_zero_are_optax_cross_entropy():
  logits, labels = random_logits(21)
  # All five in one jitted program (the eager optax call compiles one per primitive).
  expected, focal0, inverse0, focal2, inverse2 = map(float, jax.jit(lambda l, y: (
      optax.softmax_cross_entropy_with_integer_labels(l, y).mean(),
      focal_loss(l, y, gamma=0.0), inverse_focal_loss(l, y, gamma=0.0),
      focal_loss(l, y, gamma=2.0), inverse_focal_loss(l, y, gamma=2.0)))(logits, labels))
  assert abs(focal0 - expected) <= 1e-6
  assert abs(inverse0 - expected) <= 1e-6
  # Focal weights are <= 1 and inverse focal weights >= 1.
  assert focal2 < expected
  assert inverse2 > expected


def test_focal_traced_gamma_and_batch_axes():
  rng = np.random.default_rng(22)
  logits = (3 * rng.normal(size=(3, 20, 4))).astype(np.float32)
  labels = rng.integers(0, 4, (3, 20)).astype(np.int32)
  traces = []

  @jax.jit
  def f(gamma):
    traces.append(1)
    return focal_loss(logits, labels, gamma=gamma)

  for gamma in (0.0, 1.0, 2.5):
    rows = [focal_reference(logits[i], labels[i], gamma) for i in range(3)]
    np.testing.assert_allclose(np.asarray(f(gamma)), rows, rtol=2e-6)
  assert len(traces) == 1


@pytest.mark.parametrize("seed", [23, 24, 25])
def test_soft_aurc_hard_tends_to_exact_aurc(seed):
  logits, labels = random_logits(seed, n=64, num_classes=5)
  confidences, correct = cw.confidences_from_logits(logits, labels)
  c64 = np.sort(np.asarray(confidences, np.float64))
  gap = np.min(np.diff(c64))
  assert gap > 1e-6  # no ties: the step AURC is the mean of the risks E_k / k
  exact = step_aurc_reference(confidences, ~np.asarray(correct))
  assert abs(float(cw.aurc(confidences, correct)) - exact) <= 1e-6
  errors = [abs(float(soft_aurc_loss(logits, labels, temperature=t, correctness="hard")) - exact)
            for t in (1e-1, 1e-2, 1e-3, gap / 40)]
  assert errors[-1] <= 2e-6, errors
  assert errors[0] > 10 * errors[-1], errors  # the relaxation is not exact at large T


@pytest.mark.parametrize("correctness", ["probability", "hard"])
@pytest.mark.parametrize("temperature", [0.3, 0.02, 1e-3])
def test_soft_aurc_matches_float64_reference(correctness, temperature):
  logits, labels = random_logits(26, n=48)
  got = float(_soft_aurc_jit(logits, labels, temperature=temperature, correctness=correctness))
  ref = soft_aurc_reference(logits, labels, temperature, correctness)
  assert abs(got - ref) <= 5e-6, (got, ref)
  assert 0.0 <= got <= 1.0


def test_soft_aurc_bounds_and_batch_axes():
  rng = np.random.default_rng(27)
  logits = (3 * rng.normal(size=(3, 30, 4))).astype(np.float32)
  wrong = ((logits.argmax(-1) + 1) % 4).astype(np.int32)
  # Every prediction wrong: the hard errors are all 1 and the AURC is 1. The
  # relaxed ranks are majorised by the exact ones, so the soft AURC stays <= 1
  # and rises to 1 as T -> 0.
  values = []
  for temperature in (10.0, 0.1, 1e-3, 1e-7):
    got = np.asarray(soft_aurc_loss(logits, wrong, temperature=temperature, correctness="hard"))
    assert got.shape == (3,)
    values.append(got)
    np.testing.assert_allclose(got, [soft_aurc_reference(logits[i], wrong[i], temperature, "hard")
                                     for i in range(3)], atol=5e-6)
  values = np.array(values)
  assert np.all(values <= 1.0 + 1e-6) and np.all(np.diff(values, axis=0) > 0)
  np.testing.assert_allclose(values[-1], 1.0, atol=2e-5)
  labels = rng.integers(0, 4, (3, 30)).astype(np.int32)
  batched = np.asarray(soft_aurc_loss(logits, labels))
  rows = [soft_aurc_reference(logits[i], labels[i], 0.01) for i in range(3)]
  np.testing.assert_allclose(batched, rows, atol=5e-6)


def test_soft_aurc_regularized_decomposition():
  logits, labels = random_logits(28)
  # Jitted: one program (the eager optax call compiles one per primitive).
  ce = float(jax.jit(lambda l, y: optax.softmax_cross_entropy_with_integer_labels(l, y).mean())(
      logits, labels))
  assert abs(float(soft_aurc_regularized_loss(logits, labels, weight=0.0)) - ce) <= 1e-6
  for correctness in ("probability", "hard"):
    total = float(soft_aurc_regularized_loss(logits, labels, weight=0.7, temperature=0.05,
                                             correctness=correctness))
    ref = ce + 0.7 * soft_aurc_reference(logits, labels, 0.05, correctness)
    assert abs(total - ref) <= 4e-6


def test_soft_aurc_hard_gradient_moves_confidences_only():
  # With hard errors, the gradient lowers a confident wrong prediction's top
  # logit and raises a confident right one's (the ranks are what it can change).
  logits = jnp.float32([[3.0, 0.0, 0.0], [0.0, 2.5, 0.0], [0.0, 0.0, 2.0]])
  labels = jnp.int32([1, 1, 2])  # the most confident sample is wrong
  # Both gradients in one jitted program (eager jax.grad compiles one per primitive).
  g, prob = jax.jit(lambda l: tuple(
      jax.grad(lambda z: soft_aurc_loss(z, labels, temperature=0.05, correctness=how))(l)
      for how in ("hard", "probability")))(logits)
  assert g[0, 0] > 0 and g[1, 1] < 0
  assert float(jnp.max(jnp.abs(prob - g))) > 1e-4  # "probability" also moves p_y


@pytest.mark.parametrize("loss", [
    lambda l, y: focal_loss(l, y, gamma=2.0),
    lambda l, y: inverse_focal_loss(l, y, gamma=2.0),
    lambda l, y: soft_aurc_loss(l, y, temperature=0.1, correctness="hard"),
    lambda l, y: soft_aurc_regularized_loss(l, y, weight=0.5, temperature=0.1),
], ids=["focal", "inverse_focal", "aurc_hard", "aurc_probability_regularized"])
def test_check_grads_new_losses(loss):
  logits, labels = random_logits(29, n=16, num_classes=3, scale=1.5)
  f = jax.jit(lambda l: loss(l, labels))
  check_grads(f, (jnp.asarray(logits),), order=1, modes=("rev",), atol=1e-2, rtol=1e-2, eps=1e-3)


@pytest.mark.parametrize("loss", [
    lambda l, y: focal_loss(l, y, gamma=0.5),  # d/dx x^0.5 is infinite at x = 1 - p_y = 0
    lambda l, y: inverse_focal_loss(l, y, gamma=3.0),
    lambda l, y: soft_aurc_loss(l, y, temperature=1e-6, correctness="hard"),
    lambda l, y: soft_aurc_regularized_loss(l, y, temperature=1e-6),
], ids=["focal", "inverse_focal", "aurc_hard", "aurc_probability_regularized"])
def test_new_losses_finite_at_extreme_logits(loss):
  labels = jnp.int32([0, 1, 2, 0])
  logits = jnp.stack([  # four batches, one loss each
      1e4 * jax.nn.one_hot(labels, 3),  # p_y = 1 exactly in float32
      -1e4 * jax.nn.one_hot(labels, 3),  # p_y = 0 exactly
      jnp.float32([[1e4, 0, 0], [0, -1e4, 1e4], [3, 2, 1], [0, 0, 0]]),
      jnp.zeros((4, 3)),  # every confidence tied
  ]).astype(jnp.float32)
  labels = jnp.broadcast_to(labels, (4, 4))
  values = jax.jit(lambda l: loss(l, labels))(logits)
  grads = jax.jit(jax.grad(lambda l: jnp.sum(loss(l, labels))))(logits)
  assert values.shape == (4,)
  assert bool(jnp.all(jnp.isfinite(values))) and bool(jnp.all(jnp.isfinite(grads))), (values, grads)


@pytest.mark.parametrize("fn, kwargs, match", [
    (focal_loss, dict(gamma=-1.0), "gamma"),
    (inverse_focal_loss, dict(gamma=np.nan), "gamma"),
    (focal_loss, dict(gamma=np.inf), "gamma"),
    (focal_loss, dict(gamma=[1.0, 2.0]), "gamma"),
    (focal_loss, dict(gamma=1.0, logits=np.float32([[0, np.inf], [0, 1]])), "NaN"),
    (inverse_focal_loss, dict(gamma=1.0, labels=[0, 3]), "labels"),
    (soft_aurc_loss, dict(temperature=0.0), "temperature"),
    (soft_aurc_loss, dict(temperature=-1.0), "temperature"),
    (soft_aurc_loss, dict(temperature=np.nan), "temperature"),
    (soft_aurc_loss, dict(correctness="soft"), "correctness"),
    (soft_aurc_loss, dict(logits=np.float32([[0, np.nan], [0, 1]])), "NaN"),
    (soft_aurc_regularized_loss, dict(weight=-1.0), "weight"),
    (soft_aurc_regularized_loss, dict(weight=np.inf), "weight"),
    (soft_aurc_regularized_loss, dict(temperature=0.0), "temperature"),
])
def test_new_losses_bad_input_raises(fn, kwargs, match):
  args = dict(logits=np.zeros((2, 3), np.float32), labels=[0, 1])
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    fn(args.pop("logits"), args.pop("labels"), **args)


def test_surrogate_alone_has_no_gradient_below_tau_and_the_regularized_loss_has_one():
  """The documented trap: every confidence below tau gives loss 1 and gradient exactly 0
  (a fresh 10-class model); cross-entropy in the regularized loss still moves the logits."""
  from cwsa_jax import losses
  logits = 0.1 * jax.random.normal(jax.random.key(0), (64, 10))
  labels = jax.random.randint(jax.random.key(1), (64,), 0, 10)
  loss, grad = _surrogate_value_and_grad(logits, labels)
  assert float(loss) == 1.0 and not np.any(np.asarray(grad))
  grad = jax.jit(jax.grad(lambda z: losses.cwsa_regularized_loss(z, labels)))(logits)
  assert np.abs(np.asarray(grad)).max() > 1e-4
  # once one confidence crosses tau the surrogate's gradient is no longer 0
  crossed = logits.at[0, 0].set(5.0)
  _, grad = _surrogate_value_and_grad(crossed, labels)
  assert np.any(np.asarray(grad))


# ---------------------------------------------------------------------------
# Masks (padded batches): a masked loss is the loss of the kept samples alone.

_MASKED_LOSSES = {
    "surrogate": lambda l, y, **k: cwsa_surrogate_loss(l, y, temperature=0.1, **k),
    "surrogate_band_plus": lambda l, y, **k: cwsa_surrogate_loss(
        l, y, band=(0.3, 0.8), num_thresholds=5, plus=True, **k),
    "regularized_hard": lambda l, y, **k: cwsa_regularized_loss(l, y, correctness="hard", **k),
    "focal": lambda l, y, **k: focal_loss(l, y, gamma=2.0, **k),
    "inverse_focal": lambda l, y, **k: inverse_focal_loss(l, y, gamma=2.0, **k),
    "soft_aurc": lambda l, y, **k: soft_aurc_loss(l, y, temperature=0.05, **k),
    "soft_aurc_regularized": lambda l, y, **k: soft_aurc_regularized_loss(l, y, weight=0.5, **k),
}
_N, _KEPT = 32, 23  # padded batch size; kept samples of the 1-D case


def _padded(seed=40):
  """Logits [32, 4] and labels [32] whose last rows are finite garbage (huge logits)."""
  logits, labels = random_logits(seed, n=_N, num_classes=4)
  rng = np.random.default_rng(seed)
  logits[_KEPT:] = (1e4 * rng.normal(size=(_N - _KEPT, 4))).astype(np.float32)
  return logits, labels


@functools.lru_cache(maxsize=None)
def _masked_program(name):
  """One compiled program per loss (compiling dominates these tests): the loss of the kept
  samples alone, value and gradient with a bool [n] mask, values with an int [2, n] mask
  and a float [1, n] one over a batch axis."""
  f = _MASKED_LOSSES[name]

  @jax.jit
  def program(logits, labels, keep, int_logits, int_labels, int_mask, float_logits,
              float_labels, float_mask):
    kept = f(logits[:_KEPT], labels[:_KEPT])
    value, grad = jax.value_and_grad(lambda l: f(l, labels, mask=keep))(logits)
    return (kept, value, grad, f(int_logits, int_labels, mask=int_mask),
            f(float_logits, float_labels, mask=float_mask))

  return program


@pytest.mark.parametrize("name", sorted(_MASKED_LOSSES))
def test_mask_gives_the_loss_of_the_kept_samples(name):
  logits, labels = _padded()  # the padding rows hold huge logits
  keep = np.arange(_N) < _KEPT
  # int [2, n]: kept samples anywhere in the first row, none in the second.
  perm = np.random.default_rng(1).permutation(_N)
  int_case = (np.stack([logits[perm], logits]), np.stack([labels[perm], labels]),
              np.stack([keep[perm], np.zeros(_N, bool)]).astype(np.int32))
  # float [1, n] broadcast (any nonzero keeps a sample); the second row holds the same
  # kept samples in another order.
  shuffle = np.concatenate([np.random.default_rng(2).permutation(_KEPT),
                            _KEPT + np.arange(_N - _KEPT)[::-1]])
  float_case = (np.stack([logits, logits[shuffle]]), np.stack([labels, labels[shuffle]]),
                np.where(keep, 0.5, 0.0).astype(np.float32)[None])
  program = _masked_program(name)
  kept, value, grad, int_values, float_values = program(logits, labels, keep, *int_case,
                                                        *float_case)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7)
  close(float(value), float(kept))
  close(np.asarray(int_values), [float(kept), 0.0])  # a row with nothing kept: 0
  close(np.asarray(float_values), [float(kept)] * 2)
  grad = np.asarray(grad)
  assert np.all(np.isfinite(grad)) and not np.any(grad[_KEPT:])  # exactly 0 on the padding
  # Nothing kept (a padding-only step): loss 0 and gradient 0.
  _, value, grad, _, _ = program(logits, labels, np.zeros(_N, bool), *int_case, *float_case)
  assert float(value) == 0.0 and not np.any(np.asarray(grad))


def test_mask_under_jit_is_traced():
  logits, labels = _padded()
  traces = []

  @jax.jit
  def f(logits, mask):
    traces.append(1)
    return (cwsa_regularized_loss(logits, labels, mask=mask),
            soft_aurc_regularized_loss(logits, labels, mask=mask),
            focal_loss(logits, labels, gamma=1.0, mask=mask))

  for kept in (_KEPT, 10, 0):
    keep = np.arange(_N) < kept
    got = f(logits, keep)
    eager = (cwsa_regularized_loss(logits, labels, mask=keep.tolist()),  # a list is fine
             soft_aurc_regularized_loss(logits, labels, mask=keep),
             focal_loss(logits, labels, gamma=1.0, mask=keep))
    np.testing.assert_allclose(np.asarray(got), np.asarray(eager), rtol=1e-6, atol=1e-7)
  assert len(traces) == 1


def test_traced_invalid_mask_or_padding_gives_nan():
  # As everywhere in the kit: invalid traced values give a NaN loss, never a number.
  logits, labels = _padded()
  keep = (np.arange(_N) < _KEPT).astype(np.float32)
  f = jax.jit(lambda l, m: cwsa_regularized_loss(l, labels, mask=m))
  assert np.isfinite(float(f(logits, keep)))
  assert np.isnan(float(f(logits, np.where(np.arange(_N) == 3, np.nan, keep))))
  assert np.isnan(float(f(logits, np.where(np.arange(_N) == 30, np.inf, keep))))
  # NaN logits in a dropped row are still invalid input (checked in full).
  nan_logits = logits.copy()
  nan_logits[-1, 0] = np.nan
  assert np.isnan(float(f(nan_logits, keep)))
  # ... and with batch axes only the row that holds them.
  g = jax.jit(lambda l, m: soft_aurc_loss(l, np.stack([labels, labels]), mask=m))
  values = np.asarray(g(np.stack([logits, nan_logits]), keep))
  assert np.isfinite(values[0]) and np.isnan(values[1])


@pytest.mark.parametrize("mask, error, match", [
    (np.ones(_N + 1, bool), ValueError, "mask must be broadcastable to labels.shape"),
    (np.ones((2, _N), bool), ValueError, "mask must be broadcastable"),
    (np.ones((_N, 1), bool), ValueError, "mask must be broadcastable"),
    (np.ones(_N, np.complex64), TypeError, "mask must be a boolean, integer or float"),
    (np.array(["yes"] * _N), TypeError, "mask must be a boolean, integer or float"),
    (object(), TypeError, "mask must be a boolean, integer or float"),
    ([[1, 0], [1]], ValueError, "mask must be a boolean, integer or float"),
    (np.where(np.arange(_N) == 5, np.nan, 1.0), ValueError, "mask contains 1 NaN"),
    (np.where(np.arange(_N) == 5, np.inf, 1.0), ValueError, "mask contains 1 NaN or infinite"),
])
@pytest.mark.parametrize("name", ["regularized_hard", "focal", "soft_aurc"])
def test_bad_mask_raises(name, mask, error, match):
  logits, labels = _padded()
  with pytest.raises(error, match=match):
    _MASKED_LOSSES[name](logits, labels, mask=mask)


def test_invalid_values_in_dropped_rows_still_raise():
  logits, labels = _padded()
  keep = np.arange(_N) < _KEPT
  bad = logits.copy()
  bad[-1, 0] = np.inf
  with pytest.raises(ValueError, match="logits contains 1 NaN or infinite"):
    cwsa_surrogate_loss(bad, labels, mask=keep)
  with pytest.raises(ValueError, match="labels must lie in"):
    focal_loss(logits, np.where(keep, labels, -1), gamma=1.0, mask=keep)
