"""Float64 inputs of classwise_ece and select_threshold compared in float64 (issue 40).

classwise_ece bins float64 probabilities lying 1e-10 from a bin edge as float64 does (as
``ece`` bins float64 confidences), and select_threshold reports the grid value its float64
comparisons used. Both are checked against float64 references written here in NumPy;
float32 inputs keep float32 semantics.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw

N, K, B = 120, 3, 10  # one shape for every classwise test: one compilation per option set
EDGES = np.arange(1, B) / B  # float64 interior width edges j / B


# ------------------------------------------------------------------ float64 references


def ref_bins(p, binning, edges_dtype=np.float64):
  """Bin of each probability of one column: ``e_j <= p < e_{j+1}``, edges in ``edges_dtype``
  (width: ``j / B``; mass: the column's order statistics ``s_(ceil(j n / B))``)."""
  p = np.asarray(p, edges_dtype)
  if binning == "width":
    interior = (np.arange(1, B, dtype=edges_dtype) / edges_dtype(B)).astype(edges_dtype)
  else:
    s = np.sort(p)
    interior = s[[min(math.ceil(j * p.size / B), p.size - 1) for j in range(1, B)]]
  return np.searchsorted(interior, p, side="right")


def ref_classwise(probs, labels, norm, binning, edges_dtype=np.float64):
  """Mean over classes of the binned error of column k against 1[y = k], in float64; the bins
  from values and edges in ``edges_dtype`` (float32: what rounding the inputs would give)."""
  errors = []
  for k in range(probs.shape[-1]):
    p = probs[:, k].astype(edges_dtype).astype(np.float64)
    hit = (labels == k).astype(np.float64)
    b = ref_bins(probs[:, k], binning, edges_dtype)
    count = np.bincount(b, minlength=B)
    gap = np.bincount(b, p - hit, minlength=B)  # sum over the bin of (p - hit)
    if norm == "l1":
      errors.append(np.abs(gap).sum() / p.size)
    elif norm == "l2":
      errors.append(math.sqrt(np.sum(gap ** 2 / np.maximum(count, 1)) / p.size))
    else:
      errors.append(np.max(np.abs(gap[count > 0] / count[count > 0])))
  return float(np.mean(errors))


def edge_case(seed, n=N):
  """float64 probabilities [n, K]: columns 0 and 1 at interior edges, 1e-10 below, on or
  above them; column 2 a cluster within 1e-9 of 0.3 (one float32 value) and edges; a few
  random values; labels hit mostly the probabilities just below an edge, so that a bin
  change moves the error."""
  rng = np.random.default_rng(seed)
  probs = rng.choice(EDGES, (n, K)) + rng.choice([-1e-10, 0.0, 1e-10], (n, K))
  probs[: n // 2, 2] = 0.3 + rng.uniform(-1e-9, 1e-9, n // 2)
  probs[-5:] = rng.uniform(0, 1, (5, K))
  below = probs < np.round(probs, 6)
  labels = np.where(rng.random(n) < 0.7, below.argmax(axis=1), rng.integers(0, K, n))
  return probs, labels


# ------------------------------------------------------------------ classwise_ece


@pytest.mark.parametrize("norm, binning", [("l1", "width"), ("max", "width"), ("l1", "mass"),
                                           ("l2", "mass")])
def test_classwise_ece_bins_float64_probabilities_in_float64(norm, binning):
  probs, labels = edge_case(0)
  want = ref_classwise(probs, labels, norm, binning)
  # The data tests the float64 bins: float32 rounding would bin and score differently.
  assert abs(ref_classwise(probs, labels, norm, binning, np.float32) - want) > 1e-3
  got = cw.classwise_ece(probs, labels, num_bins=B, norm=norm, binning=binning)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(float(got), want, atol=2e-6)
  if norm == "l1":  # as ece's own float64 binning of each column
    per_class = [float(cw.ece(probs[:, k], labels == k, num_bins=B, binning=binning))
                 for k in range(K)]
    np.testing.assert_allclose(float(got), np.mean(per_class), atol=1e-6)


@pytest.mark.parametrize("binning", ["width", "mass"])
def test_classwise_ece_float32_probabilities_keep_float32_bins(binning):
  """The float32 values of the same probabilities are binned as float32 compares them."""
  probs, labels = edge_case(0)
  p32 = probs.astype(np.float32)
  got = float(cw.classwise_ece(p32, labels, num_bins=B, binning=binning))
  np.testing.assert_allclose(got, ref_classwise(probs, labels, "l1", binning, np.float32),
                             atol=2e-6)
  # A list of float32 scalars is float32 too.
  assert float(cw.classwise_ece([list(map(np.float32, row)) for row in p32], labels,
                                num_bins=B, binning=binning)) == got


def test_classwise_ece_float64_forms_batches_and_x64():
  (p0, y0), (p1, y1) = edge_case(1), edge_case(2)
  want = [ref_classwise(p, y, "l1", "mass") for p, y in ((p0, y0), (p1, y1))]
  batched = cw.classwise_ece(np.stack([p0, p1]), np.stack([y0, y1]), num_bins=B, binning="mass")
  np.testing.assert_allclose(np.asarray(batched), want, atol=2e-6)
  as_lists = cw.classwise_ece(p0.tolist(), y0.tolist(), num_bins=B)  # Python floats
  np.testing.assert_allclose(float(as_lists), ref_classwise(p0, y0, "l1", "width"), atol=2e-6)
  with jax.enable_x64(True):
    p = jnp.asarray(p0)
    assert p.dtype == jnp.float64
    got = cw.classwise_ece(p, y0, num_bins=B, binning="mass")
  np.testing.assert_allclose(float(got), want[0], atol=2e-6)


def test_classwise_ece_inside_jit_is_float32():
  """Under a user's jit (x64 off) the probabilities are float32 already: float32 bins."""
  probs, labels = edge_case(0)
  fn = jax.jit(lambda p, y: cw.classwise_ece(p, y, num_bins=B))
  assert float(fn(probs, labels)) == float(cw.classwise_ece(probs.astype(np.float32), labels,
                                                            num_bins=B))


def test_classwise_ece_float64_single_bin_and_bad_input():
  probs, labels = edge_case(0)
  want = np.mean([abs(np.mean(probs[:, k]) - np.mean(labels == k)) for k in range(K)])
  np.testing.assert_allclose(float(cw.classwise_ece(probs, labels, num_bins=1)), want, atol=2e-6)
  bad = probs.copy()
  bad[3, 1] = 1.5
  with pytest.raises(ValueError, match="probs"):
    cw.classwise_ece(bad, labels)


# ------------------------------------------------------------------ select_threshold


GRID = np.array([0.5, 0.55, 0.6, 0.7, 0.9])  # float64; all but 0.5 lie between float32 values


def ref_choice(c, k, thresholds, metric, min_coverage):
  """(threshold, coverage, selective risk, value) in float64: the smallest threshold with the
  largest metric among those retaining a sample with coverage >= min_coverage."""
  best = None
  for tau in sorted(thresholds):
    retained = c >= tau
    cov = retained.mean()
    if not retained.any() or cov < min_coverage:
      continue
    phi = (c[retained] - tau) / (1 - tau)
    sa = k[retained].mean()
    value = {"cwsa": np.mean(phi * (2 * k[retained] - 1)), "cwsa_plus": np.mean(phi * k[retained]),
             "selective_accuracy": sa}[metric]
    if best is None or value > best[3] + 1e-6:
      best = (tau, cov, 1 - sa, value)
  return best


def select_case(seed, n=N):
  """float64 confidences 1e-10 below, on or above the grid's values (and a few random ones);
  the ones just below are wrong, so that retaining them (float32 would) changes the choice."""
  rng = np.random.default_rng(seed)
  c = rng.choice(GRID, n) + rng.choice([-1e-10, 0.0, 1e-10], n)
  c[-6:] = rng.uniform(0.3, 1.0, 6)
  k = np.where(c < np.round(c, 6), 0.0, (rng.random(n) < c).astype(np.float64))
  return c, k


@pytest.mark.parametrize("metric", ["cwsa", "cwsa_plus", "selective_accuracy"])
def test_select_threshold_reports_the_float64_grid_value(metric):
  c, k = select_case(3)
  got = cw.select_threshold(c, k, metric=metric, thresholds=GRID, min_coverage=0.2)
  tau, cov, risk, value = ref_choice(c, k, GRID, metric, 0.2)
  assert got.threshold == tau  # the float64 value itself, not float32's 0.550000011920929
  assert np.mean(c >= got.threshold) == pytest.approx(got.coverage, abs=1e-6)
  np.testing.assert_allclose([got.coverage, got.selective_risk, got.value], [cov, risk, value],
                             atol=1e-6)


def test_select_threshold_float64_forms():
  c, k = select_case(4)
  tau = ref_choice(c, k, GRID, "cwsa", 0.0)[0]
  assert float(np.float32(tau)) != tau  # the float64 value is visible
  assert cw.select_threshold(c.tolist(), k, thresholds=GRID.tolist()).threshold == tau
  with jax.enable_x64(True):
    got = cw.select_threshold(jnp.asarray(c), k, thresholds=jnp.asarray(GRID))
  assert got.threshold == tau
  # A float32 grid is compared as float32 values: reported as they are.
  grid32 = GRID.astype(np.float32)
  want = ref_choice(c, k, grid32.astype(np.float64), "cwsa", 0.0)[0]
  assert cw.select_threshold(c, k, thresholds=grid32).threshold == want
  # So is the default grid (float32 0.50, 0.51, ..., 0.99).
  default = cw.default_thresholds().astype(np.float64)
  assert cw.select_threshold(c, k).threshold == ref_choice(c, k, default, "cwsa", 0.0)[0]


def test_select_threshold_float32_confidences_report_float32_grid_values():
  """Float32 confidences are compared with the float32 grid: its value is reported."""
  c, k = select_case(4)
  c32 = c.astype(np.float32)
  want = ref_choice(c32.astype(np.float64), k, GRID.astype(np.float32).astype(np.float64),
                    "cwsa", 0.0)
  for grid in (GRID, GRID.tolist()):
    got = cw.select_threshold(c32, k, thresholds=grid)
    assert got.threshold == want[0] == float(np.float32(want[0]))
    np.testing.assert_allclose(got.value, want[3], atol=1e-6)


def test_select_threshold_grid_values_float32_merges_tie_to_the_smallest():
  """Distinct float64 thresholds that round to one float32, no sample between them: the same
  retained set, a tie, reported as the smallest float64 one of them."""
  c = np.array([0.3, 0.5 - 1e-9, 0.5 + 3e-9, 0.9])
  k = np.array([False, False, True, True])
  grid = np.array([0.5 + 2e-9, 0.5 + 1e-10, 0.4])
  got = cw.select_threshold(c, k, thresholds=grid)
  assert got.threshold == 0.5 + 1e-10 and got.coverage == 0.5 and got.selective_risk == 0.0
  assert np.mean(c >= got.threshold) == got.coverage
