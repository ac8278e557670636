"""ECE / RMS-CE / MCE and reliability bins against float64 NumPy references and hand tables."""

from __future__ import annotations

import functools
import zlib

import jax
import numpy as np
import pytest

from cwsa_jax._calibration import calibration_bins, ece

TOL = 2e-6
N = 256  # shared sample count: one compilation per option


# ---------------------------------------------------------------------------
# Slow float64 reference: explicit bin loop.
# ---------------------------------------------------------------------------


def ref_edges(conf, num_bins, binning):
  if binning == "width":
    # The library's edges are float32(j) / float32(B); compare on the same values.
    return (np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins)).astype(np.float64)
  s = np.sort(conf)
  n = len(conf)
  interior = [s[int(np.ceil(j * n / num_bins))] for j in range(1, num_bins)]
  return np.array([0.0, *interior, 1.0])


def ref_bins(conf, correct, num_bins, binning="width"):
  """Bin b of a sample: the largest b with edges[b] <= c (so the last bin is closed
  and a value on an edge, or on a repeated edge, goes to the highest bin starting there)."""
  conf = np.asarray(conf, np.float32).astype(np.float64)
  correct = np.asarray(correct, np.float64)
  edges = ref_edges(conf, num_bins, binning)
  index = np.array([max(b for b in range(num_bins) if edges[b] <= c) for c in conf])
  rows = [(int((index == b).sum()), conf[index == b], correct[index == b]) for b in range(num_bins)]
  return edges, rows


def ref_ece(conf, correct, num_bins, norm="l1", binning="width"):
  n = len(conf)
  _, rows = ref_bins(conf, correct, num_bins, binning)
  gaps = [(cnt, abs(c.mean() - k.mean())) for cnt, c, k in rows if cnt > 0]
  if norm == "l1":
    return sum(cnt / n * g for cnt, g in gaps)
  if norm == "l2":
    return float(np.sqrt(sum(cnt / n * g * g for cnt, g in gaps)))
  return max(g for _, g in gaps)


# ---------------------------------------------------------------------------
# Hand-computed tables
# ---------------------------------------------------------------------------

HAND_CONF = [0.0, 0.1, 0.25, 0.5, 0.74, 0.75, 1.0, 1.0]
HAND_OK = [False, True, True, False, True, True, True, False]


def test_width_bins_hand_table():
  # Edges 0, .25, .5, .75, 1. Values on an interior edge go to the bin above; 1.0 is counted.
  b = calibration_bins(HAND_CONF, HAND_OK, num_bins=4)
  np.testing.assert_allclose(b.edges, [0.0, 0.25, 0.5, 0.75, 1.0])
  assert b.count.tolist() == [2, 1, 2, 3]
  np.testing.assert_allclose(b.mean_confidence, [0.05, 0.25, 0.62, 2.75 / 3], atol=TOL)
  np.testing.assert_allclose(b.accuracy, [0.5, 1.0, 0.5, 2 / 3], atol=TOL)


def test_ece_hand_values():
  # |sum(c - k)| per bin: 0.9, 0.75, 0.24, 0.75 -> 2.64 / 8.
  assert float(ece(HAND_CONF, HAND_OK, num_bins=4)) == pytest.approx(0.33, abs=TOL)
  assert float(ece(HAND_CONF, HAND_OK, num_bins=4, norm="max")) == pytest.approx(0.75, abs=TOL)
  rms = np.sqrt((2 * 0.45**2 + 0.75**2 + 2 * 0.12**2 + 3 * 0.25**2) / 8)
  assert float(ece(HAND_CONF, HAND_OK, num_bins=4, norm="l2")) == pytest.approx(rms, abs=TOL)


def test_confidence_one_is_counted():
  # Libraries using [a, b) for every bin drop these two samples and report 0.
  assert float(ece([1.0, 1.0], [True, False], num_bins=10)) == pytest.approx(0.5, abs=TOL)
  b = calibration_bins([1.0, 1.0], [True, False], num_bins=10)
  assert b.count.tolist() == [0] * 9 + [2]
  assert np.isnan(b.accuracy[:9]).all() and np.isnan(b.mean_confidence[:9]).all()


def test_mass_bins_keep_ties_together_hand_table():
  # Sorted: .1 .2 .2 .2 .3 .4 .5 .6 .6; quantile positions ceil(9/3) = 3, ceil(18/3) = 6
  # give edges s_3 = .2 and s_6 = .5. The tie group at .2 (positions 1..3) moves whole
  # into the bin that starts at .2.
  conf = [0.6, 0.2, 0.3, 0.1, 0.2, 0.5, 0.4, 0.6, 0.2]
  ok = [True, False, True, False, True, True, False, True, True]
  b = calibration_bins(conf, ok, num_bins=3, binning="mass")
  np.testing.assert_allclose(b.edges, [0.0, 0.2, 0.5, 1.0])
  assert b.count.tolist() == [1, 5, 3]
  np.testing.assert_allclose(b.accuracy, [0.0, 3 / 5, 1.0], atol=TOL)
  np.testing.assert_allclose(b.mean_confidence, [0.1, 1.3 / 5, 1.7 / 3], atol=TOL)


