"""Bootstrap intervals against float64 NumPy loops over the same resample indices.

Every test uses fixed keys and seeds, so nothing here can flake: the
statistical tests (coverage, width) have wide tolerances around values that
are computed once and do not change between runs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

import reference
from cwsa_jax import (SweepResult, aurc, augrc, cwsa, cwsa_plus, eaurc, ece, risk_coverage_summary,
                      selective_accuracy, sweep)
from cwsa_jax._bootstrap import (BootstrapResult, PairedBootstrapResult, bootstrap_ci,
                                 bootstrap_samples, bootstrap_sweep, paired_bootstrap)
from cwsa_jax._bootstrap._sampler import _resample_indices, _scale, _threefry2x32

ATOL = 2e-6
N = 400  # one sample size (and 4 N) throughout: each new shape is a new compilation
B = 50
GRID = np.linspace(0.5, 0.99, 50).astype(np.float32)
KEY = jax.random.key(7)

# Module-level metric functions: the jitted bootstrap compiles once per function object.
CWSA_05 = lambda c, k: cwsa(c, k, 0.5)  # noqa: E731
SWEEP = lambda c, k: sweep(c, k, GRID)  # noqa: E731
SA_09 = lambda c, k: selective_accuracy(c, k, 0.9)  # noqa: E731


def ARRAY(c, k):  # an array-valued metric [3]
  return jnp.stack([cwsa(c, k, 0.5), cwsa_plus(c, k, 0.7), jnp.mean(k.astype(jnp.float32))])


def ARRAY_REF(c, k):
  return np.array([reference.hard_metrics(c, k, 0.5)[2], reference.hard_metrics(c, k, 0.7)[3],
                   np.mean(np.asarray(k, np.float64))])


def COVERAGE_FN(c, k):
  return jnp.stack([cwsa(c, k, 0.5), selective_accuracy(c, k, 0.5)])


def data(n=N, seed=0, graded=False):
  """Calibrated synthetic scores: c ~ U[0, 1], correct ~ Bernoulli(c)."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.0, 1.0, n).astype(np.float32)
  ok = rng.uniform(0.0, 1.0, n).astype(np.float32) if graded else rng.uniform(size=n) < c
  return c, ok


def quantiles(values, level=0.95):
  return np.nanquantile(np.asarray(values, np.float64), [(1 - level) / 2, (1 + level) / 2], axis=0)


# --- the random indices -------------------------------------------------------------------

def test_threefry_known_answers_and_jax():
  # Random123's known-answer vectors for Threefry-2x32-20.
  cases = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
           ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 2, (0x1CB996FC, 0xBB002BE7)),
           ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
  u = lambda x: jnp.asarray(np.uint32(x))
  for key, counter, want in cases:
    got = _threefry2x32(u(key[0]), u(key[1]), u(counter[0]), u(counter[1]))
    assert [int(g) for g in got] == list(want)
  # And JAX's own threefry on random words.
  rng = np.random.default_rng(0)
  k = rng.integers(0, 2**32, 2, dtype=np.uint32)
  x = rng.integers(0, 2**32, (2, 1000), dtype=np.uint32)
  got = _threefry2x32(u(k[0]), u(k[1]), jnp.asarray(x[0]), jnp.asarray(x[1]))
  want = threefry_2x32((u(k[0]), u(k[1])), jnp.asarray(x.reshape(-1)))
  np.testing.assert_array_equal(np.concatenate([np.asarray(g) for g in got]), np.asarray(want))


def test_multiply_shift_is_exact():
  rng = np.random.default_rng(1)
  w = rng.integers(0, 2**32, (2, 2000), dtype=np.uint32)
  w[:, :4] = [[0, 0, 2**32 - 1, 2**32 - 1], [0, 2**32 - 1, 0, 2**32 - 1]]
  for n in [1, 2, 3, 400, 10**5, 65537, 2**31 - 1]:
    got = np.asarray(_scale(jnp.asarray(w[0]), jnp.asarray(w[1]), n))
    want = [((int(a) << 32 | int(b)) * n) >> 64 for a, b in zip(w[0], w[1])]
    np.testing.assert_array_equal(got, want)


def test_indices_uniform_independent_and_prefix_stable():
  idx = np.asarray(_resample_indices(KEY, N, 500))
  assert idx.shape == (500, N) and idx.dtype == np.int32
  assert idx.min() >= 0 and idx.max() < N
  # Pearson chi-square of the 200000 draws over 400 cells: 399 dof, sd 28.
  counts = np.bincount(idx.reshape(-1), minlength=N)
  chi2 = np.sum((counts - 500.0) ** 2 / 500.0)
  assert 399 - 6 * 28 < chi2 < 399 + 6 * 28
  # Distinct samples per resample: n (1 - (1 - 1/n)^n) = 0.6326 n on average.
  distinct = np.mean([np.unique(row).size for row in idx]) / N
  assert abs(distinct - (1 - (1 - 1 / N) ** N)) < 0.005
  # Resample b depends on (key, b) only.
  np.testing.assert_array_equal(np.asarray(_resample_indices(KEY, N, 20)), idx[:20])
  assert np.mean(np.asarray(_resample_indices(jax.random.key(8), N, 20)) == idx[:20]) < 0.01
  # Legacy uint32 keys are the same key.
  np.testing.assert_array_equal(np.asarray(_resample_indices(jax.random.PRNGKey(7), N, 20)),
                                idx[:20])


# --- the resampled values and the interval --------------------------------------------------

def test_scalar_metric_matches_float64_loop():
  c, ok = data()
  num = 500
  idx = np.asarray(_resample_indices(KEY, N, num))
  want = np.array([reference.hard_metrics(c[i], ok[i], 0.5)[2] for i in idx])
  got = bootstrap_samples(CWSA_05, c, ok, key=KEY, num_resamples=num)
  assert got.shape == (num,)
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
  r = bootstrap_ci(CWSA_05, c, ok, key=KEY, num_resamples=num)
  assert isinstance(r, BootstrapResult)
  np.testing.assert_allclose(r.estimate, reference.hard_metrics(c, ok, 0.5)[2], atol=ATOL)
  np.testing.assert_allclose([r.low, r.high], quantiles(want), atol=ATOL, rtol=0)
  r90 = bootstrap_ci(CWSA_05, c, ok, key=KEY, num_resamples=num, level=0.9)
  np.testing.assert_allclose([r90.low, r90.high], quantiles(want, 0.9), atol=ATOL, rtol=0)
  assert r.low < r90.low < r90.high < r.high


