"""E-AURC from exact differences (issue 40): no cancellation of AURC against the oracle's.

E-AURC used to be AURC minus the oracle's AURC, two float32 areas that nearly cancel for a
nearly optimal ranking: at n = 10^6 with 10 swapped pairs it returned exactly 0 (truth about
1.1e-10), with 1000 swaps a relative error of 3.8e-4. It is now a sum of nonnegative terms
from the integer differences ``E_k - E*_k``; these tests hold it to 1e-6 relative against
references that know nothing of that decomposition: Python fractions of the definition
(no ties) and float64 areas summed exactly (``math.fsum``) minus the oracle's.
"""

from __future__ import annotations

from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

import reference
from cwsa_jax import aurc, eaurc, risk_coverage_summary
from cwsa_jax import _risk_coverage_kernels as rck

CONVENTIONS = ("step", "trapezoid", "published_code")


def nearly_perfect(n: int, num_errors: int, swaps: int):
  """Outcomes in decreasing confidence order (True: correct) of the perfect ranking with the
  ``swaps`` correct samples just above the errors swapped with the ``swaps`` errors just
  below them: ``C^(m - s) E^s C^s E^(E - s)``, one inversion more per swap outward."""
  m = n - num_errors
  ok = np.zeros(n, bool)
  ok[:m - swaps] = True
  ok[m:m + swaps] = True
  return ok


def as_input(ok_sorted: np.ndarray, group: int = 1, seed: int = 0):
  """(float32 confidences, correct) in a shuffled input order whose decreasing confidence
  order is ``ok_sorted``; ``group`` > 1 ties consecutive runs of that many samples."""
  n = ok_sorted.size
  level = np.arange(n) // group
  c = (1.0 - level / (level[-1] + 1)).astype(np.float32)
  assert np.unique(c).size == level[-1] + 1  # float32 keeps every level apart
  perm = np.random.default_rng(seed).permutation(n)
  return c[perm], ok_sorted[perm]


def groups_of(n: int, group: int) -> np.ndarray:
  """Tie-group ends K_j (1-based) of consecutive runs of ``group`` samples."""
  return np.append(np.arange(group, n, group), n) if n % group else np.arange(group, n + 1, group)


def fraction_eaurc(ok_sorted: np.ndarray, convention: str) -> Fraction:
  """E-AURC of an order without ties, exactly: (1/n) sum_k w_k (E_k - E*_k) / k with
  E*_k = max(0, k - m) and w = 1 ("step"), or 1/2 at k = 1 and k = n ("published_code").
  Only the nonzero differences are summed (a few thousand here)."""
  n = ok_sorted.size
  m = int(ok_sorted.sum())
  errors = np.cumsum(~ok_sorted)
  k = np.arange(1, n + 1)
  difference = errors - np.maximum(k - m, 0)
  assert difference.min() >= 0
  total = Fraction(0)
  for i in np.nonzero(difference)[0]:
    weight = Fraction(1, 2) if convention == "published_code" and k[i] in (1, n) else 1
    total += weight * Fraction(int(difference[i]), int(k[i]))
  return total / n


@pytest.mark.parametrize("n, swaps", [(100_000, 10), (100_000, 1000), (1_000_000, 10),
                                      (1_000_000, 1000)])
