"""Float64 confidences in the mergeable states, the NNX metrics and ``cwsa-jax evaluate``.

The states (``SweepState``, ``CalibrationState``) built from concrete float64
confidences or probabilities must compare them with thresholds and bin edges in
float64, equal to the one-shot ``sweep`` / ``ece`` on the same input bit for bit,
and to an independent float64 reference written here. ``evaluate`` on a CSV whose
confidences differ below float32's resolution must report the library's one-shot
values on the float64 data (in memory; ``--stream`` for the sweep and the ECE), and
a CSV of float32 values keeps float32's bins. Inside ``jit`` nothing changes.
"""

import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax.cli import _io, _json, _metrics, _stream
from cwsa_jax.cli._settings import Settings
from cwsa_jax.streaming import CalibrationState, SweepState
from test_cli import load, ref_aurc_step, ref_eaurc_step, ref_risks, run_ok

N = 240
GRID = [0.5, 0.55, 0.7, 0.9]  # Python floats: 0.55 and 0.7 are not float32 values
F32_07 = float(np.float32(0.7))  # 0.699999988...: below 0.7
DECIMALS = np.round(0.5 + 0.01 * np.arange(50), 2)  # evaluate's default grid, as written


# ------------------------------------------------------------------ float64 references


def ref_sweep(c, k, thresholds):
  """(coverage, selective accuracy, cwsa, cwsa+) [T] in float64 (ties at tau retained)."""
  c, k = np.asarray(c, np.float64), np.asarray(k, np.float64)
  rows = []
  for tau in np.asarray(thresholds, np.float64):
    kept = c >= tau
    phi = (c - tau) / (1.0 - tau)
    size = kept.sum()
    rows.append((kept.mean(), k[kept].mean() if size else np.nan,
                 (phi * (2 * k - 1))[kept].sum() / size if size else 0.0,
                 (phi * k)[kept].sum() / size if size else 0.0))
  return np.array(rows).T


def ref_ece(c, k, num_bins):
  """(ECE, per-bin counts) with float64 width edges ``j / B`` and ``e_j <= c < e_{j+1}``."""
  c, k = np.asarray(c, np.float64), np.asarray(k, np.float64)
  b = np.searchsorted(np.arange(1, num_bins) / num_bins, c, side="right")
  gap = np.bincount(b, c - k, minlength=num_bins)
  return np.abs(gap).sum() / c.size, np.bincount(b, minlength=num_bins)


def f32_differs(c, thresholds):
  """Whether float32 rounding changes some comparison with ``thresholds`` (the data tests it)."""
  t = np.asarray(thresholds, np.float64).reshape(-1, 1)
  return bool(np.any((c >= t) != (c.astype(np.float32) >= t.astype(np.float32))))


def near(rng, centres, n=N, spread=1e-9):
  """float64 confidences within ``spread`` of ``centres`` (some on them, a few anywhere)."""
  c = rng.choice(np.asarray(centres, np.float64), n) + rng.uniform(-spread, spread, n)
  c[: n // 8] = rng.choice(np.asarray(centres, np.float64), n // 8)
  c[-4:] = rng.uniform(0.0, 1.0, 4)
  return np.clip(c, 0.0, 1.0)


def data(case):
  rng = np.random.default_rng(len(case))
  if case == "issue":
    return np.array([0.5 - 1e-9, 0.9]), np.array([False, True])
  if case == "one":
    return np.array([0.7 - 1e-12]), np.array([True])
  c = near(rng, GRID + [F32_07], spread=1e-9 if case != "ties" else 0.0)
  k = rng.uniform(size=N) < 0.5
  if case == "all_correct":
    k[:] = True
  if case == "all_wrong":
    k[:] = False
  return c, k


def merged(state_type, c, k, **options):
  """The state of ``c``, ``k`` built from two halves and merged (one half for n = 1)."""
  if c.size == 1:
    return state_type.from_batch(c, k, **options)
  h = c.size // 2
  return state_type.from_batch(c[:h], k[:h], **options).merge(
      state_type.from_batch(c[h:], k[h:], **options))


def assert_same(got, want, fields):
  for f in fields:
    np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), f)


SWEPT = ("coverage", "selective_accuracy", "cwsa", "cwsa_plus")