@pytest.mark.parametrize("graded", [False, True])
def test_whole_sweep_matches_float64_loop(graded):
  c, ok = data(seed=2, graded=graded)
  num = B
  idx = np.asarray(_resample_indices(KEY, N, num))
  want = np.stack([reference.sweep(c[i], ok[i], GRID) for i in idx])  # [B, T, 4]
  r = bootstrap_ci(SWEEP, c, ok, key=KEY, num_resamples=num)
  assert isinstance(r.estimate, SweepResult) and isinstance(r.low, SweepResult)
  np.testing.assert_array_equal(r.low.thresholds, GRID)
  np.testing.assert_array_equal(r.high.thresholds, GRID)
  np.testing.assert_allclose(np.stack(r.estimate[1:], -1), reference.sweep(c, ok, GRID),
                             atol=ATOL, equal_nan=True)
  samples = bootstrap_samples(SWEEP, c, ok, key=KEY, num_resamples=num)
  np.testing.assert_allclose(np.stack(samples[1:], -1), want, atol=ATOL, rtol=0, equal_nan=True)
  low, high = quantiles(want)
  np.testing.assert_allclose(np.stack(r.low[1:], -1), low, atol=ATOL, rtol=0)
  np.testing.assert_allclose(np.stack(r.high[1:], -1), high, atol=ATOL, rtol=0)


def test_array_and_dict_metrics():
  c, ok = data(seed=3)
  idx = np.asarray(_resample_indices(KEY, N, B))
  want = np.stack([ARRAY_REF(c[i], ok[i]) for i in idx])
  r = bootstrap_ci(ARRAY, c, ok, key=KEY, num_resamples=B)
  assert r.low.shape == (3,)
  np.testing.assert_allclose(r.estimate, ARRAY_REF(c, ok), atol=ATOL)
  np.testing.assert_allclose(np.stack([r.low, r.high]), quantiles(want), atol=ATOL, rtol=0)
  as_dict = bootstrap_ci(lambda c, k: {"cwsa": cwsa(c, k, 0.5), "n": jnp.sum(k)}, c, ok,
                         key=KEY, num_resamples=B)
  np.testing.assert_allclose([as_dict.low["cwsa"], as_dict.high["cwsa"]], [r.low[0], r.high[0]])
  assert as_dict.estimate["n"] == ok.sum()
  correct_counts = np.array([ok[i].sum() for i in idx])
  np.testing.assert_allclose([as_dict.low["n"], as_dict.high["n"]], quantiles(correct_counts),
                             rtol=1e-6)


def test_nan_resamples_are_left_out():
  # Two of N samples are above tau = 0.9: about e^-2 = 14% of resamples retain none,
  # and their selective accuracy is NaN.
  c = np.linspace(0.0, 0.5, N).astype(np.float32)
  c[[10, 20]] = [0.95, 0.92]
  ok = np.zeros(N, bool)
  ok[10] = True
  num = 200
  idx = np.asarray(_resample_indices(KEY, N, num))
  want = np.array([reference.hard_metrics(c[i], ok[i], 0.9)[1] for i in idx])
  assert 10 < np.isnan(want).sum() < 60
  samples = bootstrap_samples(SA_09, c, ok, key=KEY, num_resamples=num)
  np.testing.assert_allclose(samples, want, atol=ATOL, equal_nan=True)
  r = bootstrap_ci(SA_09, c, ok, key=KEY, num_resamples=num)
  assert np.isfinite(r.low) and np.isfinite(r.high)
  np.testing.assert_allclose([r.low, r.high], quantiles(want), atol=ATOL)
  assert r.low == 0.0 and r.high == 1.0
  # No resample retains anything: NaN bounds, not an error.
  none = bootstrap_ci(SA_09, np.full(N, 0.3, np.float32), ok, key=KEY, num_resamples=num)
  assert np.isnan(none.estimate) and np.isnan(none.low) and np.isnan(none.high)


@pytest.mark.parametrize("level", [0.95, 0.5, 0.999])
def test_interval_bounds_are_numpys_linear_quantiles_and_exact_for_constants(level):
  """The bounds interpolate as NumPy does, x_(j) + t (x_(j+1) - x_(j)): a value equal in
  every resample (a sweep's thresholds, a metric of ties) is its own interval bit for bit,
  whether or not the compiler fuses the interpolation into multiply-adds."""
  from cwsa_jax._bootstrap._intervals import _percentiles
  rng = np.random.default_rng(3)
  x = rng.normal(size=(B, 6)).astype(np.float32)
  x[:, 1] = np.round(x[:, 1], 1)  # ties between order statistics
  x[rng.uniform(size=x.shape) < 0.3] = np.nan
  x[:, 2] = np.float32(0.66)  # constant: (1 - t) x + t x may round off x
  x[:, 3] = np.nan
  x[: B - 1, 4] = np.nan  # one value
  low, high = _percentiles(jnp.asarray(x), level)
  # float32 h = (m - 1) q: t is off by up to ~1e-7 m, times a gap of order 1 here.
  np.testing.assert_allclose(np.stack([low, high]), quantiles(x, level), atol=5e-6, rtol=0,
                             equal_nan=True)
  assert low[2] == high[2] == np.float32(0.66)
  assert np.isnan(low[3]) and np.isnan(high[3])
  assert low[4] == high[4] == x[B - 1, 4]
  r = bootstrap_ci(SWEEP, *data(), key=KEY, num_resamples=B, level=level)
  np.testing.assert_array_equal(r.low.thresholds, GRID)
  np.testing.assert_array_equal(r.high.thresholds, GRID)


def test_chunking_does_not_change_values():
  c, ok = data(seed=4)
  small = bootstrap_samples(SWEEP, c, ok, key=KEY, num_resamples=B, chunk_size=7)
  large = bootstrap_samples(SWEEP, c, ok, key=KEY, num_resamples=B, chunk_size=1000)
  default = bootstrap_samples(SWEEP, c, ok, key=KEY, num_resamples=B)
  single = bootstrap_samples(SWEEP, c, ok, key=KEY, num_resamples=B, chunk_size=1)
  for a, b, d, e in zip(small, large, default, single):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, d)
    np.testing.assert_array_equal(a, e)
  assert np.unique(small.cwsa[:, 0]).size > B // 2  # the resamples do differ


def test_interval_brackets_estimate_and_narrows_as_one_over_sqrt_n():
  widths = []
  for n in [N, 4 * N]:
    c, ok = data(n, seed=5)
    r = bootstrap_ci(CWSA_05, c, ok, key=KEY, num_resamples=500)
    assert r.low < r.estimate < r.high
    widths.append(float(r.high - r.low))
  assert 1.5 <= widths[0] / widths[1] <= 2.7, widths


