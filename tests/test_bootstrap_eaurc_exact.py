"""E-AURC of the in-memory bootstrap from exact differences (issue 40, the bootstrap's part).

The evaluation bootstrap (``bootstrap_evaluation``, ``paired_evaluation`` and the area path of
``bootstrap_ci``) used to compute each resample's E-AURC as its float32 AURC less the oracle's
closed form: for a nearly optimal ranking the two nearly cancel. Each resample's E-AURC is now
summed from the integer differences ``E_K - E*_K`` (``_area_scan._excess_sum``); these tests hold
it to 1e-6 relative against a float64 reference on the resampled rows that knows nothing of that
decomposition: the areas summed exactly (``math.fsum``) less the oracle's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
import reference
from cwsa_jax._bootstrap import _area_scan, _engine, _intervals
from cwsa_jax._bootstrap._sampler import _poisson_multiplicities, _resample_indices

N = 20_000  # the one size of the nearly optimal rankings (every program compiles once)
B = 6
KEY = jax.random.key(40)
GRID = np.array([0.5], np.float32)


def reference_eaurc(c: np.ndarray, ok: np.ndarray, convention: str) -> float:
  """float64 E-AURC of rows (ties allowed): AURC as a sum over the tie groups of W E_K / K
  ("step") or W (R' + R) / 2 ("trapezoid"), less the oracle's AURC (the strict order with
  the correct samples first, or all correct tied above all errors tied), each sum exact."""
  order = np.argsort(-c.astype(np.float64), kind="stable")
  c, ok = c[order], ok[order]
  n, m = ok.size, int(ok.sum())
  if m in (0, n):
    return 0.0
  ends = np.append(np.flatnonzero(c[1:] != c[:-1]) + 1, n)
  return reference.eaurc_fsum(ok, ends, convention)


def nearly_optimal(swaps: int = 5, num_errors: int = N // 10):
  """Distinct float32 confidences, shuffled, whose decreasing order is the optimal one with
  the ``swaps`` correct samples just above the errors swapped with the errors just below."""
  m = N - num_errors
  ok_sorted = np.zeros(N, bool)
  ok_sorted[:m - swaps] = True
  ok_sorted[m:m + swaps] = True
  c_sorted = (1.0 - np.arange(N) / N).astype(np.float32)
  perm = np.random.default_rng(swaps).permutation(N)
  return c_sorted[perm], ok_sorted[perm]


def assert_exact(got, rows, convention, *, one_shot=True):
  """Each resample's E-AURC ``got`` [B] against the reference on its rows (and ``cw.eaurc``)."""
  for b, (c, ok) in enumerate(rows):
    want = reference_eaurc(c, ok, convention)
    assert want > 0
    assert float(got[b]) == pytest.approx(want, rel=1e-6, abs=0), (convention, b)
    if one_shot:
      assert float(got[b]) == pytest.approx(float(cw.eaurc(c, ok, convention=convention)),
                                            rel=1e-6, abs=0)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_bootstrap_ci_resamples_of_a_nearly_optimal_ranking(convention):
  c, ok = nearly_optimal()
  samples = _engine._area_samples(None, convention, (c, ok), key=KEY, num_resamples=B)
  idx = np.asarray(_resample_indices(KEY, N, B))
  assert_exact(np.asarray(samples.eaurc), [(c[i], ok[i]) for i in idx], convention)
  # bootstrap_ci(eaurc) takes this path: its interval is the percentile interval of these.
  result = cw.bootstrap_ci(functools.partial(cw.eaurc, convention=convention), c, ok, key=KEY,
                           num_resamples=B)
  low, high = _intervals._interval_jit(samples.eaurc, jnp.float32(0.95))
  assert (float(result.low), float(result.high)) == (float(low), float(high))

  # The data make the point: AURC less the oracle in float32 (what the scan still computes
  # without the exact sum) misses the 1e-6 above on these resamples.
  run = _engine._EvaluationRun.prepare(c, ok, GRID, 1, "l1", convention, "retained",
                                       "multinomial", "test")
  m = np.zeros(N, np.int32)
  np.add.at(m, np.asarray(run.data.rank)[idx[0]], 1)
  carry = _area_scan._area_scan(jnp.asarray(m), run.data.correct, run.data.group_end,
                                _area_scan._area_carry_zero(), convention)
  old = float(_area_scan._areas_from_carry(carry, convention)["eaurc"])
  assert abs(old / float(samples.eaurc[0]) - 1) > 2e-6


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_evaluation_engine_poisson_resamples(convention):
  """bootstrap_evaluation's Poisson resamples (rows repeated by their multiplicity), and its
  estimate (the data once)."""
  c, ok = nearly_optimal(swaps=3)
  run = _engine._EvaluationRun.prepare(c, ok, GRID, 1, "l1", convention, "retained", "poisson",
                                       "test")
  got = run.block(KEY, jnp.uint32(0), B)["eaurc"]
  mult = np.asarray(_poisson_multiplicities(KEY, np.arange(N), B))
  assert_exact(np.asarray(got), [(np.repeat(c, k), np.repeat(ok, k)) for k in mult],
               convention, one_shot=False)
  estimate = run.estimate()["eaurc"]
  assert float(estimate) == pytest.approx(reference_eaurc(c, ok, convention), rel=1e-6)
  assert float(estimate) == pytest.approx(float(cw.eaurc(c, ok, convention=convention)),
                                          rel=1e-6)


def test_optimal_and_one_class_resamples_are_exactly_zero():
  """Two confidence levels, every correct sample above every error: each resample is the
  "trapezoid" oracle itself (0.0), while its tied errors cost "step" area (> 0); one class
  gives 0.0 under both."""
  rng = np.random.default_rng(3)
  ok = rng.random(N) < 0.8
  c = np.where(ok, 0.9, 0.2).astype(np.float32)
  trapezoid = _engine._area_samples("eaurc", "trapezoid", (c, ok), key=KEY, num_resamples=B)
  step = _engine._area_samples("eaurc", "step", (c, ok), key=KEY, num_resamples=B)
  assert np.all(np.asarray(trapezoid) == 0.0)
  idx = np.asarray(_resample_indices(KEY, N, B))
  for b, i in enumerate(idx):
    assert float(step[b]) == pytest.approx(reference_eaurc(c[i], ok[i], "step"), rel=1e-6)
  for convention in ("step", "trapezoid"):
    for every in (np.ones(N, bool), np.zeros(N, bool)):
      values = _engine._area_samples("eaurc", convention, (c, every), key=KEY, num_resamples=B)
      assert np.all(np.asarray(values) == 0.0)


def test_large_multiplicities_and_tie_groups():
  """Multiplicities past the terms summed one by one (the closed form of the rest), zero
  multiplicities at group ends, groups across the oracle's m, and ordinary random data."""
  rng = np.random.default_rng(5)
  n = 200
  c = np.round(rng.random(n), 1).astype(np.float32)
  ok = rng.random(n) < c
  order = np.argsort(-c, kind="stable")
  cs, oks = c[order], ok[order]
  group_end = jnp.asarray(np.append(cs[1:] != cs[:-1], True))
  groups = _area_scan._tie_groups(group_end)
  excess = jax.jit(_area_scan._excess_sum, static_argnames=("convention", "kernels"))
  for m in (rng.poisson(1.0, n), np.where(rng.random(n) < 0.3, rng.integers(13, 60, n), 0),
            np.where(rng.random(n) < 0.5, 0, 1)):
    for convention in ("step", "trapezoid"):
      total = excess(jnp.asarray(m, jnp.int32), jnp.asarray(oks), group_end, groups,
                     convention=convention)
      rows = (np.repeat(cs, m), np.repeat(oks, m))
      want = reference_eaurc(*rows, convention)
      # The closed form of a sample's positions past 12 rounds its parts against each other.
      assert float(total) / m.sum() == pytest.approx(want, rel=1e-5, abs=1e-9), convention