def test_mass_bins_all_equal_confidences():
  b = calibration_bins([0.7] * 6, [True, False, True, True, False, True], num_bins=3, binning="mass")
  np.testing.assert_allclose(b.edges, [0.0, 0.7, 0.7, 1.0])
  assert b.count.tolist() == [0, 0, 6]
  assert float(ece([0.7] * 6, [True, False, True, True, False, True], num_bins=3,
                   binning="mass")) == pytest.approx(abs(0.7 - 4 / 6), abs=TOL)


def test_mass_bins_balanced_without_ties_and_never_split_ties():
  rng = np.random.default_rng(0)
  conf = rng.permutation(N).astype(np.float32) / N  # distinct
  b = calibration_bins(conf, rng.random(N) < 0.5, num_bins=10, binning="mass")
  assert set(b.count.tolist()) <= {N // 10, N // 10 + 1}
  assert int(b.count.sum()) == N
  tied = np.round(rng.random(N), 1).astype(np.float32)
  bt = calibration_bins(tied, rng.random(N) < 0.5, num_bins=7, binning="mass")
  index = np.searchsorted(np.asarray(bt.edges[1:-1]), tied, side="right")
  for value in np.unique(tied):
    assert len(set(index[tied == value])) == 1
  assert int(bt.count.sum()) == N


# ---------------------------------------------------------------------------
# Documented values of another library
# ---------------------------------------------------------------------------


def test_pinned_to_torchmetrics_binary_docstring():
  # torchmetrics `BinaryCalibrationError` docstring (src/torchmetrics/classification/
  # calibration_error.py): preds [0.25, 0.25, 0.55, 0.75, 0.75], target [0, 0, 1, 1, 1],
  # n_bins=2 -> l1 0.2900, l2 0.2918, max 0.3167 (uniform bins, the binary "confidence"
  # is the prediction itself). Our width binning reproduces them.
  conf, ok = [0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1]
  for norm, documented in (("l1", 0.2900), ("l2", 0.2918), ("max", 0.3167)):
    assert float(ece(conf, ok, num_bins=2, norm=norm)) == pytest.approx(documented, abs=5e-5)


def test_pinned_to_torchmetrics_multiclass_docstring():
  # torchmetrics `MulticlassCalibrationError` docstring: these preds/target, n_bins=3
  # -> l1 0.2000, l2 0.2082, max 0.2333 (top-label confidence = max probability).
  probs = np.array([[0.25, 0.20, 0.55], [0.55, 0.05, 0.40], [0.10, 0.30, 0.60],
                    [0.90, 0.05, 0.05]])
  target = np.array([0, 1, 2, 0])
  conf, ok = probs.max(-1), probs.argmax(-1) == target
  for norm, documented in (("l1", 0.2000), ("l2", 0.2082), ("max", 0.2333)):
    assert float(ece(conf, ok, num_bins=3, norm=norm)) == pytest.approx(documented, abs=5e-5)


# ---------------------------------------------------------------------------
# Random data against the reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("binning", ["width", "mass"])
@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_random_against_reference(binning, norm):
  rng = np.random.default_rng(zlib.crc32(repr((binning, norm)).encode()))
  for decimals in (None, 2, 1):
    conf = rng.random(N) ** 0.3
    if decimals is not None:
      conf = np.round(conf, decimals)  # ties, including at edges, and exact 1.0
    conf = conf.astype(np.float32)
    ok = rng.random(N) < conf
    assert float(ece(conf, ok, num_bins=10, norm=norm, binning=binning)) == pytest.approx(
        ref_ece(conf, ok, 10, norm, binning), abs=TOL)


@pytest.mark.parametrize("binning", ["width", "mass"])
def test_bins_against_reference_with_graded_correctness(binning):
  rng = np.random.default_rng(1)
  conf = np.round(rng.random(N), 2).astype(np.float32)
  kappa = rng.random(N).astype(np.float32)
  got = calibration_bins(conf, kappa, num_bins=15, binning=binning)
  edges, rows = ref_bins(conf, kappa, 15, binning)
  np.testing.assert_allclose(got.edges, edges, atol=0)
  assert got.count.tolist() == [r[0] for r in rows]
  for b, (cnt, c, k) in enumerate(rows):
    if cnt:
      assert float(got.mean_confidence[b]) == pytest.approx(c.mean(), abs=TOL)
      assert float(got.accuracy[b]) == pytest.approx(k.mean(), abs=TOL)
    else:
      assert np.isnan(got.mean_confidence[b]) and np.isnan(got.accuracy[b])
  assert float(ece(conf, kappa, num_bins=15, binning=binning)) == pytest.approx(
      ref_ece(conf, kappa, 15, "l1", binning), abs=TOL)


def test_many_bins_segment_sum_path():
  rng = np.random.default_rng(2)
  conf = rng.random(N).astype(np.float32)
  ok = rng.random(N) < 0.6
  assert float(ece(conf, ok, num_bins=300)) == pytest.approx(ref_ece(conf, ok, 300), abs=TOL)


def test_float32_accuracy_large_n():
  rng = np.random.default_rng(3)
  n = 200_000
  conf = rng.random(n).astype(np.float32)
  ok = rng.random(n) < conf**2
  c64 = conf.astype(np.float64)
  edges = (np.arange(16, dtype=np.float32) / np.float32(15)).astype(np.float64)
  index = np.searchsorted(edges[1:-1], c64, side="right")
  gap = np.bincount(index, weights=c64 - ok, minlength=15)
  assert float(ece(conf, ok)) == pytest.approx(np.abs(gap).sum() / n, abs=TOL)


# ---------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------


def test_one_sample_and_single_class():
  assert float(ece([0.8], [True])) == pytest.approx(0.2, abs=TOL)
  assert float(ece([0.8], [False], norm="max")) == pytest.approx(0.8, abs=TOL)
  assert float(ece([0.8], [True], binning="mass")) == pytest.approx(0.2, abs=TOL)
  assert float(ece([1.0, 1.0, 1.0], [True] * 3)) == 0.0
  assert float(ece([0.0, 0.0], [False, False], norm="l2")) == 0.0
  assert float(ece([0.3, 0.9], [True, True], num_bins=1)) == pytest.approx(0.4, abs=TOL)


# ---------------------------------------------------------------------------
# jit, vmap, batch axes
# ---------------------------------------------------------------------------


def test_jit_vmap_and_batch_axes():
  rng = np.random.default_rng(4)
  conf = np.round(rng.random((3, N)), 2).astype(np.float32)
  ok = rng.random((3, N)) < conf
  for binning in ("width", "mass"):
    fn = functools.partial(ece, num_bins=10, binning=binning)
    loop = [float(fn(conf[i], ok[i])) for i in range(3)]
    np.testing.assert_allclose(fn(conf, ok), loop, atol=1e-7)
    np.testing.assert_allclose(jax.vmap(fn)(conf, ok), loop, atol=1e-7)
  jitted = jax.jit(functools.partial(ece, norm="max"))
  assert float(jitted(conf[0], ok[0])) == pytest.approx(float(ece(conf[0], ok[0], norm="max")), abs=1e-7)
  bins = jax.vmap(calibration_bins)(conf, ok)
  assert bins.edges.shape == (3, 16) and bins.count.shape == (3, 15)
  assert bins.count.sum(-1).tolist() == [N] * 3


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [ece, calibration_bins])
def test_bad_input(fn):
  with pytest.raises(ValueError, match="NaN"):
    fn([0.5, np.nan], [True, False])
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    fn([0.5, -0.1], [True, False])
  with pytest.raises(ValueError, match="same shape"):
    fn([0.5, 0.4], [True, False, True])
  with pytest.raises(ValueError, match="empty"):
    fn([], [])
  with pytest.raises(ValueError, match="correct"):
    fn([0.5, 0.4], [1.5, 0.0])
  with pytest.raises(ValueError, match="num_bins"):
    fn([0.5], [True], num_bins=0)
  with pytest.raises(ValueError, match="num_bins"):
    fn([0.5], [True], num_bins=2.5)
  with pytest.raises(ValueError, match="binning"):
    fn([0.5], [True], binning="quantile")


def test_bad_norm():
  with pytest.raises(ValueError, match="norm"):
    ece([0.5], [True], norm="l3")


def test_float32_accuracy_at_ten_million_samples():
  # The per-bin sums are exact integers and the gap is rounded once: within a
  # few float32 ulp of float64 even where n_b - A_b and U_b nearly cancel.
  rng = np.random.default_rng(12)
  n = 10_000_000
  conf = rng.uniform(0.3, 1.0, n).astype(np.float32)
  ok = rng.uniform(size=n) < conf  # calibrated: tiny gaps, large sums
  edges = np.arange(16, dtype=np.float32) / np.float32(15)
  index = np.searchsorted(edges[1:-1], conf, side="right")
  gap = np.bincount(index, weights=conf.astype(np.float64) - ok, minlength=15)
  assert float(ece(conf, ok)) == pytest.approx(np.abs(gap).sum() / n, rel=1e-6)