def test_coverage_of_known_population_values():
  # c ~ U[0, 1], correct ~ Bernoulli(c): at tau = 0.5, phi = 2c - 1 = u ~ U[0, 1] on the
  # retained half, so CWSA = E[u^2] = 1/3 and selective accuracy = E[c | c >= 0.5] = 3/4.
  truth = np.array([1.0 / 3.0, 0.75])
  reps = 120
  rng = np.random.default_rng(11)
  c = rng.uniform(0.0, 1.0, (reps, N)).astype(np.float32)
  ok = rng.uniform(size=(reps, N)) < c
  keys = jax.random.split(jax.random.key(12), reps)
  r = jax.vmap(lambda c, k, key: bootstrap_ci(COVERAGE_FN, c, k, key=key, num_resamples=500,
                                              chunk_size=25))(jnp.asarray(c), jnp.asarray(ok), keys)
  assert r.low.shape == (reps, 2)
  covered = np.mean((np.asarray(r.low) <= truth) & (truth <= np.asarray(r.high)), axis=0)
  # 95% nominal; binomial sd over 120 replicates is 0.02.
  assert np.all((0.88 <= covered) & (covered <= 0.995)), covered
  # The vmapped call is the unbatched one, replicate by replicate.
  one = bootstrap_ci(COVERAGE_FN, c[3], ok[3], key=keys[3], num_resamples=500, chunk_size=25)
  np.testing.assert_allclose(np.stack([one.low, one.high]), np.stack([r.low[3], r.high[3]]),
                             atol=1e-6)


# --- paired ---------------------------------------------------------------------------------

def p_value(d):
  d = d[~np.isnan(d)]
  below, above = np.sum(d <= 0), np.sum(d >= 0)
  return min(1.0, 2 * min(1 + below, 1 + above) / (1 + d.size))


def test_paired_identical_models():
  c, ok = data(seed=6)
  r = paired_bootstrap(ARRAY, c, ok, c, ok, key=KEY, num_resamples=B)
  assert isinstance(r, PairedBootstrapResult)
  np.testing.assert_array_equal(r.difference, 0.0)
  np.testing.assert_array_equal(r.low, 0.0)
  np.testing.assert_array_equal(r.high, 0.0)
  np.testing.assert_array_equal(r.p_value, 1.0)
  np.testing.assert_array_equal(r.estimate_a, r.estimate_b)


def test_paired_better_model_and_swap():
  c, ok_a = data(seed=7)
  ok_b = np.random.default_rng(8).uniform(size=N) < 0.5  # correctness unrelated to confidence
  r = paired_bootstrap(ARRAY, c, ok_a, c, ok_b, key=KEY, num_resamples=500)
  np.testing.assert_allclose(r.estimate_a, ARRAY_REF(c, ok_a), atol=ATOL)
  np.testing.assert_allclose(r.estimate_b, ARRAY_REF(c, ok_b), atol=ATOL)
  np.testing.assert_allclose(r.difference, ARRAY_REF(c, ok_a) - ARRAY_REF(c, ok_b), atol=2 * ATOL)
  # CWSA and CWSA+ of the calibrated model are clearly better.
  assert np.all(r.p_value[:2] < 0.01) and np.all(r.low[:2] > 0), r
  assert np.all(r.p_value[:2] >= 2 / 501)  # never 0
  # The resampled differences are the two models' samples on the same indices.
  d = (np.asarray(bootstrap_samples(ARRAY, c, ok_a, key=KEY, num_resamples=500))
       - np.asarray(bootstrap_samples(ARRAY, c, ok_b, key=KEY, num_resamples=500)))
  np.testing.assert_allclose(np.stack([r.low, r.high]), quantiles(d), atol=ATOL)
  # (CWSA and CWSA+ sums are exact, so the ties d = 0 are the same in both computations.)
  np.testing.assert_allclose(r.p_value[:2], [p_value(d[:, j]) for j in range(2)], rtol=1e-6)
  assert 0.05 < r.p_value[2] <= 1.0  # accuracy: both about 0.5 on this data
  swapped = paired_bootstrap(ARRAY, c, ok_b, c, ok_a, key=KEY, num_resamples=500)
  np.testing.assert_array_equal(swapped.difference, -r.difference)
  np.testing.assert_allclose(swapped.low, -r.high, atol=1e-6)
  np.testing.assert_allclose(swapped.high, -r.low, atol=1e-6)
  np.testing.assert_array_equal(swapped.p_value, r.p_value)


def test_paired_whole_sweep_with_different_confidences():
  c_a, ok_a = data(seed=9)
  c_b = np.clip(c_a + np.random.default_rng(10).normal(0, 0.1, N), 0, 1).astype(np.float32)
  r = paired_bootstrap(SWEEP, c_a, ok_a, c_b, ok_a, key=KEY, num_resamples=B)
  assert isinstance(r.p_value, SweepResult)
  np.testing.assert_array_equal(r.p_value.thresholds, 1.0)
  idx = np.asarray(_resample_indices(KEY, N, B))
  d = np.stack([reference.sweep(c_a[i], ok_a[i], GRID) - reference.sweep(c_b[i], ok_a[i], GRID)
                for i in idx])[:, :, 2]  # CWSA
  np.testing.assert_allclose(r.low.cwsa, quantiles(d)[0], atol=2 * ATOL)
  np.testing.assert_allclose(r.high.cwsa, quantiles(d)[1], atol=2 * ATOL)


@pytest.mark.parametrize("fn, generic", [
    (functools.partial(ece, num_bins=10, norm="l2"), lambda c, k: ece(c, k, num_bins=10, norm="l2")),
    (functools.partial(sweep, thresholds=GRID), SWEEP)])
def test_paired_bootstrap_buckets_each_model_once(fn, generic):
  # The forms bootstrap_ci buckets once: the same differences, intervals and p-values as the
  # generic path (to float32 rounding), exact zeros for identical models, and a graded model
  # beside a boolean one (the sweep: two layouts) or the generic path (the ECE).
  from cwsa_jax._bootstrap import _fast_forms
  c_a, ok_a = data(seed=12)
  c_b = np.clip(c_a + np.random.default_rng(13).normal(0, 0.1, N), 0, 1).astype(np.float32)
  ok_b = ok_a.copy()
  ok_b[:30] = ~ok_b[:30]
  assert _fast_forms._fast_form(fn, jnp.asarray(c_a), jnp.asarray(ok_a)) is not None
  fast = paired_bootstrap(fn, c_a, ok_a, c_b, ok_b, key=KEY, num_resamples=B)
  slow = paired_bootstrap(generic, c_a, ok_a, c_b, ok_b, key=KEY, num_resamples=B)
  for name in ("estimate_a", "estimate_b", "difference", "low", "high"):
    for x, y in zip(jax.tree.leaves(getattr(fast, name)), jax.tree.leaves(getattr(slow, name))):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-7, atol=1e-7, err_msg=name)
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(fast.p_value)[-1]),
                             np.asarray(jax.tree.leaves(slow.p_value)[-1]), rtol=1e-6)
  same = paired_bootstrap(fn, c_a, ok_a, c_a, ok_a, key=KEY, num_resamples=B)
  for name in ("difference", "low", "high"):
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(getattr(same, name)))
  assert all(np.all(np.asarray(x) == 1) for x in jax.tree.leaves(same.p_value))
  graded = ok_b * np.float32(0.75)
  mixed, mixed_slow = (paired_bootstrap(f, c_a, ok_a, c_b, graded, key=KEY, num_resamples=B)
                       for f in (fn, generic))
  for x, y in zip(jax.tree.leaves(mixed.low), jax.tree.leaves(mixed_slow.low)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-7, atol=1e-7)


