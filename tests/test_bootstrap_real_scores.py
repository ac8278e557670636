"""The public bootstraps on real-valued scores and on float64 confidences finer than float32.

A resample keeps the order, the ties and each sample's side of a fixed threshold, so the order
metrics must give on real-valued scores exactly what they give on the scores' dense ranks mapped
into [0, 1], and the fast paths must give on float64 confidences what a float64 reference gives
on the same resample indices. Metrics of probabilities keep refusing real-valued scores.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from cwsa_jax import (auroc, aurc, cwsa, ece, fpr_at_tpr, risk_coverage_curve, selective_accuracy,
                      sweep)
from cwsa_jax._bootstrap import (bootstrap_ci, bootstrap_samples, bootstrap_sweep,
                                 paired_bootstrap)
from cwsa_jax._bootstrap._sampler import _resample_indices

N = 120  # one sample size and one resample count throughout: shared compilations
B = 40
KEY = jax.random.key(11)
GRID = np.array([0.3, 0.5, 0.7])  # float64 thresholds, exact in float32 too
ATOL = 2e-6


def _logits(seed):
  """Real-valued scores with ties (rounded), and correctness that follows them."""
  rng = np.random.default_rng(seed)
  logits = np.round(rng.normal(size=N) * 4, 1)
  return logits, rng.random(N) < 1 / (1 + np.exp(-logits))


def _ranked(x):
  """Dense ranks mapped into [0, 1]: float32 keeps them apart at this size."""
  distinct, rank = np.unique(x, return_inverse=True)
  return (rank / (distinct.size - 1)).astype(np.float32)


def _fine(seed):
  """float64 confidences in clusters narrower than float32's resolution, straddling GRID and
  the width edges j / 10 (float32 rounds each cluster to one value on the threshold)."""
  rng = np.random.default_rng(seed)
  c = rng.choice(np.array([0.3, 0.5, 0.7, 0.9]), N) + rng.integers(-3, 4, N) * 1e-10
  return c, rng.random(N) < c


def _leaves_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _close_to(result, fn64, c, k, idx):
  """``result`` (estimate, low, high) against the float64 reference bootstrap of ``fn64``."""
  want = reference.bootstrap(fn64, c, k, idx)
  for got, w in zip(result, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), w, atol=ATOL, rtol=0)


# ------------------------------------------------------------------ float64 references


def _aurc64(c, k, convention="step"):
  """AURC over the distinct float64 scores, high to low (one point per tie group)."""
  loss, n = 1.0 - np.asarray(k, np.float64), len(c)
  area, prev_k, prev_r = 0.0, 0, None
  for t in np.unique(c)[::-1]:
    kept = c >= t
    size, r = int(kept.sum()), loss[kept].sum() / kept.sum()
    prev_r = r if prev_r is None else prev_r
    area += (size - prev_k) / n * (r if convention == "step" else (prev_r + r) / 2)
    prev_k, prev_r = size, r
  return area


def _auroc64(s, k):
  """Mann-Whitney: P(correct scores above wrong), ties one half (NaN with one class)."""
  pos, neg = s[np.asarray(k, bool)], s[~np.asarray(k, bool)]
  if not pos.size or not neg.size:
    return np.nan
  return float(np.mean((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None])))


def _ece64(c, k, num_bins=10):
  """Equal-width ECE with float64 edges j / B (``e_j <= c < e_{j+1}``)."""
  bins = np.searchsorted(np.arange(1, num_bins) / num_bins, c, side="right")
  k = np.asarray(k, np.float64)
  return sum(np.sum(bins == b) / len(c) * abs(c[bins == b].mean() - k[bins == b].mean())
             for b in np.unique(bins))


# ------------------------------------------------------------------ real-valued scores


@pytest.mark.parametrize("fn", [functools.partial(aurc, convention="trapezoid"), auroc],
                         ids=["aurc", "auroc"])  # the area path and the generic one
def test_real_scores_equal_the_call_on_their_ranks(fn):
  logits, ok = _logits(0)
  want = bootstrap_ci(fn, _ranked(logits), ok, key=KEY, num_resamples=B)
  for scores in (logits.astype(np.float32), logits, jnp.asarray(logits, jnp.float32)):
    _leaves_equal(bootstrap_ci(fn, scores, ok, key=KEY, num_resamples=B), want)


def test_real_scores_against_float64_references():
  logits, ok = _logits(1)
  idx = np.asarray(_resample_indices(KEY, N, B))
  _close_to(bootstrap_ci(aurc, logits, ok, key=KEY, num_resamples=B), _aurc64, logits, ok, idx)
  _close_to(bootstrap_ci(auroc, logits, ok, key=KEY, num_resamples=B), _auroc64, logits, ok, idx)


def test_the_curve_of_real_scores_keeps_their_values():
  # Each resample's thresholds are its distinct scores (float32), high to low, padded with the
  # last; the interval is taken over those values, not over stand-ins.
  logits, ok = _logits(2)
  scores = logits.astype(np.float32)
  idx = np.asarray(_resample_indices(KEY, N, B))

  def curve64(c, k):
    thresholds, coverage, risk, generalized = reference.risk_coverage_curve(c, k)
    pad = lambda x: np.concatenate([x, np.full(N - x.size, x[-1])])  # noqa: E731
    return np.stack([pad(thresholds), pad(coverage), pad(risk), pad(generalized)])

  r = bootstrap_ci(risk_coverage_curve, scores, ok, key=KEY, num_resamples=B)
  want = reference.bootstrap(curve64, scores, ok, idx)
  for got, w in zip(r, want):
    for field, row in zip((got.thresholds, got.coverage, got.risk, got.generalized_risk), w):
      np.testing.assert_allclose(np.asarray(field, np.float64), row, rtol=1e-6, atol=ATOL)
  np.testing.assert_array_equal(np.asarray(r.estimate.thresholds),
                                np.asarray(risk_coverage_curve(scores, ok).thresholds))


def test_paired_bootstrap_of_real_scores_equals_the_call_on_their_ranks():
  logits_a, ok = _logits(3)
  logits_b = logits_a * 3.0 - 7.0 + np.round(np.random.default_rng(4).normal(size=N), 1)
  fn = functools.partial(fpr_at_tpr, tpr=0.9)
  got = paired_bootstrap(fn, logits_a, ok, logits_b, ok, key=KEY, num_resamples=B)
  want = paired_bootstrap(fn, _ranked(logits_a), ok, _ranked(logits_b), ok, key=KEY,
                          num_resamples=B)
  _leaves_equal(got, want)
  same = paired_bootstrap(fn, logits_a, ok, logits_a, ok, key=KEY, num_resamples=B)
  assert float(same.difference) == float(same.low) == float(same.high) == 0.0


@pytest.mark.parametrize("call", [
    lambda s, k: bootstrap_ci(lambda c, k: cwsa(c, k, 0.5), s, k, key=KEY, num_resamples=B),
    lambda s, k: bootstrap_ci(functools.partial(cwsa, tau=0.5), s, k, key=KEY, num_resamples=B),
    lambda s, k: bootstrap_ci(ece, s, k, key=KEY, num_resamples=B),
    lambda s, k: bootstrap_ci(functools.partial(sweep, thresholds=GRID), s, k, key=KEY,
                              num_resamples=B),
    # An order metric inside a lambda: the bootstrap cannot know what the lambda computes.
    lambda s, k: bootstrap_samples(lambda c, k: aurc(c, k), s, k, key=KEY, num_resamples=B),
    lambda s, k: paired_bootstrap(functools.partial(selective_accuracy, tau=0.5), s * 0 + 0.5,
                                  k, s, k, key=KEY, num_resamples=B),
    lambda s, k: bootstrap_sweep(s, k, GRID, key=KEY, num_resamples=B),
], ids=["lambda", "cwsa_partial", "ece", "sweep", "lambda_of_aurc", "paired", "bootstrap_sweep"])
def test_metrics_of_probabilities_refuse_real_scores(call):
  logits, ok = _logits(5)
  with pytest.raises(ValueError, match=r"must lie in \[0, 1\].*not a metric of the scores' order"):
    call(logits, ok)


# ------------------------------------------------------------------ float64 finer than float32


def test_float64_confidences_keep_their_order_and_threshold_comparisons():
  c, ok = _fine(6)
  idx = np.asarray(_resample_indices(KEY, N, B))
  # The data are such that float32 rounding changes the answers: the test can fail.
  c32 = c.astype(np.float32).astype(np.float64)
  assert any(_aurc64(c[i], ok[i]) != pytest.approx(_aurc64(c32[i], ok[i]), abs=1e-4) for i in idx)
  assert reference.hard_metrics(c, ok, 0.5)[0] != reference.hard_metrics(c32, ok, 0.5)[0]
  assert _ece64(c, ok) != pytest.approx(_ece64(c32, ok), abs=1e-4)

  _close_to(bootstrap_ci(aurc, c, ok, key=KEY, num_resamples=B), _aurc64, c, ok, idx)  # area path
  _close_to(bootstrap_ci(auroc, c, ok, key=KEY, num_resamples=B), _auroc64, c, ok, idx)  # generic
  _close_to(bootstrap_ci(functools.partial(cwsa, tau=0.5), c, ok, key=KEY, num_resamples=B),
            lambda c, k: reference.hard_metrics(c, k, 0.5)[2], c, ok, idx)
  _close_to(bootstrap_ci(functools.partial(ece, num_bins=10), c, ok, key=KEY, num_resamples=B),
            _ece64, c, ok, idx)  # bucketed once

  def sweep64(c, k):
    return reference.sweep(c, k, GRID).T  # [4 fields, T]

  want = reference.bootstrap(sweep64, c, ok, idx)
  for result in (bootstrap_ci(functools.partial(sweep, thresholds=GRID), c, ok, key=KEY,
                              num_resamples=B),
                 bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B)):
    for got, w in zip(result, want):
      fields = (got.coverage, got.selective_accuracy, got.cwsa, got.cwsa_plus)
      for field, row in zip(fields, w):
        np.testing.assert_allclose(np.asarray(field, np.float64), row, atol=ATOL, rtol=0)


def test_float64_jax_arrays_under_x64():
  c, ok = _fine(7)
  want = bootstrap_ci(aurc, c, ok, key=KEY, num_resamples=B)
  with jax.enable_x64(True):
    got = bootstrap_ci(aurc, jnp.asarray(c), ok, key=KEY, num_resamples=B)
  _leaves_equal(got, want)