def test_nearly_optimal_orders_without_ties(n, swaps):
  ok_sorted = nearly_perfect(n, n // 10, swaps)
  c, ok = as_input(ok_sorted, seed=swaps)
  ends = np.arange(1, n + 1)
  for convention in CONVENTIONS:
    got = float(eaurc(c, ok, convention=convention))
    if convention == "trapezoid":
      want = reference.eaurc_fsum(ok_sorted, ends, convention)
    else:
      want = float(fraction_eaurc(ok_sorted, convention))
      if convention == "step":  # the two references agree
        assert reference.eaurc_fsum(ok_sorted, ends, convention) == pytest.approx(want, rel=1e-9)
    assert want > 0
    assert got == pytest.approx(want, rel=1e-6, abs=0), (convention, got, want)
  if (n, swaps) == (1_000_000, 10):  # the case: truth about 1.1e-10, was exactly 0
    assert float(eaurc(c, ok)) == pytest.approx(1.11e-10, rel=1e-2)


@pytest.mark.parametrize("n, swaps", [(100_000, 10), (100_000, 1000)])
def test_nearly_optimal_orders_with_ties(n, swaps):
  # Pairs of equal scores: the "step" oracle's ties among the errors cost area; "trapezoid"
  # keeps its tie groups' trapezoids and the oracle's kink inside a group.
  ok_sorted = nearly_perfect(n, n // 10 + 1, swaps)  # m odd: a pair straddles m
  c, ok = as_input(ok_sorted, group=2, seed=swaps + 1)
  ends = groups_of(n, 2)
  for convention in ("step", "trapezoid"):
    got = risk_coverage_summary(c, ok, convention=convention)
    want = reference.eaurc_fsum(ok_sorted, ends, convention)
    assert want > 0
    assert float(got.eaurc) == pytest.approx(want, rel=1e-6, abs=0), convention
    assert float(eaurc(c, ok, convention=convention)) == float(got.eaurc)


def test_a_single_boundary_swap():
  # C^(m-1) E C E^(e-1): E-AURC = 1 / (m n), about 1.1e-12 at n = 10^6.
  n = 1_000_000
  ok_sorted = nearly_perfect(n, n // 10, 1)
  c, ok = as_input(ok_sorted, seed=3)
  m = n - n // 10
  assert float(eaurc(c, ok)) == pytest.approx(1 / (m * n), rel=1e-6)
  assert float(eaurc(c, ok, convention="published_code")) == pytest.approx(1 / (m * n), rel=1e-6)


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_random_data_with_ties_keep_their_values(convention):
  """Ordinary inputs: the float64 reference to float32 rounding, and the old definition (the
  kit's own AURC minus the AURC of the oracle's scoring) to the float32 rounding of AURC."""
  rng = np.random.default_rng(40)
  for n, decimals in ((1, 2), (2, 1), (7, 1), (300, 2), (5000, 2), (5000, 3)):
    c = np.round(rng.random(n), decimals).astype(np.float32)
    ok = rng.random(n) < rng.uniform(0.2, 0.95)
    got = float(eaurc(c, ok, convention=convention))
    assert got == pytest.approx(reference.eaurc(c, ok, convention), rel=2e-6, abs=1e-7)
    area = float(aurc(c, ok, convention=convention))
    oracle = float(aurc(reference.oracle_scores(ok, convention).astype(np.float32), ok,
                        convention=convention))
    old = max(area - oracle, 0.0) if ok.any() and not ok.all() else 0.0
    assert abs(got - old) <= 4 * np.spacing(np.float32(max(area, oracle))), (n, got, old)


def test_optimal_orders_and_one_class_are_exactly_zero():
  rng = np.random.default_rng(41)
  ok = rng.random(3000) < 0.7
  strict = reference.oracle_scores(ok, "step").astype(np.float32)
  two_level = reference.oracle_scores(ok, "trapezoid").astype(np.float32)
  assert float(eaurc(strict, ok)) == 0.0
  assert float(eaurc(strict, ok, convention="published_code")) == 0.0
  assert float(eaurc(two_level, ok, convention="trapezoid")) == 0.0
  assert float(eaurc(two_level, ok)) > 0.0  # tied errors cost "step" area
  c = np.round(rng.random(3000), 2).astype(np.float32)
  for convention in CONVENTIONS:
    assert float(eaurc(c, np.ones(3000, bool), convention=convention)) == 0.0
    assert float(eaurc(c, np.zeros(3000, bool), convention=convention)) == 0.0


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_parallel_scan_and_cuda_form_take_the_same_terms(convention):
  # The accelerators' prefix scans and the CUDA form's XLA prefix sums (position p in the
  # place of slot p + 1) sum the same nonnegative terms as the CPU loop; across scan chunks.
  from cwsa_jax._kernels import _dispatch
  ok_sorted = nearly_perfect(40_001, 4000, 300)
  c, ok = as_input(ok_sorted, group=3, seed=5)
  c, ok = jnp.asarray(c), jnp.asarray(ok)
  want = reference.eaurc_fsum(ok_sorted, groups_of(ok_sorted.size, 3), convention)
  sequential = rck._summary_kernel(c, ok, convention=convention, sequential=True,
                                   with_eaurc=True).eaurc
  parallel = rck._summary_kernel(c, ok, convention=convention, sequential=False,
                                 with_eaurc=True).eaurc
  tiles = rck._summary_by_tiles(c, ok, convention=convention, with_eaurc=True,
                                kernels=_dispatch.Kernels(interpret=True)).eaurc
  for got in (sequential, parallel, tiles):
    assert float(got) == pytest.approx(want, rel=1e-6, abs=0)
