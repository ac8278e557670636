"""The fused sweep against the float64 reference and against single-threshold calls."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference
from cwsa_jax import SweepResult, coverage, cwsa, cwsa_plus, selective_accuracy, sweep
from cwsa_jax import _sweep

ATOL = 2e-6
GRID = np.linspace(0.5, 0.99, 50).astype(np.float32)


def _stack(r: SweepResult) -> np.ndarray:
  return np.stack([r.coverage, r.selective_accuracy, r.cwsa, r.cwsa_plus], axis=-1)


def _check(c, ok, thresholds, normalize="retained"):
  c = np.asarray(c, np.float32)
  thresholds = np.asarray(thresholds, np.float32)
  got = _stack(sweep(c, ok, thresholds, normalize=normalize))
  want = reference.sweep(c, ok, thresholds, normalize)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, equal_nan=True)
  return got


@settings(max_examples=20, deadline=None)
@given(
    # A few sizes only: every new shape is a new compilation.
    n=st.sampled_from([1, 2, 5, 64, 400]),
    num_thresholds=st.sampled_from([1, 3, 50]),
    seed=st.integers(0, 2**31 - 1),
    normalize=st.sampled_from(["retained", "all"]),
    graded=st.booleans(),
)
def test_random_against_reference(n, num_thresholds, seed, normalize, graded):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  # Put some confidences exactly on thresholds, 0 and 1.
  thresholds = rng.uniform(0, 0.995, num_thresholds).astype(np.float32)
  hits = rng.integers(0, n, size=min(n, 5))
  c[hits] = rng.choice(np.concatenate([thresholds, [0.0, 1.0]]).astype(np.float32), size=hits.size)
  ok = rng.uniform(0, 1, n).astype(np.float32) if graded else rng.uniform(size=n) < c
  _check(c, ok, thresholds, normalize)


def test_ties_exactly_at_every_threshold():
  c = np.repeat(GRID, 3)
  ok = np.tile([True, False, True], GRID.size)
  got = _check(c, ok, GRID)
  # Threshold j retains its own three ties and everything above.
  np.testing.assert_allclose(got[:, 0], (GRID.size - np.arange(GRID.size)) / GRID.size, atol=1e-7)


def test_thresholds_zero_and_099_and_edges():
  c = np.array([0.0, 0.0, 0.5, 0.99, 0.995, 1.0], np.float32)
  ok = np.array([1, 0, 1, 0, 1, 1], bool)
  got = _check(c, ok, [0.0, 0.5, 0.99])
  assert got[0, 0] == 1.0  # tau = 0 keeps c = 0
  np.testing.assert_allclose(got[2, 0], 3 / 6)


def test_one_sample_all_correct_all_wrong_and_empty():
  for c0 in [0.0, 0.3, 0.99, 1.0]:
    for ok in [0, 1]:
      _check([c0], [ok], GRID)
  rng = np.random.default_rng(1)
  c = rng.uniform(0, 1, 300).astype(np.float32)
  right = _check(c, np.ones(300, bool), GRID)
  wrong = _check(c, np.zeros(300, bool), GRID)
  np.testing.assert_array_equal(right[:, 2] >= 0, True)
  np.testing.assert_array_equal(wrong[:, 3], 0.0)
  empty = _stack(sweep(np.array([0.1, 0.2], np.float32), np.array([1, 1]), GRID))
  assert np.all(empty[:, 0] == 0) and np.all(np.isnan(empty[:, 1]))
  assert np.all(empty[:, 2] == 0) and np.all(empty[:, 3] == 0)


def test_unsorted_and_duplicate_thresholds_keep_their_order():
  rng = np.random.default_rng(2)
  c = rng.uniform(0, 1, 500).astype(np.float32)
  ok = rng.uniform(size=500) < c
  thresholds = np.array([0.9, 0.1, 0.5, 0.5, 0.0, 0.99, 0.3], np.float32)
  r = sweep(c, ok, thresholds)
  np.testing.assert_array_equal(np.asarray(r.thresholds), thresholds)
  _check(c, ok, thresholds)


def test_clustered_thresholds_need_several_search_steps():
  """Many thresholds inside one table cell exercise the binary search."""
  rng = np.random.default_rng(3)
  thresholds = (np.float32(0.9) + np.arange(40, dtype=np.float32) * np.float32(1e-6)).astype(np.float32)
  c = np.concatenate([thresholds, rng.uniform(0.899, 0.90005, 300).astype(np.float32)])
  ok = rng.uniform(size=c.size) < 0.5
  first, counts, max_per_cell = jax.jit(_sweep.bucket_table, static_argnums=1)(
      np.sort(thresholds), _sweep.num_cells(40))
  assert int(max_per_cell) == 40
  _check(c, ok, thresholds)


@functools.partial(jax.jit, static_argnums=2)
def _bucketize(c, sorted_thresholds, cells):
  # Table and search in one program per size (eagerly, each op is a program of its own).
  first, counts, max_per_cell = _sweep.bucket_table(sorted_thresholds, cells)
  return _sweep.bucketize(c, sorted_thresholds, first, counts, max_per_cell)


def test_bucketize_matches_numpy_searchsorted():
  rng = np.random.default_rng(4)
  for num_thresholds in [1, 7, 64, 1000]:
    th = np.sort(rng.uniform(0, 1, num_thresholds).astype(np.float32))
    th[: num_thresholds // 3] = th[0]  # duplicates
    c = np.concatenate([rng.uniform(0, 1, 2000).astype(np.float32), th, [0.0, 1.0]]).astype(np.float32)
    got = _bucketize(c, th, _sweep.num_cells(num_thresholds))
    np.testing.assert_array_equal(np.asarray(got), np.searchsorted(th, c, side="right"))


def test_sweep_equals_loop_over_single_threshold_functions():
  rng = np.random.default_rng(5)
  c = rng.uniform(0, 1, 1000).astype(np.float32)
  ok = rng.uniform(size=1000) < c
  r = sweep(c, ok, GRID)
  loop = np.array([[float(coverage(c, t)), float(selective_accuracy(c, ok, t)),
                    float(cwsa(c, ok, t)), float(cwsa_plus(c, ok, t))] for t in GRID])
  np.testing.assert_allclose(_stack(r), loop, atol=1e-6, rtol=0, equal_nan=True)


def test_vmap_over_models_equals_loop_and_jit_equals_eager():
  rng = np.random.default_rng(6)
  c = jnp.asarray(rng.uniform(0, 1, (5, 400)).astype(np.float32))
  ok = jnp.asarray(rng.uniform(size=(5, 400)) < 0.7)
  th = jnp.asarray(GRID)
  loop = np.stack([_stack(sweep(c[i], ok[i], th)) for i in range(5)])
  vmapped = _stack(jax.vmap(sweep, in_axes=(0, 0, None))(c, ok, th))
  batched = _stack(sweep(c, ok, th))
  jitted = _stack(jax.jit(sweep)(c[0], ok[0], th))
  # Same numbers up to float32 rounding of the final formula (XLA fuses it differently).
  np.testing.assert_allclose(vmapped, loop, atol=1e-7, rtol=0, equal_nan=True)
  np.testing.assert_allclose(batched, loop, atol=1e-7, rtol=0, equal_nan=True)
  np.testing.assert_allclose(jitted, loop[0], atol=1e-7, rtol=0, equal_nan=True)


def test_vmap_over_bootstrap_resamples():
  rng = np.random.default_rng(7)
  c = jnp.asarray(rng.uniform(0, 1, 300).astype(np.float32))
  ok = jnp.asarray(rng.uniform(size=300) < 0.6)
  idx = jax.random.randint(jax.random.key(0), (8, 300), 0, 300)
  resampled = jax.jit(jax.vmap(lambda i: sweep(c[i], ok[i], jnp.asarray(GRID)).cwsa))(idx)
  for b in range(8):
    np.testing.assert_allclose(resampled[b], reference.sweep(np.asarray(c)[idx[b]], np.asarray(ok)[idx[b]], GRID)[:, 2],
                               atol=ATOL)


def test_large_n_float32_accuracy_every_threshold():
  """n = 10^7 over a 0..0.99 grid: every field within 2e-6 of float64."""
  rng = np.random.default_rng(8)
  n = 10**7
  c = rng.uniform(0.0, 1.0, n).astype(np.float32)
  c[: n // 2] = rng.uniform(0.985, 1.0, n // 2).astype(np.float32)
  ok = rng.uniform(size=n) < c
  thresholds = np.array([0.0, 0.25, 0.5, 0.9, 0.985, 0.99], np.float32)
  got = _stack(sweep(c, ok, thresholds))
  c64 = c.astype(np.float64)
  k = ok.astype(np.float64)
  for j, tau in enumerate(thresholds.astype(np.float64)):
    m = c64 >= tau
    phi = (c64[m] - tau) / (1 - tau)
    want = [m.mean(), k[m].mean(), np.mean(phi * (2 * k[m] - 1)), np.mean(phi * k[m])]
    np.testing.assert_allclose(got[j], want, atol=ATOL, rtol=0)


def test_chunked_exact_sums_match_numpy():
  from cwsa_jax import _exact
  rng = np.random.default_rng(9)
  n = 1000
  x = rng.uniform(0, 1, n).astype(np.float32)
  seg = rng.integers(0, 5, n).astype(np.int32)
  fn = lambda xs, ss: (ss, jnp.stack(_exact.grid_digits(1.0 - xs), 0))
  for chunk in [64, 333, 1000, 4096]:
    # One program per chunk size, not one per eager op.
    sums = jax.jit(lambda x, seg: _exact.combine(_exact.to_float(
        *_exact.segment_sums(fn, [x, seg], 5, chunk_size=chunk)), 3))  # noqa: B023
    got = sums(x, seg)
    want = np.bincount(seg, weights=1.0 - x.astype(np.float64), minlength=5)
    np.testing.assert_allclose(np.asarray(got), want, rtol=3e-7)


def _counted_sums_want(ids, cols, num_segments):
  want = np.zeros((num_segments, cols.shape[0]), np.int64)
  inside = (ids >= 0) & (ids < num_segments)
  for j in range(cols.shape[0]):
    np.add.at(want[:, j], ids[inside], cols[j][inside])
  return want


@pytest.mark.parametrize("extreme", [False, True])
def test_counted_column_sums_equal_plain_sums(extreme):
  """The count packed into the last column: the same exact sums, also at the bound (512
  samples of one segment in one slot, last column 4095) and with ids left out."""
  from cwsa_jax import _exact
  rng = np.random.default_rng(11)
  n, s = 5000 + 37, 9
  ids = rng.integers(-2, s + 2, n).astype(np.int32)
  cols = np.stack([np.ones(n, np.int32), rng.integers(0, 4097, n), rng.integers(0, 4096, n)])
  if extreme:
    ids[:2048] = 3
    cols[1, :2048], cols[2, :2048] = 4096, 4095
  cols = cols.astype(np.int32)
  assert _exact.packs(jnp.asarray(ids), s, 3)
  got = jax.jit(_exact._counted_column_sums, static_argnums=2)(
      jnp.asarray(cols), jnp.asarray(ids), s)
  np.testing.assert_array_equal(np.asarray(got), _counted_sums_want(ids, cols, s))


def test_counted_segment_sums_equal_uncounted():
  """segment_sums(counted=True) of the sweep's columns: bit for bit the plain pipeline's."""
  from cwsa_jax import _exact, _stats
  rng = np.random.default_rng(12)
  n = 70_000
  c = rng.uniform(0, 1, n).astype(np.float32)
  c[:600] = 0.0  # u = 2^24: the largest columns
  k = rng.uniform(size=n) < 0.7
  seg = rng.integers(0, 40, n).astype(np.int32)
  fn = lambda cs, ks, ss: _stats.segment_columns(cs, ks, ss)  # noqa: E731
  arrays = [jnp.asarray(c), jnp.asarray(k), jnp.asarray(seg)]
  for chunk in (4096, 1 << 18):
    plain = _exact.segment_sums(fn, arrays, 80, chunk_size=chunk)
    counted = _exact.segment_sums(fn, arrays, 80, chunk_size=chunk, counted=True)
    for a, b in zip(plain, counted):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sweep([0.5], [1], [0.5, 1.0]), "thresholds must lie in \\[0, 1\\)"),
        (lambda: sweep([0.5], [1], [[0.5]]), "1-D"),
        (lambda: sweep([0.5], [1], []), "thresholds is empty"),
        (lambda: sweep([0.5, 0.7], [1], [0.5]), "same shape"),
        (lambda: sweep([0.5, np.nan], [1, 0], [0.5]), "NaN"),
        (lambda: sweep([0.5, 2.0], [1, 0], [0.5]), "\\[0, 1\\]"),
        (lambda: sweep(np.zeros((2, 0)), np.zeros((2, 0)), [0.5]), "empty"),
        (lambda: sweep([0.5], [1], [0.5], normalize="paper"), "normalize"),
    ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_inside_jit_invalid_thresholds_give_nan_only_there():
  r = jax.jit(sweep)(jnp.array([0.5, 0.9]), jnp.array([True, False]), jnp.array([0.5, 1.0, -0.5]))
  assert np.isfinite(float(r.cwsa[0])) and np.isnan(float(r.cwsa[1])) and np.isnan(float(r.cwsa[2]))


@pytest.mark.parametrize("chunk", [64, 1000, 4096])
def test_batched_bucket_sums_equal_row_by_row(chunk):
  """Leading axes are more segments of one pass: chunks of whole rows (each summed into its
  own rows' table) or, for rows longer than a chunk, the flattened samples. The exact sums
  equal those of each row alone, with groups and a mask too."""
  from cwsa_jax._kernels import _dispatch
  rng = np.random.default_rng(11)
  c = rng.uniform(0, 1, (3, 2, 700)).astype(np.float32)
  ok = rng.uniform(size=c.shape) < c
  groups = rng.integers(0, 3, c.shape).astype(np.int32)
  mask = rng.uniform(size=c.shape) < 0.9
  _, st = _sweep.sorted_thresholds(jnp.asarray(GRID))
  row = jax.jit(lambda c, k, g, m: _sweep.bucket_sums(c, k, st, m, groups=g, num_groups=3))
  want = [np.stack([np.stack([np.asarray(x) for x in row(c[i, j], ok[i, j], groups[i, j],
                                                           mask[i, j])]) for j in range(2)])
          for i in range(3)]
  # Rows of 700 fit in chunks of 1000 and 4096 (chunks of whole rows), not in 64 (flattened).
  kernels = _dispatch.Kernels(chunk_size=chunk)
  assert _sweep._by_rows(6, 700, kernels.chunk_size) == (chunk > 700)
  batched = jax.jit(lambda c, k, g, m: _sweep.bucket_sums(c, k, st, m, groups=g, num_groups=3,
                                                          kernels=kernels))
  got = np.stack([np.asarray(x) for x in batched(c, ok, groups, mask)], axis=2)  # [3, 2, 2, ...]
  np.testing.assert_array_equal(got, np.stack(want))
  vmapped = jax.jit(jax.vmap(jax.vmap(
      lambda c, k, g, m: _sweep.bucket_sums(c, k, st, m, groups=g, num_groups=3,
                                            kernels=kernels))))
  got = np.stack([np.asarray(x) for x in vmapped(c, ok, groups, mask)], axis=2)
  np.testing.assert_array_equal(got, np.stack(want))


def test_bucket_sums_leave_out_invalid_confidences_and_count_the_rest():
  """drop_invalid: NaN, inf and values outside [0, 1] are left out (-0.0, 0 and 1 stay in):
  the sums equal those of the valid samples alone, and ``kept_count`` counts them exactly."""
  rng = np.random.default_rng(3)
  c = rng.uniform(0, 1, (2, 500)).astype(np.float32)
  ok = rng.uniform(size=c.shape) < c
  c[0, :8] = [np.nan, np.inf, -np.inf, -1e-30, 1.0000001, 7.0, -0.0, 1.0]
  c[1, 10] = 0.0
  _, st = _sweep.sorted_thresholds(jnp.asarray(GRID))
  keep = (c >= 0) & (c <= 1)
  kernel = jax.jit(lambda c, k: _sweep.bucket_sums(c, k, st, drop_invalid=True))
  hi, lo = kernel(c, ok)
  np.testing.assert_array_equal(np.asarray(_sweep.kept_count(hi, lo)), keep.sum(axis=1))
  for row in range(2):
    want = kernel(c[row][keep[row]], ok[row][keep[row]])
    for a, b in zip(want, (hi[row], lo[row])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  graded = kernel(c, rng.uniform(size=c.shape).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(_sweep.kept_count(*graded)), keep.sum(axis=1))


def test_inside_jit_one_invalid_confidence_among_2_to_24_plus_1_samples_gives_nan():
  """The flag is an exact integer count: a float32 count would round 2^24 kept samples and
  2^24 + 1 to the same number and miss the one left out."""
  n = (1 << 24) + 1
  c = np.full(n, 0.75, np.float32)
  ok = np.ones(n, bool)
  f = jax.jit(sweep)
  assert np.all(np.isfinite(np.asarray(f(c, ok, jnp.asarray(GRID)).cwsa)))
  c[12345] = np.nan
  assert np.all(np.isnan(np.asarray(f(c, ok, jnp.asarray(GRID)).cwsa)))


def test_divisions_rounded_once_in_every_call_form():
  """Coverage is float32(count / n) exactly, and selective accuracy float32(correct / count),
  whatever XLA knows of the divisor: XLA turns a division by a broadcast scalar or a constant
  into a multiplication by its reciprocal (1 ulp off in about a quarter of cases), and results
  then changed when a jit closed over the thresholds. Eager, jitted with thresholds as an
  argument or as constants, and vmapped over rows: the same floats."""
  rng = np.random.default_rng(7)
  t = np.linspace(0.0, 0.99, 50).astype(np.float32)
  for n in (11, 1001):
    c = rng.random((2, n)).astype(np.float32)
    ok = rng.random((2, n)) < c
    eager = sweep(c, ok, t)
    count = (c[..., None] >= t).sum(axis=-2)
    right = ((c[..., None] >= t) & ok[..., None]).sum(axis=-2)
    np.testing.assert_array_equal(np.asarray(eager.coverage), (count / n).astype(np.float32))
    with np.errstate(invalid="ignore", divide="ignore"):
      np.testing.assert_array_equal(np.asarray(eager.selective_accuracy),
                                    (right / count).astype(np.float32))
    forms = {"jit": jax.jit(sweep)(c, ok, t),
             "jit_closed_over_thresholds": jax.jit(lambda c, k: sweep(c, k, t))(c, ok),
             "vmap": jax.vmap(lambda c, k: sweep(c, k, t))(c, ok)}
    for name, got in forms.items():
      np.testing.assert_array_equal(_stack(got), _stack(eager), err_msg=f"n = {n}: {name}")
    np.testing.assert_array_equal(_stack(sweep(c[1], ok[1], t)), _stack(eager)[1])
