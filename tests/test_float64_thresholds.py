"""Float64 confidences compared with thresholds and bin edges in float64 (issue 40).

Every function that compares confidences with a threshold or a bin edge is
checked against an independent float64 reference written here in plain NumPy,
on confidences clustered within 1e-9 of the thresholds (below float32's
resolution). Float32 inputs must keep their results bit for bit, and inside a
user's ``jit`` nothing changes (the inputs are float32 there).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax import _threshold_order

N = 240
GRID = np.array([0.5, 0.55, 0.6, 0.75, 0.9])  # float64 thresholds
GRID32 = GRID.astype(np.float32).astype(np.float64)  # float32 thresholds, exact in float64


# ------------------------------------------------------------------ float64 reference


def ref_at(c, k, tau):
  """(coverage, selective accuracy, cwsa, cwsa+, retained) in float64."""
  c, k = np.asarray(c, np.float64), np.asarray(k, np.float64)
  retained = c >= tau
  phi = (c - tau) / (1.0 - tau)
  size = retained.sum()
  sa = k[retained].mean() if size else np.nan
  cw_ = (phi * (2 * k - 1))[retained].sum() / size if size else 0.0
  cwp = (phi * k)[retained].sum() / size if size else 0.0
  return retained.mean(), sa, cw_, cwp, retained


def ref_bins(c, num_bins, binning):
  """float64 bin of each confidence: ``e_j <= c < e_{j+1}`` with float64 edges."""
  c = np.asarray(c, np.float64)
  if binning == "width":
    interior = np.arange(1, num_bins) / num_bins
  else:
    s = np.sort(c)
    interior = s[np.minimum([-(-j * c.size // num_bins) for j in range(1, num_bins)], c.size - 1)]
  return np.searchsorted(interior, c, side="right")


def ref_ece(c, k, num_bins, binning):
  """(ECE, per-bin count, per-bin mean confidence) in float64."""
  b = ref_bins(c, num_bins, binning)
  count = np.bincount(b, minlength=num_bins)
  gap = np.bincount(b, c - k, minlength=num_bins)
  conf = np.bincount(b, c, minlength=num_bins) / np.maximum(count, 1)
  return np.abs(gap).sum() / c.size, count, np.where(count > 0, conf, np.nan)


def clustered(rng, centres, n=N, spread=1e-9):
  """float64 confidences within ``spread`` of ``centres`` (some exactly on them), and the
  correctness of each."""
  c = rng.choice(centres, n) + rng.uniform(-spread, spread, n)
  c[: n // 8] = rng.choice(centres, n // 8)
  c[-4:] = rng.uniform(0.0, 1.0, 4)
  c = np.clip(c, 0.0, 1.0)
  # Correctness differing from the float32 neighbours makes a wrong retention visible.
  return c, rng.uniform(size=n) < 0.5


def _f32_would_differ(c, thresholds):
  """Whether float32 rounding changes some comparison (the data really tests the fix)."""
  t = np.asarray(thresholds, np.float64).reshape(-1, 1)
  return bool(np.any((c >= t) != (c.astype(np.float32) >= t.astype(np.float32))))


# ------------------------------------------------------------------ the issue's case


ISSUE_C, ISSUE_K = [0.5 - 1e-9, 0.9], [False, True]


@pytest.mark.parametrize("form", ["list", "numpy"])
def test_issue_case(form):
  c = ISSUE_C if form == "list" else np.array(ISSUE_C)
  np.testing.assert_allclose(float(cw.cwsa(c, ISSUE_K, 0.5)), 0.8, rtol=1e-6)
  assert float(cw.selective_accuracy(c, ISSUE_K, 0.5)) == 1.0
  assert float(cw.coverage(c, 0.5)) == 0.5
  np.testing.assert_allclose(float(cw.cwsa_plus(c, ISSUE_K, 0.5)), 0.8, rtol=1e-6)


def test_issue_case_with_x64_on():
  with jax.enable_x64(True):
    c = jnp.asarray(ISSUE_C, jnp.float64)
    assert c.dtype == jnp.float64
    got = (cw.cwsa(c, ISSUE_K, 0.5), cw.selective_accuracy(c, ISSUE_K, 0.5), cw.coverage(c, 0.5))
    r = cw.sweep(c, ISSUE_K, jnp.asarray([0.5, 0.6], jnp.float64))
  np.testing.assert_allclose([float(x) for x in got], [0.8, 1.0, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(r.coverage), [0.5, 0.5])


def test_inside_jit_nothing_changes():
  """Under a user's jit (x64 off) the inputs are float32: today's float32 results."""
  c32 = np.asarray(ISSUE_C, np.float32)
  jitted = jax.jit(cw.cwsa)(np.asarray(ISSUE_C), np.asarray(ISSUE_K), 0.5)
  assert float(jitted) == float(cw.cwsa(c32, ISSUE_K, 0.5))
  assert float(jax.jit(cw.coverage)(np.asarray(ISSUE_C), 0.5)) == 1.0


# ------------------------------------------------------------------ clustered float64 inputs


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("grid", ["float64", "float32"])
def test_single_threshold_metrics(seed, grid):
  rng = np.random.default_rng(seed)
  taus = GRID if grid == "float64" else GRID32
  c, k = clustered(rng, taus)
  assert _f32_would_differ(c, taus)
  for tau in taus[[0, 3]]:
    tau = float(tau) if grid == "float64" else np.float32(tau)
    cov, sa, cwsa_, cwsa_plus, retained = ref_at(c, k, float(tau))
    assert float(cw.coverage(c, tau)) == np.float32(cov)
    np.testing.assert_allclose(float(cw.selective_accuracy(c, k, tau)), sa, rtol=1e-6)
    np.testing.assert_allclose(float(cw.cwsa(c, k, tau)), cwsa_, atol=1e-6)
    np.testing.assert_allclose(float(cw.cwsa_plus(c, k, tau)), cwsa_plus, atol=1e-6)
    r = cw.contributions(c, k, tau)
    np.testing.assert_array_equal(np.asarray(r.retained), retained)
    phi = (c - float(tau)) / (1 - float(tau))
    np.testing.assert_allclose(np.asarray(r.terms), np.where(retained, phi * (2 * k - 1), 0),
                               atol=1e-6)


@pytest.mark.parametrize("graded", [False, True])
def test_sweep_and_sweep_by_group(graded):
  rng = np.random.default_rng(2)
  c, k = clustered(rng, GRID, n=2 * N)
  kappa = rng.uniform(size=c.size) if graded else k
  c = c.reshape(2, N)
  kappa = np.asarray(kappa).reshape(2, N)
  groups = rng.integers(0, 3, c.shape)
  order = [3, 0, 4, 1, 2]  # unsorted thresholds
  r = cw.sweep(c, kappa, GRID[order])
  g = cw.sweep_by_group(c, kappa, groups, GRID[order], num_groups=3)
  for row in range(2):
    for j, tau in enumerate(GRID[order]):
      cov, sa, cwsa_, cwsa_plus, _ = ref_at(c[row], kappa[row], tau)
      assert float(r.coverage[row, j]) == np.float32(cov)
      np.testing.assert_allclose(float(r.selective_accuracy[row, j]), sa, rtol=1e-6)
      np.testing.assert_allclose(float(r.cwsa[row, j]), cwsa_, atol=1e-6)
      np.testing.assert_allclose(float(r.cwsa_plus[row, j]), cwsa_plus, atol=1e-6)
      for grp in range(3):
        sel = groups[row] == grp
        cov, sa, cwsa_, _, _ = ref_at(c[row][sel], kappa[row][sel], tau)
        np.testing.assert_allclose(float(g.coverage[row, grp, j]), cov, rtol=1e-6)
        np.testing.assert_allclose(float(g.selective_accuracy[row, grp, j]), sa, rtol=1e-6)
        np.testing.assert_allclose(float(g.cwsa[row, grp, j]), cwsa_, atol=1e-6)


def _brute_force_choice(c, k, thresholds, metric, min_coverage):
  """The smallest float64 threshold maximising the float64 metric under the constraint."""
  best = None
  for tau in sorted(thresholds):
    cov, sa, cwsa_, cwsa_plus, _ = ref_at(c, k, tau)
    value = {"cwsa": cwsa_, "cwsa_plus": cwsa_plus, "selective_accuracy": sa}[metric]
    if cov == 0 or cov < min_coverage - 1e-6:
      continue
    if best is None or value > best[1] + 1e-6:
      best = (tau, value, cov)
  return best


@pytest.mark.parametrize("metric", ["cwsa", "selective_accuracy"])
def test_select_threshold(metric):
  rng = np.random.default_rng(3)
  c, k = clustered(rng, GRID)
  # The samples just below a threshold are wrong: float32 would retain them.
  k = np.where(c < np.round(c, 6), False, k)
  got = cw.select_threshold(c, k, metric=metric, thresholds=GRID, min_coverage=0.3)
  tau, value, cov = _brute_force_choice(c, k, GRID, metric, 0.3)
  assert got.threshold == tau
  np.testing.assert_allclose(got.value, value, atol=1e-6)
  np.testing.assert_allclose(got.coverage, cov, rtol=1e-6)


def test_select_threshold_ties_between_thresholds_float32_merges():
  """Distinct float64 thresholds that float32 merges, with no sample between them: the same
  retained set, a tie, reported as the smallest float64 one."""
  c = np.array([0.3, 0.5 - 1e-9, 0.5 + 3e-9, 0.9])
  k = np.array([False, False, True, True])
  grid = np.array([0.5 + 1e-10, 0.5 + 2e-9, 0.4])
  got = cw.select_threshold(c, k, thresholds=grid)
  assert got.threshold == 0.5 + 1e-10 and got.coverage == 0.5 and got.selective_risk == 0.0


@pytest.mark.parametrize("binning", ["width", "mass"])
@pytest.mark.parametrize("num_bins", [4, 10, 15])
def test_ece_and_calibration_bins(binning, num_bins):
  rng = np.random.default_rng(num_bins)
  if binning == "width":
    c, k = clustered(rng, np.arange(1, num_bins) / num_bins)
    assert _f32_would_differ(c, np.arange(1, num_bins) / num_bins)
  else:
    # Clusters float32 merges, straddling equal-mass edges, near 1 and inside (0, 1).
    c, k = clustered(rng, np.array([1 - 1e-7, 0.7]), spread=2e-9)
    c[:40] = 1.0 - rng.uniform(0, 5e-8, 40)
  c = np.minimum(c, 1.0)
  want_ece, want_count, want_conf = ref_ece(c, k, num_bins, binning)
  b = cw.calibration_bins(c, k, num_bins=num_bins, binning=binning)
  np.testing.assert_array_equal(np.asarray(b.count), want_count)
  np.testing.assert_allclose(np.asarray(b.mean_confidence), want_conf, atol=1e-6)
  np.testing.assert_allclose(float(cw.ece(c, k, num_bins=num_bins, binning=binning)), want_ece,
                             atol=2e-6)
  if binning == "mass":
    assert b.count.sum() == c.size and b.edges.dtype == jnp.float32


def test_mass_binning_fewer_samples_than_bins():
  c = np.array([0.8 - 1e-10, 0.8])
  b = cw.calibration_bins(c, [True, False], num_bins=4, binning="mass")
  np.testing.assert_array_equal(np.asarray(b.count), ref_ece(c, np.array([1, 0]), 4, "mass")[1])
  assert float(cw.ece([0.8 - 1e-10], [True], binning="mass")) == pytest.approx(0.2, abs=1e-6)


def test_mass_binning_batched_and_float32_merges():
  rng = np.random.default_rng(5)
  c = 1.0 - rng.uniform(0, 2e-7, (3, 90))  # float32 keeps few of these apart
  k = rng.uniform(size=c.shape) < 0.8
  assert np.unique(c.astype(np.float32)).size < 10
  b = cw.calibration_bins(c, k, num_bins=15, binning="mass")
  for row in range(3):
    np.testing.assert_array_equal(np.asarray(b.count[row]), ref_ece(c[row], k[row], 15, "mass")[1])
  stand_ins = _threshold_order.mass_stand_ins(c, 15)
  ulp = np.spacing(np.float32(0.5)).astype(np.float64)  # spacing just below 1
  assert np.abs(stand_ins - c).max() <= 15 * ulp


# ------------------------------------------------------------------ no float32 stand-in


def test_thresholds_float32_merges_with_a_sample_between_raise():
  c = np.array([0.2, 0.5 + 1e-12, 0.9])
  with pytest.raises(ValueError, match="round to the same value|rounds to the same value"):
    cw.sweep(c, [True, False, True], [0.5, 0.5 + 2e-12])
  with pytest.raises(ValueError, match="rounds to the same value"):
    cw.select_threshold(c, [True, False, True], thresholds=[0.5, 0.5 + 2e-12])
  # Without a sample between them: both columns are the same, no error.
  r = cw.sweep(np.array([0.2, 0.5 + 3e-12, 0.9]), [True, False, True], [0.5, 0.5 + 2e-12])
  np.testing.assert_array_equal(np.asarray(r.coverage), np.float32([2 / 3, 2 / 3]))


def test_stand_ins_move_at_most_one_ulp():
  rng = np.random.default_rng(6)
  c, _ = clustered(rng, GRID)
  s = _threshold_order.stand_ins(c, GRID)
  c32 = c.astype(np.float32)
  assert np.all((s == c32) | (s == np.nextafter(c32, np.float32(-1))))
  for tau in GRID:
    np.testing.assert_array_equal(s >= np.float32(tau), c >= tau)


# ------------------------------------------------------------------ float32 inputs: unchanged


FUNCTIONS = {
    "cwsa": lambda c, k, t: cw.cwsa(c, k, t[0]),
    "cwsa_plus": lambda c, k, t: cw.cwsa_plus(c, k, t[1]),
    "coverage": lambda c, k, t: cw.coverage(c, t[0]),
    "selective_accuracy": lambda c, k, t: cw.selective_accuracy(c, k, t[2]),
    "contributions": lambda c, k, t: cw.contributions(c, k, t[0]),
    "sweep": lambda c, k, t: cw.sweep(c, k, t),
    "sweep_by_group": lambda c, k, t: cw.sweep_by_group(
        c, k, (np.asarray(c) * 7).astype(int) % 2, t, num_groups=2),
    "select_threshold": lambda c, k, t: cw.select_threshold(c, k, thresholds=t),
    "ece_width": lambda c, k, t: cw.ece(c, k, num_bins=10),
    "ece_mass": lambda c, k, t: cw.ece(c, k, num_bins=10, binning="mass"),
    "calibration_bins": lambda c, k, t: cw.calibration_bins(c, k, num_bins=10, binning="mass"),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_float32_inputs_bypass_the_stand_ins(name, monkeypatch):
  """Float32 confidences never reach the stand-ins, whatever the thresholds' dtype (Python
  floats, float64 arrays): their results are today's, bit for bit."""
  def refuse(*args, **kwargs):
    raise AssertionError("float32 confidences were stood in for")

  monkeypatch.setattr(_threshold_order, "stand_ins", refuse)
  monkeypatch.setattr(_threshold_order, "mass_stand_ins", refuse)
  rng = np.random.default_rng(8)
  c, k = clustered(rng, GRID, n=60)
  c32 = c.astype(np.float32)
  for confidences in (c32, jnp.asarray(c32), list(map(np.float32, c32))):
    FUNCTIONS[name](confidences, k, GRID)  # float64 thresholds
    FUNCTIONS[name](confidences, k, [float(t) for t in GRID])


def test_wide_floats():
  assert _threshold_order.wide_floats(np.zeros(3, np.float32)) is None
  assert _threshold_order.wide_floats(jnp.zeros(3)) is None
  assert _threshold_order.wide_floats([0, 1]) is None  # integers: exact in float32
  assert _threshold_order.wide_floats([0.5, 2.0]) is None  # invalid: left for the checks
  assert _threshold_order.wide_floats([0.25, 0.5]).dtype == np.float64
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    cw.cwsa([0.5, 2.0], [True, True], 0.5)  # the checks' own message