# --- validation -----------------------------------------------------------------------------

C4 = np.array([0.9, 0.2, 0.7, 0.4], np.float32)
OK4 = np.array([1, 0, 1, 1])


@pytest.mark.parametrize("kwargs, match", [
    ({"level": 0.0}, "level"), ({"level": 1.0}, "level"), ({"level": float("nan")}, "level"),
    ({"level": "high"}, "level"), ({"num_resamples": 0}, "num_resamples"),
    ({"num_resamples": 2.5}, "num_resamples"), ({"num_resamples": True}, "num_resamples"),
    ({"chunk_size": 0}, "chunk_size"), ({"key": 0}, "key"),
    ({"key": np.zeros(3, np.uint32)}, "key"),
    ({"key": jax.random.split(jax.random.key(0), 2)}, "single PRNG key"),
])
def test_bad_arguments_raise(kwargs, match):
  args = {"key": KEY, "num_resamples": 10, **kwargs}
  with pytest.raises(ValueError, match=match):
    bootstrap_ci(CWSA_05, C4, OK4, **args)


@pytest.mark.parametrize("c, ok, match", [
    (C4 * 2, OK4, r"\[0, 1\]"), (np.array([0.1, np.nan, 0.3, 0.4]), OK4, "NaN"),
    (C4, OK4[:3], "same shape"), (C4[None], OK4[None], "1-D"), (C4[:0], OK4[:0], "empty"),
    (C4, np.array([0, 2, 1, 1]), "0/1"), ("abc", OK4, "numeric"),
])
def test_bad_data_raises(c, ok, match):
  with pytest.raises(ValueError, match=match):
    bootstrap_ci(CWSA_05, c, ok, key=KEY, num_resamples=10)


def test_bad_paired_inputs_and_fn_raise():
  with pytest.raises(ValueError, match="same samples"):
    paired_bootstrap(CWSA_05, C4, OK4, C4[:3], OK4[:3], key=KEY)
  with pytest.raises(ValueError, match="model b"):
    paired_bootstrap(CWSA_05, C4, OK4, C4 + 1, OK4, key=KEY)
  with pytest.raises(ValueError, match="correct_a"):
    paired_bootstrap(CWSA_05, C4, OK4 * 3, C4, OK4, key=KEY)
  with pytest.raises(ValueError, match="fn"):
    bootstrap_ci(0.5, C4, OK4, key=KEY)


# --- the sweep's fast path ------------------------------------------------------------------

SWEEP_ALL = lambda c, k: sweep(c, k, GRID, normalize="all")  # noqa: E731


@pytest.mark.parametrize("graded", [False, True])
def test_bootstrap_sweep_equals_generic_bootstrap_of_sweep(graded):
  c, ok = data(graded=graded)
  fast = bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B)
  generic = bootstrap_ci(SWEEP, c, ok, key=KEY, num_resamples=B)
  for part in ("estimate", "low", "high"):
    for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
      np.testing.assert_allclose(np.asarray(getattr(getattr(fast, part), f)),
                                 np.asarray(getattr(getattr(generic, part), f)), atol=1e-7,
                                 err_msg=f"{part}.{f}")


def _ece_samples(fn, c, ok, num):
  """The resampled values of ``bootstrap_ci(fn, ...)``'s path for the first ``num`` resamples."""
  from cwsa_jax._bootstrap import _api, _fast_forms
  form = _fast_forms._fast_form(fn, jnp.asarray(c), jnp.asarray(ok))
  if form is None:
    return np.asarray(_api._block_jit(fn, jnp.asarray(c), jnp.asarray(ok), KEY,
                                      jnp.uint32(0), 1, num))
  return np.asarray(_fast_forms._fast_block_jit(form, KEY, jnp.uint32(0), 1, num))


@pytest.mark.parametrize("options", [{}, {"num_bins": 10, "norm": "l2"},
                                     {"num_bins": 64, "norm": "max", "binning": "width"}])
def test_bootstrap_ci_of_ece_buckets_once_with_the_same_values(options):
  # Confidences on bin edges, at 0 and 1, and ties: the packed path bins as ece does.
  c, ok = data()
  c = c.copy()
  c[:6] = [0.0, 1.0, 0.1, 0.2, 0.5, 1.0 / 15.0]
  fn = functools.partial(ece, **options)
  generic = lambda a, b: ece(a, b, **options)  # noqa: E731
  from cwsa_jax._bootstrap import _fast_forms
  assert _fast_forms._ece_options(fn) is not None and _fast_forms._ece_options(generic) is None
  np.testing.assert_array_equal(_ece_samples(fn, c, ok, 40), _ece_samples(generic, c, ok, 40))
  idx = np.asarray(_resample_indices(KEY, N, 40))
  want = [reference.ece(c[i], ok[i], options.get("num_bins", 15), options.get("norm", "l1"))
          for i in idx]
  np.testing.assert_allclose(_ece_samples(fn, c, ok, 40), want, rtol=1e-6, atol=1e-7)
  fast, slow = (bootstrap_ci(f, c, ok, key=KEY, num_resamples=B) for f in (fn, generic))
  for x, y in zip(fast, slow):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  if not options:  # ece itself, not a partial
    np.testing.assert_array_equal(np.asarray(bootstrap_ci(ece, c, ok, key=KEY, num_resamples=B)),
                                  np.asarray(fast))


@pytest.mark.parametrize("fn", [functools.partial(ece, binning="mass"),
                                functools.partial(ece, num_bins=65),
                                functools.partial(ece, 0.5)])
def test_bootstrap_ci_of_other_ece_forms_takes_the_generic_path(fn):
  from cwsa_jax._bootstrap import _fast_forms
  assert _fast_forms._ece_options(fn) is None
  c, ok = data()
  if fn.args:  # a positional partial: not recognised, and fails as ece would
    with pytest.raises(TypeError):
      bootstrap_ci(fn, c, ok, key=KEY, num_resamples=5)
    return
  r = bootstrap_ci(fn, c, ok, key=KEY, num_resamples=20)
  assert np.isfinite(float(r.low)) and float(r.low) <= float(r.high)