def assert_sweep_ref(result, c, k, thresholds):
  ref = ref_sweep(c, k, thresholds)
  for name, r in zip(SWEPT, ref):
    np.testing.assert_allclose(np.asarray(getattr(result, name), np.float64), r, atol=2e-6,
                               rtol=0, err_msg=name)


# ------------------------------------------------------------------ the states


@pytest.mark.parametrize("case", ["issue", "one", "near", "ties", "all_correct", "all_wrong"])
def test_sweep_state_compares_in_float64(case):
  c, k = data(case)
  got = merged(SweepState, c, k, thresholds=GRID).compute()
  assert_same(got, cw.sweep(c, k, GRID), SWEPT)
  assert_sweep_ref(got, c, k, GRID)
  if case == "issue":  # the numbers: the first sample is not retained at 0.5
    np.testing.assert_allclose([got.coverage[0], got.selective_accuracy[0], got.cwsa[0]],
                               [0.5, 1.0, 0.8], rtol=1e-6)
  if case in ("near", "one", "issue"):
    assert f32_differs(c, GRID)


def test_configured_classes_keep_the_thresholds_precision():
  c, k = data("near")
  Sweep = SweepState.configure(thresholds=GRID)
  state = Sweep.empty().merge(Sweep.from_model_output(confidences=c[:N // 2],
                                                       correct=k[:N // 2], loss=1.0))
  state = state.merge(Sweep.from_model_output(confidences=c[N // 2:], correct=k[N // 2:]))
  assert_same(state.compute(), cw.sweep(c, k, GRID), SWEPT)
  assert_sweep_ref(state.compute(), c, k, GRID)
  # A Python float keeps its float64 value (0.7), a float32 one its own (0.69999998...).
  coverage = SweepState.at(0.7, metric="coverage")
  assert coverage.from_model_output(confidences=c, correct=k).compute() == cw.coverage(c, tau=0.7)
  assert float(coverage.from_model_output(confidences=c, correct=k).compute()) == pytest.approx(
      np.mean(c >= 0.7), abs=1e-7)
  coverage32 = SweepState.at(np.float32(0.7), metric="coverage")
  assert float(coverage32.from_model_output(confidences=c, correct=k).compute()) == pytest.approx(
      np.mean(c >= F32_07), abs=1e-7)
  assert np.mean(c >= 0.7) != np.mean(c >= F32_07)


def test_mask_drops_padding_without_losing_float64():
  c, k = data("near")
  padded = c.copy()
  padded[-6:] = np.nan  # padding may hold anything
  mask = np.arange(N) < N - 6
  got = SweepState.from_batch(padded, k, GRID, mask=mask).compute()
  assert_sweep_ref(got, c[:-6], k[:-6], GRID)
  np.testing.assert_array_equal(np.asarray(got.coverage),
                                np.float32([np.sum(c[:-6] >= t) for t in GRID]) / np.float32(N - 6))


@pytest.mark.parametrize("num_bins", [10, 15])
def test_calibration_state_bins_in_float64(num_bins):
  rng = np.random.default_rng(num_bins)
  c = near(rng, np.arange(1, num_bins) / num_bins, spread=1e-12)
  k = rng.uniform(size=N) < 0.6
  assert f32_differs(c, np.arange(1, num_bins) / num_bins)
  state = merged(CalibrationState, c, k, num_bins=num_bins)
  np.testing.assert_array_equal(np.asarray(state.compute()),
                                np.asarray(cw.ece(c, k, num_bins=num_bins)))
  want, counts = ref_ece(c, k, num_bins)
  assert float(state.compute()) == pytest.approx(want, abs=2e-6)
  np.testing.assert_array_equal(np.asarray(state.bins().count), counts)


def test_float64_probabilities_keep_their_maximum_and_argmax():
  rng = np.random.default_rng(7)
  top = near(rng, [0.5, 0.55, 0.7], spread=1e-9)
  rest = (1.0 - top) / 2
  p = np.stack([top, rest, rest], axis=1)
  # Two classes tied in float32 but not in float64: the float64 argmax picks the class.
  p[:16] = [0.5 - 1e-9, 0.5 + 1e-9, 0.0]
  p[16:32] = [0.5 + 1e-9, 0.5 - 1e-9, 0.0]
  labels = rng.integers(0, 3, N)
  labels[:32] = 1
  c, k = p.max(axis=1), p.argmax(axis=1) == labels
  assert f32_differs(c, GRID)
  Sweep = SweepState.configure(thresholds=GRID)
  got = Sweep.from_model_output(probs=p, labels=labels).compute()
  assert_same(got, cw.sweep(c, k, GRID), SWEPT)
  assert_sweep_ref(got, c, k, GRID)
  Cal = CalibrationState.configure(num_bins=10)
  ece = Cal.from_model_output(probs=p, labels=labels).compute()
  assert ece == cw.ece(c, k, num_bins=10)
  assert float(ece) == pytest.approx(ref_ece(c, k, 10)[0], abs=2e-6)


def test_inside_jit_and_nnx_jit_the_inputs_are_float32():
  import jax
  nnx = pytest.importorskip("flax.nnx")
  from cwsa_jax import nnx as cwsa_nnx
  c, k = data("near")
  c32 = c.astype(np.float32)
  traced = jax.jit(lambda c, k: SweepState.from_batch(c, k, GRID).compute().coverage)(c, k)
  np.testing.assert_array_equal(np.asarray(traced), np.asarray(cw.sweep(c32, k, GRID).coverage))
  metric = cwsa_nnx.ThresholdMetric(0.7, metric="coverage")
  metric.update(confidences=c, correct=k)  # eager: float64
  assert metric.compute() == cw.coverage(c, tau=0.7)
  metric.reset()
  nnx.jit(lambda m, c, k: m.update(confidences=c, correct=k))(metric, c, k)
  assert metric.compute() == cw.coverage(c32, tau=0.7)
  assert cw.coverage(c32, tau=0.7) != cw.coverage(c, tau=0.7)
  calibration = cwsa_nnx.CalibrationMetric(10)
  cc, kc = data("ties")
  calibration.update(confidences=cc, correct=kc)
  assert calibration.compute() == cw.ece(cc, kc, num_bins=10)


# ------------------------------------------------------------------ the CLI


def float64_csv(path, rng):
  """A CSV of distinct float64 confidences next to the grid's decimals and the bin edges
  (``t - 1e-12``, ``0.5 - 1e-9``, ``j / 15 - 3e-12``), on them (``0.55``, below its float32
  0.55000001), and pairs one float32 value holds."""
  grid = DECIMALS
  edges = np.arange(1, 15) / 15
  c = np.concatenate([grid[::3] - 1e-12, grid[5::6], [0.5 - 1e-9], edges - 3e-12,
                      [0.8, 0.8 + 1e-12, 0.86, 0.86 + 1e-12]])
  pairs = c.size - 4
  c = np.concatenate([c, rng.uniform(0.3, 1.0, N - c.size)])
  ok = rng.uniform(size=N) < 0.7
  ok[pairs:pairs + 4] = [True, False, False, True]  # float32 ties them: the order matters
  with open(path, "w") as f:
    f.write("confidence,correct\n")
    for x, y in zip(c, ok):
      f.write(f"{float(x)!r},{int(y)}\n")
  assert np.unique(c).size == N  # distinct in float64 (the step references need it)
  return c, ok


def test_evaluate_float64_csv_reports_the_float64_metrics(tmp_path, capsys):
  rng = np.random.default_rng(3)
  c, ok = float64_csv(tmp_path / "p.csv", rng)
  c32, grid = c.astype(np.float32), Settings().grid
  np.testing.assert_array_equal(_metrics.decimal_thresholds(grid), DECIMALS)
  assert f32_differs(c, DECIMALS) and f32_differs(c, np.arange(1, 15) / 15)
  assert np.unique(c32).size < N  # float32 ties some of them
  run_ok(["evaluate", tmp_path / "p.csv", "--out", tmp_path / "out", "--no-figures",
          "--bootstrap", "0", "--no-progress"], capsys)
  m = load(tmp_path / "out")
  as_json = lambda x: _json.plain(np.asarray(x))  # noqa: E731  (metrics.json's rounding)
  sweep = cw.sweep(c, ok, DECIMALS)
  assert m["sweep"]["thresholds"] == as_json(grid)
  for name in SWEPT:
    assert m["sweep"][name] == as_json(getattr(sweep, name)), name
  assert_sweep_ref(cw.SweepResult(grid, *(np.array(m["sweep"][n], np.float64) for n in SWEPT)),
                   c, ok, DECIMALS)
  assert 0.55 in c  # a confidence of 0.55 is retained at 0.55, as in float32
  assert m["sweep"]["coverage"][5] == as_json(np.float32(np.sum(c >= 0.55)) / np.float32(N))
  assert m["sweep"]["coverage"] != as_json(cw.sweep(c32, ok, grid).coverage)
  assert m["ece"] == as_json(cw.ece(c, ok))
  assert m["ece"] == pytest.approx(ref_ece(c, ok, 15)[0], abs=2e-6)
  summary = cw.risk_coverage_summary(c, ok)
  for name, ref in (("aurc", ref_aurc_step(c, ok)), ("eaurc", ref_eaurc_step(c, ok)),
                    ("augrc", ref_risks(c, ok)[1].mean())):
    assert m[name] == as_json(getattr(summary, name)), name
    assert m[name] == pytest.approx(ref, abs=2e-6), name
  assert m["aurc"] != as_json(cw.aurc(c32, ok))
  assert m["auroc"] == as_json(cw.auroc(c, ok))
  pairs = (c[ok][:, None] > c[~ok][None, :]).mean()  # distinct scores: no half-counted ties
  assert m["auroc"] == pytest.approx(pairs, abs=2e-6)
  assert m["average_precision_success"] == as_json(cw.average_precision(c, ok))


def test_stream_and_float32_files(tmp_path):
  rng = np.random.default_rng(3)
  c, ok = float64_csv(tmp_path / "p.csv", rng)
  settings = Settings()
  scan = _stream.scan([tmp_path / "p.csv"], settings, 64)
  assert scan.wide
  assert_same(scan.sweep.compute(), cw.sweep(c, ok, DECIMALS), SWEPT)
  assert scan.calibration.compute() == cw.ece(c, ok)
  assert _io.load_inputs([tmp_path / "p.csv"]).wide_confidences.dtype == np.float64
  # float32 values on the float32 edges below j / 10 (float32(0.7) < 0.7): read as float32.
  c32 = np.float32(np.concatenate([[F32_07] * 8, np.float32([0.3, 0.1, 0.9, 0.5]),
                                   rng.uniform(0, 1, N - 12)]))
  with open(tmp_path / "f32.csv", "w") as f:
    f.write("confidence,correct\n")
    for x, y in zip(c32, ok):
      f.write(f"{float(x)!r},{int(y)}\n")
  assert _io.load_inputs([tmp_path / "f32.csv"]).wide_confidences is None
  tens = Settings(num_bins=10)
  scan32 = _stream.scan([tmp_path / "f32.csv"], tens, 64)
  assert not scan32.wide
  assert scan32.calibration.compute() == cw.ece(c32, ok, num_bins=10)
  assert cw.ece(c32, ok, num_bins=10) != cw.ece(c32.astype(np.float64), ok, num_bins=10)
  metrics = _stream.stream_metrics(scan32, cw.risk_coverage_summary(c32, ok), tens)
  np.testing.assert_array_equal(metrics.sweep.coverage, np.asarray(cw.sweep(c32, ok, tens.grid).coverage))


def test_a_float32_dump_at_9_digits_reads_as_float32_and_other_decimals_as_float64():
  """`%.9g` round-trips float32, so such a column is the float32 values it was written from;
  decimals that are not (0.5 - 1e-9, shortest reprs such as 0.51) keep their float64 meaning."""
  from cwsa_jax.cli import _io
  rng = np.random.default_rng(11)
  c32 = np.concatenate([rng.beta(4.0, 1.5, 2000), [0.0, 1.0, 0.51, 1e-5]]).astype(np.float32)
  printed = np.array([float(f"{x:.9g}") for x in c32])
  assert not np.array_equal(printed, c32.astype(np.float64))  # the text is not the float32 value
  assert _io.float32_printed(printed) and _io.float32_printed(c32.astype(np.float64))
  for decimals in ([0.5 - 1e-9, 0.9], [0.51, 0.3], [0.123456789012]):
    assert not _io.float32_printed(np.array(decimals))
