"""The synthetic models and stress tests: definitions, seeding, vmap, bad parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import synthetic
from cwsa_jax._confidence import confidences_from_probs

N = 1000          # one shape for most tests: every new shape is a new compilation
BIG = 20000       # for the statistical checks


def _np(sample):
  return synthetic.SyntheticPredictions(*(np.asarray(x) for x in sample))


def _check_structure(s, num_classes=3):
  s = _np(s)
  assert s.labels.dtype == np.int32 and s.predictions.dtype == np.int32
  assert s.confidences.dtype == np.float32 and s.correct.dtype == bool
  assert s.labels.min() >= 0 and s.labels.max() < num_classes
  assert s.predictions.min() >= 0 and s.predictions.max() < num_classes
  np.testing.assert_array_equal(s.correct, s.predictions == s.labels)
  assert s.confidences.min() >= 0.0 and s.confidences.max() <= 1.0
  return s


@pytest.mark.parametrize("model", synthetic.MODELS)
def test_presets_follow_the_paper(model):
  s = _check_structure(synthetic.generate(model, jax.random.key(1), num_samples=BIG))
  params = synthetic.PAPER_PARAMETERS[model]
  p = params["p_correct"]
  expected_accuracy = p + (1 - p) / 3
  # 5 binomial standard deviations.
  tol = 5 * np.sqrt(expected_accuracy * (1 - expected_accuracy) / BIG) + 1e-9
  assert abs(s.correct.mean() - expected_accuracy) <= tol
  lo, hi = params["correct_confidence"]
  right = s.confidences[s.correct]
  assert right.min() >= np.float32(lo) and right.max() <= np.float32(hi)
  if lo < hi:  # uniform on [lo, hi]: mean and spread
    assert abs(right.mean() - (lo + hi) / 2) < 0.01
    assert right.std() == pytest.approx((hi - lo) / np.sqrt(12), rel=0.05)
  wrong = s.confidences[~s.correct]
  if wrong.size:
    lo, hi = params["wrong_confidence"]
    assert wrong.min() >= np.float32(lo) and wrong.max() <= np.float32(hi)


def test_perfect_model_is_exactly_confident():
  s = _np(synthetic.perfect(jax.random.key(0), num_samples=N))
  assert s.correct.all()
  assert (s.confidences == 1.0).all()


def test_random_model_ignores_labels():
  s = _np(synthetic.random(jax.random.key(0), num_samples=BIG))
  # Predictions independent of labels: every (label, prediction) pair about 1/9 of the samples.
  counts = np.zeros((3, 3))
  np.add.at(counts, (s.labels, s.predictions), 1)
  np.testing.assert_allclose(counts / BIG, 1 / 9, atol=0.01)


def test_labels_are_uniform():
  s = _np(synthetic.calibrated(jax.random.key(2), num_samples=BIG))
  np.testing.assert_allclose(np.bincount(s.labels, minlength=3) / BIG, 1 / 3, atol=0.015)


def test_same_key_same_draw_different_key_different_draw():
  a = _np(synthetic.calibrated(jax.random.key(3), num_samples=N))
  b = _np(synthetic.calibrated(jax.random.key(3), num_samples=N))
  c = _np(synthetic.calibrated(jax.random.key(4), num_samples=N))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.confidences, c.confidences)


def test_raw_uint32_keys_work():
  s = synthetic.calibrated(jax.random.PRNGKey(0), num_samples=N)
  _check_structure(s)


def test_vmap_over_keys_equals_a_loop():
  keys = jax.random.split(jax.random.key(5), 4)
  batch = jax.vmap(lambda k: synthetic.overconfident(k, num_samples=N))(keys)
  assert batch.confidences.shape == (4, N)
  for i in range(4):
    one = synthetic.overconfident(keys[i], num_samples=N)
    for x, y in zip(batch, one):
      np.testing.assert_array_equal(np.asarray(x[i]), np.asarray(y))


def test_vmap_over_parameters_and_jit():
  p = jnp.array([0.0, 0.5, 1.0])
  fn = jax.jit(jax.vmap(lambda q: synthetic.simulate(jax.random.key(0), num_samples=BIG, p_correct=q)))
  acc = np.asarray(fn(p).correct.mean(axis=1))
  np.testing.assert_allclose(acc, [1 / 3, 0.5 + 0.5 / 3, 1.0], atol=0.015)


def test_overrides_change_the_model():
  s = _np(synthetic.calibrated(jax.random.key(0), num_samples=BIG, p_correct=0.7,
                               wrong_confidence=(0.1, 0.2)))
  assert abs(s.correct.mean() - (0.7 + 0.3 / 3)) < 0.015
  assert s.confidences[~s.correct].max() <= np.float32(0.2)


def test_sample_models_matches_generate():
  key = jax.random.key(7)
  batch = synthetic.sample_models(key, num_seeds=3, num_samples=N)
  assert batch.confidences.shape == (len(synthetic.MODELS), 3, N)
  for i, model in enumerate(synthetic.MODELS):
    keys = jax.random.split(jax.random.fold_in(key, i), 3)
    for j in range(3):
      one = synthetic.generate(model, keys[j], num_samples=N)
      np.testing.assert_array_equal(np.asarray(batch.confidences[i, j]), np.asarray(one.confidences))
      np.testing.assert_array_equal(np.asarray(batch.correct[i, j]), np.asarray(one.correct))


def test_predict_uses_given_labels():
  labels = jnp.arange(N, dtype=jnp.int32) % 3
  s = _check_structure(synthetic.predict(jax.random.key(0), labels, p_correct=1.0))
  np.testing.assert_array_equal(s.labels, np.asarray(labels))
  assert s.correct.all()


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3, 0.7, 1.0])
def test_label_noise_changes_exactly_floor_rate_n_labels(rate):
  base = synthetic.calibrated(jax.random.key(0), num_samples=N)
  noisy = _check_structure(synthetic.with_label_noise(jax.random.key(1), base, rate=rate))
  base = _np(base)
  changed = noisy.labels != base.labels
  assert changed.sum() == int(rate * N)
  np.testing.assert_array_equal(noisy.predictions, base.predictions)
  np.testing.assert_array_equal(noisy.confidences, base.confidences)


def test_label_noise_under_vmap_over_rates():
  base = synthetic.calibrated(jax.random.key(0), num_samples=N)
  rates = jnp.array([0.1, 0.2, 0.3, 0.4])
  noisy = jax.vmap(lambda r: synthetic.with_label_noise(jax.random.key(1), base, rate=r))(rates)
  changed = np.asarray(noisy.labels != base.labels[None]).sum(axis=1)
  np.testing.assert_array_equal(changed, [100, 200, 300, 400])


def test_label_noise_picks_other_classes_uniformly():
  base = synthetic.perfect(jax.random.key(0), num_samples=BIG)
  noisy = _np(synthetic.with_label_noise(jax.random.key(1), base, rate=1.0))
  offsets = (noisy.labels - np.asarray(base.labels)) % 3
  assert set(np.unique(offsets)) == {1, 2}
  assert abs((offsets == 1).mean() - 0.5) < 0.02


@pytest.mark.parametrize("share", [0.0, 0.2, 0.4])
def test_imbalanced_class_share_is_exact(share):
  s = _check_structure(synthetic.imbalanced(jax.random.key(0), class0_share=share, num_samples=N))
  assert (s.labels == 0).sum() == int(share * N)
  if share < 1:
    assert set(np.unique(s.labels[s.labels != 0])) == {1, 2}


def test_imbalanced_minority_accuracy():
  s = _np(synthetic.imbalanced(jax.random.key(0), class0_share=0.5, minority_p_correct=0.4,
                               num_samples=BIG))
  minority = s.labels == 0
  assert abs(s.correct[minority].mean() - (0.4 + 0.6 / 3)) < 0.02
  assert abs(s.correct[~minority].mean() - (0.9 + 0.1 / 3)) < 0.02


def test_confidence_shift_clips_and_keeps_outcomes():
  base = synthetic.calibrated(jax.random.key(0), num_samples=N)
  for shift in (-0.6, -0.1, 0.0, 0.25):
    s = _np(synthetic.with_confidence_shift(base, shift=shift))
    expected = np.clip(np.asarray(base.confidences) + np.float32(shift), 0, 1)
    np.testing.assert_allclose(s.confidences, expected, atol=1e-7)
    np.testing.assert_array_equal(s.correct, np.asarray(base.correct))


def test_to_probs_round_trips_through_confidences_from_probs():
  s = synthetic.overconfident(jax.random.key(0), num_samples=N)
  probs = synthetic.to_probs(s)
  assert probs.shape == (N, 3)
  np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, atol=1e-6)
  c, ok = confidences_from_probs(probs, s.labels)
  np.testing.assert_allclose(np.asarray(c), np.asarray(s.confidences), atol=1e-7)
  np.testing.assert_array_equal(np.asarray(ok), np.asarray(s.correct))


def test_to_probs_refuses_confidences_below_one_over_k():
  s = synthetic.random(jax.random.key(0), num_samples=N)
  with pytest.raises(ValueError, match="1/num_classes"):
    synthetic.to_probs(s)


@pytest.mark.parametrize("call, message", [
    (lambda k: synthetic.calibrated(k, p_correct=1.5), "p_correct"),
    (lambda k: synthetic.calibrated(k, correct_confidence=(0.9, 0.8)), "low <= high"),
    (lambda k: synthetic.calibrated(k, wrong_confidence=(0.5, 1.2)), r"wrong_confidence\[1\]"),
    (lambda k: synthetic.calibrated(k, wrong_confidence=0.5), "pair"),
    (lambda k: synthetic.calibrated(k, num_samples=0), "num_samples"),
    (lambda k: synthetic.calibrated(k, num_samples=10.0), "num_samples"),
    (lambda k: synthetic.calibrated(k, num_classes=1), "num_classes"),
    (lambda k: synthetic.calibrated(k, temperature=1.0), "unknown parameter"),
    (lambda k: synthetic.generate("bayesian", k), "model must be one of"),
    (lambda k: synthetic.imbalanced(k, class0_share=-0.1), "class0_share"),
    (lambda k: synthetic.with_label_noise(k, synthetic.perfect(k, num_samples=N), rate=2.0), "rate"),
    (lambda k: synthetic.with_label_noise(k, (1, 2, 3, 4), rate=0.1), "SyntheticPredictions"),
    (lambda k: synthetic.with_confidence_shift(synthetic.perfect(k, num_samples=N),
                                               shift=float("nan")), "finite"),
    (lambda k: synthetic.predict(k, jnp.array([0, 3]), num_classes=3), "labels"),
])
def test_bad_parameters_raise(call, message):
  with pytest.raises(ValueError, match=message):
    call(jax.random.key(0))