def test_bootstrap_ci_of_ece_with_graded_correctness_and_bad_options():
  c, ok = data(graded=True)
  fn = functools.partial(ece, num_bins=8)
  generic = lambda a, b: ece(a, b, num_bins=8)  # noqa: E731
  for x, y in zip(bootstrap_ci(fn, c, ok, key=KEY, num_resamples=30),
                  bootstrap_ci(generic, c, ok, key=KEY, num_resamples=30)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  c, ok = data()
  with pytest.raises(ValueError, match="num_bins"):
    bootstrap_ci(functools.partial(ece, num_bins=0), c, ok, key=KEY, num_resamples=5)
  with pytest.raises(ValueError, match="norm"):
    bootstrap_ci(functools.partial(ece, norm="l3"), c, ok, key=KEY, num_resamples=5)


@pytest.mark.parametrize("graded,normalize", [(False, "retained"), (False, "all"),
                                               (True, "retained")])
def test_bootstrap_ci_of_a_sweep_partial_buckets_once(graded, normalize):
  # A keyword-only partial of sweep takes bootstrap_sweep's path: the same intervals as
  # bootstrap_sweep bit for bit, and as the generic path and the sweep itself to float32
  # rounding (compiled with constant thresholds, a division may round an ulp apart).
  from cwsa_jax._bootstrap import _fast_forms
  c, ok = data(graded=graded)
  fn = functools.partial(sweep, thresholds=GRID, normalize=normalize)
  generic = lambda a, b: sweep(a, b, GRID, normalize=normalize)  # noqa: E731
  assert _fast_forms._sweep_options(fn) is not None and _fast_forms._sweep_options(generic) is None
  got = bootstrap_ci(fn, c, ok, key=KEY, num_resamples=B)
  fast = bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B, normalize=normalize)
  slow = bootstrap_ci(generic, c, ok, key=KEY, num_resamples=B)
  direct = sweep(c, ok, GRID, normalize=normalize)
  for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
    np.testing.assert_allclose(getattr(got.estimate, f), getattr(direct, f), rtol=2e-7, atol=1e-7)
    for part in ("low", "high"):
      x = np.asarray(getattr(getattr(got, part), f))
      np.testing.assert_array_equal(x, getattr(getattr(fast, part), f), err_msg=f"{part}.{f}")
      np.testing.assert_allclose(x, getattr(getattr(slow, part), f), rtol=2e-7, atol=1e-7,
                                 err_msg=f"{part}.{f}")


def test_bootstrap_ci_of_other_sweep_forms():
  from cwsa_jax._bootstrap import _fast_forms
  c, ok = data()
  for fn in (sweep, functools.partial(sweep, normalize="all"),
             functools.partial(sweep, thresholds=GRID, bogus=1)):
    assert _fast_forms._sweep_options(fn) is None
    with pytest.raises(TypeError):  # fails as the sweep itself would
      bootstrap_ci(fn, c, ok, key=KEY, num_resamples=5)
  with pytest.raises(ValueError, match="threshold"):
    bootstrap_ci(functools.partial(sweep, thresholds=[0.5, 1.5]), c, ok, key=KEY,
                 num_resamples=5)
  with pytest.raises(ValueError, match="normalize"):
    bootstrap_ci(functools.partial(sweep, thresholds=GRID, normalize="bogus"), c, ok, key=KEY,
                 num_resamples=5)


@pytest.mark.parametrize("fn, generic", [
    (aurc, lambda c, k: aurc(c, k)),
    (functools.partial(augrc, convention="trapezoid"),
     lambda c, k: augrc(c, k, convention="trapezoid")),
    (eaurc, lambda c, k: eaurc(c, k)),
    (risk_coverage_summary, lambda c, k: risk_coverage_summary(c, k))])
def test_bootstrap_ci_of_an_area_sorts_once(fn, generic):
  # The areas (and their summary) come from one sort and each resample's multiplicities:
  # the generic path's resamples and values to float32 rounding, ties included.
  from cwsa_jax._bootstrap import _engine
  c, ok = data(seed=14)
  c[: N // 4] = np.round(c[: N // 4], 2)
  assert _engine._area_options(fn, jnp.asarray(ok)) is not None
  assert _engine._area_options(generic, jnp.asarray(ok)) is None
  fast = bootstrap_ci(fn, c, ok, key=KEY, num_resamples=B)
  slow = bootstrap_ci(generic, c, ok, key=KEY, num_resamples=B)
  assert jax.tree.structure(fast) == jax.tree.structure(slow)
  for x, y in zip(jax.tree.leaves(fast), jax.tree.leaves(slow)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn, generic", [
    (aurc, lambda c, k: aurc(c, k)),
    (functools.partial(risk_coverage_summary, convention="trapezoid"),
     lambda c, k: risk_coverage_summary(c, k, convention="trapezoid"))])
def test_paired_bootstrap_of_an_area_sorts_each_model_once(fn, generic):
  c_a, ok_a = data(seed=16)
  c_a[: N // 4] = np.round(c_a[: N // 4], 2)
  c_b = np.clip(c_a + np.random.default_rng(17).normal(0, 0.1, N), 0, 1).astype(np.float32)
  fast = paired_bootstrap(fn, c_a, ok_a, c_b, ok_a, key=KEY, num_resamples=B)
  slow = paired_bootstrap(generic, c_a, ok_a, c_b, ok_a, key=KEY, num_resamples=B)
  assert jax.tree.structure(fast) == jax.tree.structure(slow)
  for name in ("estimate_a", "estimate_b", "difference", "low", "high"):
    for x, y in zip(jax.tree.leaves(getattr(fast, name)), jax.tree.leaves(getattr(slow, name))):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7, err_msg=name)
  same = paired_bootstrap(fn, c_a, ok_a, c_a, ok_a, key=KEY, num_resamples=B)
  for name in ("difference", "low", "high"):
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(getattr(same, name)))
  assert all(np.all(np.asarray(x) == 1) for x in jax.tree.leaves(same.p_value))


def test_bootstrap_ci_of_other_area_forms_takes_the_generic_path():
  from cwsa_jax._bootstrap import _engine
  c, ok = data(seed=15)
  published = functools.partial(aurc, convention="published_code")
  for fn, k in ((published, ok), (aurc, ok * np.float32(0.5)), (functools.partial(aurc, 1), ok)):
    assert _engine._area_options(fn, jnp.asarray(k)) is None
  r = bootstrap_ci(published, c, ok, key=KEY, num_resamples=20)
  assert float(r.low) <= float(r.estimate) <= float(r.high)
  with pytest.raises(ValueError, match="convention"):
    bootstrap_ci(functools.partial(aurc, convention="bogus"), c, ok, key=KEY, num_resamples=5)


@jax.jit
def _bucket_sums_three_ways(c, ok, grid):
  """The sweep's bucket sums, and those of the packed words, alone and vmapped."""
  from cwsa_jax import _sweep
  sorted_t = _sweep.sorted_thresholds(grid)[1]
  buckets = _sweep.bucket_ids(c, sorted_t)
  words = _sweep.pack_samples(c, ok, buckets)
  packed = lambda w: _sweep.packed_bucket_sums(w, grid.shape[0] + 1)  # noqa: E731
  vmapped = jax.tree.map(lambda x: x[0], jax.vmap(packed)(words[None]))
  return _sweep.bucket_sums(c, ok, sorted_t, buckets=buckets), packed(words), vmapped


@pytest.mark.parametrize("shape", [(N,), (3, N), (2, 2**18 + 100)])
def test_packed_bucket_sums_equal_bucket_sums_bit_for_bit(shape):
  # bootstrap_sweep's packed words (segment and 1 - c in one int32): the same exact sums as
  # the sweep's own, for one row, rows of one chunk (one table each) and rows longer than a
  # chunk (flattened); c at 0, 1, tiny values and on the thresholds; 63 thresholds, the most.
  from cwsa_jax import _sweep
  rng = np.random.default_rng(sum(shape))
  grid = np.sort(rng.uniform(0, 1, 63)).astype(np.float32)
  c = rng.uniform(0, 1, shape).astype(np.float32)
  c.flat[:6] = [0.0, 1.0, 1e-30, 3e-8, grid[0], grid[-1]]
  ok = rng.uniform(size=shape) < c
  want, *got = _bucket_sums_three_ways(c, ok, grid)
  for hi_lo in got:
    np.testing.assert_array_equal(np.asarray(hi_lo[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(hi_lo[1]), np.asarray(want[1]))
  with pytest.raises(ValueError, match="at most 64 buckets"):
    _sweep.packed_bucket_sums(jnp.zeros(3, jnp.int32), 65)


def test_bootstrap_sweep_normalize_all_is_applied_per_resample():
  c, ok = data(seed=3)
  fast = bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B, normalize="all")
  generic = bootstrap_ci(SWEEP_ALL, c, ok, key=KEY, num_resamples=B)
  np.testing.assert_allclose(np.asarray(fast.low.cwsa), np.asarray(generic.low.cwsa), atol=1e-7)
  np.testing.assert_allclose(np.asarray(fast.high.cwsa), np.asarray(generic.high.cwsa), atol=1e-7)
  with pytest.raises(ValueError, match="normalize"):
    bootstrap_sweep(c, ok, GRID, key=KEY, normalize="bogus")
  with pytest.raises(ValueError, match="thresholds"):
    bootstrap_sweep(c, ok, [1.5], key=KEY)


# --- every metric of the evaluation report from one sort --------------------------------------

def _report_reference(c, k, *, convention, norm, num_bins=10):
  """float64 accuracy, ECE, AURC, E-AURC, AUGRC and the sweep [T, 4] at GRID, flattened as
  the evaluation bootstrap's fields."""
  s = reference.sweep(c, k, GRID)  # [T, 4]
  return np.concatenate([
      [np.mean(k), reference.ece(c, k, num_bins=num_bins, norm=norm),
       reference.aurc(c, k, convention), reference.eaurc(c, k, convention),
       reference.aurc(c, k, convention, generalized=True)], s.T.reshape(-1)])


@pytest.mark.parametrize("convention, norm", [("step", "l1"), ("trapezoid", "l2"), ("step", "max")])
def test_bootstrap_evaluation_matches_float64_references(convention, norm):
  """Same resamples as bootstrap_ci; the sweep, ECE, accuracy, AURC family of each resample
  from one sort (ties included, unsorted input)."""
  from cwsa_jax._bootstrap import EvaluationMetrics, bootstrap_evaluation
  c, ok = data(seed=6)
  c[: N // 4] = np.round(c[: N // 4], 2)  # tie groups, some of them at thresholds and bin edges
  r = bootstrap_evaluation(c, ok, GRID, key=KEY, num_resamples=B, num_bins=10, ece_norm=norm,
                           aurc_convention=convention)
  assert isinstance(r.low, EvaluationMetrics)
  idx = np.asarray(_resample_indices(KEY, N, B))
  ref = functools.partial(_report_reference, convention=convention, norm=norm)
  want = np.stack([ref(c[i], ok[i]) for i in idx])
  flat = lambda m: np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in m])  # noqa: E731
  np.testing.assert_allclose(flat(r.estimate), ref(c, ok), atol=ATOL, rtol=0, equal_nan=True)
  low, high = quantiles(want)
  np.testing.assert_allclose(flat(r.low), low, atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(flat(r.high), high, atol=ATOL, rtol=0, equal_nan=True)


@pytest.mark.parametrize("convention, norm", [("step", "l1"), ("trapezoid", "max")])
def test_bootstrap_evaluation_poisson_matches_float64_references(convention, norm):
  """Poisson resampling: each resample is the data with row i repeated m_bi times."""
  from cwsa_jax._bootstrap import bootstrap_evaluation
  from cwsa_jax._bootstrap._sampler import _poisson_multiplicities
  c, ok = data(seed=8)
  c[: N // 4] = np.round(c[: N // 4], 2)
  r = bootstrap_evaluation(c, ok, GRID, key=KEY, num_resamples=B, num_bins=10, ece_norm=norm,
                           aurc_convention=convention, resampling="poisson")
  m = np.asarray(_poisson_multiplicities(KEY, np.arange(N), B))
  assert len(set(m.sum(axis=1))) > 1  # the resample size varies
  ref = functools.partial(_report_reference, convention=convention, norm=norm)
  want = np.stack([ref(np.repeat(c, mi), np.repeat(ok, mi)) for mi in m])
  flat = lambda x: np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in x])  # noqa: E731
  np.testing.assert_allclose(flat(r.estimate), ref(c, ok), atol=ATOL, rtol=0, equal_nan=True)
  low, high = quantiles(want)
  np.testing.assert_allclose(flat(r.low), low, atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(flat(r.high), high, atol=ATOL, rtol=0, equal_nan=True)


@pytest.mark.parametrize("resampling", ["multinomial", "poisson"])
def test_paired_evaluation_matches_float64_references(resampling):
  """Both models get the same resamples (the indices of paired_bootstrap, or the same Poisson
  multiplicity per row); each resample's differences, their interval and p-value."""
  from cwsa_jax._bootstrap import EvaluationMetrics, paired_evaluation
  from cwsa_jax._bootstrap._sampler import _poisson_multiplicities
  c, ok = data(seed=11)
  c[: N // 4] = np.round(c[: N // 4], 2)  # ties
  c_b = np.clip(c + np.where(ok, 0.3, -0.3), 0, 1).astype(np.float32)  # ranks better
  ok_b = ok.copy()
  ok_b[:40] = ~ok_b[:40]
  r = paired_evaluation(c, ok, c_b, ok_b, GRID, key=KEY, num_resamples=B, num_bins=10,
                        resampling=resampling)
  assert isinstance(r.difference, EvaluationMetrics)
  ref = functools.partial(_report_reference, convention="step", norm="l1")
  if resampling == "multinomial":
    pick = [lambda x, i=i: x[i] for i in np.asarray(_resample_indices(KEY, N, B))]
  else:
    pick = [lambda x, m=m: np.repeat(x, m) for m in np.asarray(_poisson_multiplicities(KEY, np.arange(N), B))]
  d = np.stack([ref(f(c), f(ok)) - ref(f(c_b), f(ok_b)) for f in pick])
  flat = lambda x: np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in x])  # noqa: E731
  np.testing.assert_allclose(flat(r.estimate_a), ref(c, ok), atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(flat(r.estimate_b), ref(c_b, ok_b), atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(flat(r.difference), ref(c, ok) - ref(c_b, ok_b), atol=ATOL, rtol=0,
                             equal_nan=True)
  low, high = quantiles(d)
  np.testing.assert_allclose(flat(r.low), low, atol=ATOL, rtol=0, equal_nan=True)
  np.testing.assert_allclose(flat(r.high), high, atol=ATOL, rtol=0, equal_nan=True)
  valid = ~np.isnan(d)
  count = lambda x: np.sum(valid & x, axis=0)  # noqa: E731
  p = np.minimum(1, 2 * np.minimum(1 + count(d <= 0), 1 + count(d >= 0)) / (1 + valid.sum(0)))
  clear = np.all(np.abs(d) > 1e-5, axis=0) | np.all(d == 0, axis=0)  # no sign left to rounding
  np.testing.assert_allclose(flat(r.p_value)[clear], p[clear], rtol=1e-6)
  assert np.any(clear & (p < 0.05)) and np.any(clear & (p > 0.5))  # both kinds checked
  # One model against itself: every difference exactly 0, p = 1.
  same = paired_evaluation(c, ok, c, ok, GRID, key=KEY, num_resamples=B, resampling=resampling)
  assert np.all(flat(same.difference) == 0) and np.all(flat(same.low) == 0)
  assert np.all(flat(same.p_value)[~np.isnan(flat(same.p_value))] == 1)
  with pytest.raises(ValueError, match="same samples"):
    paired_evaluation(c, ok, c_b[:-1], ok_b[:-1], GRID, key=KEY, resampling=resampling)
  with pytest.raises(ValueError, match="boolean"):
    paired_evaluation(c, ok, c_b, ok_b * 0.5, GRID, key=KEY, resampling=resampling)


def test_harmonic_difference_against_float64_sums():
  from cwsa_jax._areas import harmonic_difference
  worst = 0.0
  for n in (0, 1, 7, 8, 9, 400, 123_457, 2_000_000, 33_000_000):
    for r in {r for r in (0, 1, 3, 7, 8, 9, n // 2, n - 100, n - 1, n) if 0 <= r <= n}:
      want = np.sum(1.0 / np.arange(r + 1, n + 1, dtype=np.float64))
      got = float(harmonic_difference(jnp.int32(r), jnp.int32(n)))
      assert abs(got - want) <= 1e-6 * want + 1e-7, (n, r, got, want)
      worst = max(worst, abs(got - want) / max(want, 1e-30))
  assert worst > 0  # float32: not the float64 sums themselves


def test_poisson_multiplicities_are_poisson_and_depend_on_the_row_only():
  from cwsa_jax._bootstrap._sampler import _poisson_multiplicities
  rows = np.arange(20_000)
  m = np.asarray(_poisson_multiplicities(KEY, rows, 10))
  assert m.dtype == np.int32 and m.min() >= 0 and m.max() <= 12
  # Frequencies of 0..5 against the Poisson(1) pmf, within 5 binomial sd.
  counts = np.bincount(m.ravel(), minlength=13)[:6]
  pmf = np.exp(-1.0) / np.array([1, 1, 2, 6, 24, 120], np.float64)
  sd = np.sqrt(m.size * pmf * (1 - pmf))
  assert np.all(np.abs(counts - m.size * pmf) < 5 * sd), (counts, m.size * pmf)
  # Rows are independent across resamples and rows: correlation of neighbours near 0.
  assert abs(np.corrcoef(m[:, :-1].ravel(), m[:, 1:].ravel())[0, 1]) < 0.01
  assert abs(np.corrcoef(m[:-1].ravel(), m[1:].ravel())[0, 1]) < 0.01
  # A shard's multiplicities are those of its rows in the whole file.
  np.testing.assert_array_equal(
      np.asarray(_poisson_multiplicities(KEY, rows[7000:9000], 10)), m[:, 7000:9000])
  with pytest.raises(ValueError, match="row numbers"):
    _poisson_multiplicities(KEY, np.array([-1, 2]), 3)


@pytest.mark.slow
def test_bootstrap_evaluation_poisson_coverage_of_known_population_values():
  # As test_coverage_of_known_population_values: c ~ U[0, 1], correct ~ Bernoulli(c) gives
  # accuracy 1/2, CWSA and selective accuracy at 0.5 of 1/3 and 3/4, and step AURC
  # int_0^1 q/2 dq = 1/4 (risk q/2 at coverage q), up to its O(1/n) bias.
  from cwsa_jax._bootstrap import bootstrap_evaluation
  truth = np.array([0.5, 1.0 / 3.0, 0.75, 0.25])
  reps, rng = 120, np.random.default_rng(13)
  grid = np.array([0.5], np.float32)
  covered = []
  for i in range(reps):
    c = rng.uniform(0.0, 1.0, N).astype(np.float32)
    ok = rng.uniform(size=N) < c
    r = bootstrap_evaluation(c, ok, grid, key=jax.random.key(i), num_resamples=500,
                             resampling="poisson")
    pick = lambda x: np.array([x.accuracy, x.cwsa[0], x.selective_accuracy[0], x.aurc])  # noqa: E731
    covered.append((pick(r.low) <= truth) & (truth <= pick(r.high)))
  covered = np.mean(covered, axis=0)
  # 95% nominal; binomial sd over 120 replicates is 0.02.
  assert np.all((0.88 <= covered) & (covered <= 0.995)), covered


@pytest.mark.parametrize("convention, n", [
    pytest.param("step", 70_000, marks=pytest.mark.slow), ("trapezoid", 20_000)])
def test_streamed_evaluation_bootstrap_equals_the_in_memory_poisson_one(convention, n):
  """Ranges of confidence (ties at range ends; at n = 70000 one range larger than the
  padding unit of 65536 rows: two compilations) with global row numbers: the in-memory
  intervals."""
  from cwsa_jax._bootstrap import StreamedEvaluationBootstrap, bootstrap_evaluation
  c, ok = data(n=n, seed=9)
  c[: n // 5] = np.round(c[: n // 5], 2)
  want = bootstrap_evaluation(c, ok, GRID, key=KEY, num_resamples=B, num_bins=10,
                              aurc_convention=convention, resampling="poisson")
  boot = StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B, num_bins=10,
                                     aurc_convention=convention)
  edges = [2.0, 0.95, 0.01, -1.0]  # 0.95 is a tie value of the rounded samples
  for hi, lo in zip(edges[:-1], edges[1:]):
    rows = np.flatnonzero((c < hi) & (c >= lo))
    boot.add_range(c[rows], ok[rows], rows)
  assert boot.num_samples == n
  got = boot.result(level=0.95)
  for part in ("estimate", "low", "high"):
    for name, x, y in zip(want.low._fields, getattr(want, part), getattr(got, part)):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=3e-7, rtol=0,
                                 err_msg=f"{part} {name}")


def test_streamed_evaluation_bootstrap_refuses_bad_ranges():
  from cwsa_jax._bootstrap import StreamedEvaluationBootstrap
  c, ok = data(seed=10)
  boot = StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B)
  with pytest.raises(ValueError, match="no samples"):
    boot.result()
  high = c >= 0.5
  boot.add_range(c[high], ok[high], np.flatnonzero(high))
  with pytest.raises(ValueError, match="decreasing confidence"):
    boot.add_range(c, ok, np.arange(N))
  with pytest.raises(ValueError, match="row numbers"):
    boot.add_range(c[~high], ok[~high], np.arange(3))
  boot.add_range(c[:0], ok[:0], np.arange(0))  # an empty range adds nothing
  assert boot.num_samples == int(high.sum())
  with pytest.raises(ValueError, match="confidences"):
    boot.add_range(np.array([np.nan], np.float32), np.array([True]), np.array([0]))
  with pytest.raises(ValueError, match="aurc_convention"):
    StreamedEvaluationBootstrap(GRID, key=KEY, aurc_convention="published_code")


@pytest.mark.parametrize("n", [N, 2637])  # 2637: whole blocks of 1024 samples and a tail
def test_bootstrap_evaluation_sweep_equals_bootstrap_sweep(n):
  from cwsa_jax._bootstrap import bootstrap_evaluation
  c, ok = data(n=n, seed=7)
  c[::7] = GRID[np.arange(0, n, 7) % GRID.size]  # samples exactly at the thresholds
  r = bootstrap_evaluation(c, ok, GRID, key=KEY, num_resamples=B, normalize="all")
  fast = bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B, normalize="all")
  for part in ("estimate", "low", "high"):
    for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
      np.testing.assert_allclose(np.asarray(getattr(getattr(r, part), f)),
                                 np.asarray(getattr(getattr(fast, part), f)), atol=1e-7)
  with pytest.raises(ValueError, match="aurc_convention"):
    bootstrap_evaluation(c, ok, GRID, key=KEY, aurc_convention="published_code")
  with pytest.raises(ValueError, match="boolean"):
    bootstrap_evaluation(c, ok.astype(np.float32) * 0.5, GRID, key=KEY)
  with pytest.raises(ValueError, match="resampling"):
    bootstrap_evaluation(c, ok, GRID, key=KEY, resampling="bayesian")


def test_a_repeated_call_lowers_no_program():
  """The host steps around the jitted blocks (checks, threshold order) are cached too: the
  same call again lowers nothing (an eager ``lax.cond`` of local branches once retraced and
  compiled on every call)."""
  from cwsa_jax._bootstrap import StreamedEvaluationBootstrap, bootstrap_evaluation
  c, ok = data(seed=12)
  calls = [lambda: bootstrap_evaluation(c, ok, GRID, key=KEY, num_resamples=B),
           lambda: bootstrap_ci(aurc, c, ok, key=KEY, num_resamples=B),
           lambda: bootstrap_sweep(c, ok, GRID, key=KEY, num_resamples=B),
           lambda: paired_bootstrap(ece, c, ok, c[::-1].copy(), ok, key=KEY, num_resamples=B),
           lambda: StreamedEvaluationBootstrap(GRID, key=KEY, num_resamples=B)]
  lowered = []

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      lowered.append(event)

  for call in calls:
    jax.block_until_ready(call())
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for call in calls:
      jax.block_until_ready(call())
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not lowered


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_area_prefix_form_equals_the_loop_across_ranges(convention):
  """The accelerators' area scan (prefix sums) gives the CPU loop's carry: the same integers and
  the areas to float32 rounding, over ranges chained by the carry, with zero multiplicities,
  tie groups crossing the ranges and ranges without a group end."""
  import functools
  from cwsa_jax._bootstrap import _area_scan as bs
  rng = np.random.default_rng(23)
  n = 5000
  group_end = rng.random(n) < 0.3
  group_end[2000:2600] = False  # one long group, across a range border
  group_end[-1] = True
  correct = rng.random(n) < 0.7
  loop = jax.jit(functools.partial(bs._area_loop, convention=convention))
  prefix = jax.jit(functools.partial(bs._area_prefix, convention=convention))
  for m in (rng.poisson(1.0, n), np.where(rng.random(n) < 0.5, 0, rng.integers(1, 4, n)),
            np.ones(n, int)):
    m = jnp.asarray(m.astype(np.int8))
    a = b = bs._area_carry_zero()
    for lo, hi in ((0, 1000), (1000, 2300), (2300, 2500), (2500, n)):
      args = (m[lo:hi], jnp.asarray(correct[lo:hi]), jnp.asarray(group_end[lo:hi]))
      a, b = loop(*args, a), prefix(*args, b)
      for field in ("k", "e", "k_last", "e_last"):
        assert int(getattr(a, field)) == int(getattr(b, field)), (field, lo)
      for field in ("r_last", "area", "generalized"):
        assert float(getattr(b, field)) == pytest.approx(float(getattr(a, field)), rel=2e-6), field
    want = bs._areas_from_carry(a, convention)
    got = bs._areas_from_carry(b, convention)
    for key in want:
      assert float(got[key]) == pytest.approx(float(want[key]), rel=2e-6, abs=1e-9), key


def test_area_samples_with_the_prefix_form_equal_the_generic_path():
  """bootstrap_ci of aurc (sort once, the area scan) with the accelerators' prefix form forced:
  the generic path's resample values to float32 rounding."""
  from cwsa_jax._bootstrap import _engine, _intervals
  from recording import Recording
  rng = np.random.default_rng(29)
  c = np.round(rng.random(3000), 2).astype(np.float32)
  ok = rng.random(3000) < c
  key = jax.random.key(4)
  generic = bootstrap_ci(lambda a, b: aurc(a, b, convention="trapezoid"), c, ok, key=key,
                         num_resamples=64, level=0.5)
  forced = Recording(platform="cuda")  # the accelerators' form (no CUDA form of its own)
  samples = _engine._area_samples("aurc", "trapezoid", (c, ok), key=key, num_resamples=64,
                                  kernels=forced)
  assert forced.forms("area_scan") == {"default"}
  for x, y in zip(_intervals._interval_jit(samples, jnp.float32(0.5)), generic[1:]):
    assert float(x) == pytest.approx(float(y), rel=2e-6)
