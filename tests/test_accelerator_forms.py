"""The accelerator forms of the chunked exact sums, run on the CPU: equal to the CPU forms, bit for bit.

``cwsa_jax._exact.segment_sums`` sums more than one chunk of samples with a loop
over the chunks on CPU and with every chunk at once elsewhere (as
``_dispatch.Kernels.pick`` picks). Here the internal entry points of the metrics
are called with ``Kernels(platform="cuda")``, which runs the accelerator forms on
the CPU (the Pallas kernels through Pallas' interpreter), and every kernel built
on them must give the same integers, so the same floats, as the CPU forms.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cj
import reference
from recording import Recording
from cwsa_jax import _calibration
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _select
from cwsa_jax import _selective
from cwsa_jax import _sweep

# The Pallas interpreter is slow on the CPU: ./dev.sh test runs these in CI (see pyproject.toml).
pytestmark = pytest.mark.interpreted

DEFAULT = _dispatch.DEFAULT
INTERPRETED = _dispatch.Kernels(interpret=True)  # Pallas kernels through the interpreter


def _sweep_with(kernels, c, k, t, **options):
  return _sweep._sweep(c, k, t, kernels=kernels, **options)


def _ece_with(kernels, c, k, **options):
  return _calibration._ece(c, k, kernels=kernels, **options)


def _bins_with(kernels, c, k, **options):
  return _calibration._calibration_bins(c, k, kernels=kernels, **options)


def _leaves(result) -> list:
  return jax.tree.leaves(jax.tree.map(np.asarray, result))


def _forced_results(kernels_of, name: str, forced: Recording) -> Recording:
  """Checks the leaves of ``kernels_of(kernels)[name]()`` equal with the default kernels (the
  CPU forms here) and with ``forced``; returns ``forced`` (what it picked)."""
  want = _leaves(kernels_of(DEFAULT)[name]())
  got = _leaves(kernels_of(forced)[name]())
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  return forced


# More than two chunks of 2^18, with a ragged last one.
N = 2 * _exact.CHUNK_SIZE + 12_345
RNG = np.random.default_rng(11)
C = np.round(RNG.random(N), 3).astype(np.float32)  # ties
OK = RNG.random(N) < C
KAPPA = RNG.random(N).astype(np.float32)
GROUPS = RNG.integers(0, 5, N).astype(np.int32)
T = np.array([0.0, 0.1, 0.25, 0.25, 0.5, 0.9, 0.999], np.float32)
T_DENSE = np.linspace(0.0, 0.99, 300).astype(np.float32)
# Confidences the bucket sums leave out, and -0.0, which they keep.
INVALID_OR_EDGE = np.array([np.nan, np.inf, -np.inf, -0.5, 1.5, 1.0000001, -0.0], np.float32)


def _kernels(kernels):
  rows_c = np.stack([C[:300_000], C[-300_000:]])
  rows_ok = np.stack([OK[:300_000], OK[-300_000:]])
  sweep = functools.partial(_sweep_with, kernels)
  return {
      "sweep": lambda: sweep(C, OK, T),
      "sweep_dense_grid": lambda: sweep(C, OK, T_DENSE),
      "sweep_graded_all": lambda: sweep(C, KAPPA, T, normalize="all"),
      # sweep_by_group's exact sums (its floats are these integers, rounded once)
      "sweep_by_group": lambda: _group_sums(C, OK, GROUPS, T, kernels),
      "sweep_vmapped_rows": lambda: jax.vmap(lambda c, k: sweep(c, k, T))(rows_c, rows_ok),
      # rows of at most one chunk: chunks of whole rows, each summed into its rows' own table
      "sweep_vmapped_small_rows": lambda: jax.vmap(lambda c, k: sweep(c, k, T))(
          C[:400_000].reshape(8, -1), OK[:400_000].reshape(8, -1)),
      "ece_width": lambda: _ece_with(kernels, C, OK),
      "ece_mass_graded": lambda: _ece_with(kernels, C, KAPPA, binning="mass"),
      "calibration_bins": lambda: _bins_with(kernels, C, OK, num_bins=20),
      "bootstrap_packed_sums": lambda: _packed_sums(C, OK, T, kernels),
  }


@functools.partial(jax.jit, static_argnames=("kernels",))
def _group_sums(c, ok, groups, thresholds, kernels):
  """sweep_by_group's per-group bucket sums (``_sweep.bucket_sums`` with groups)."""
  sorted_t = _sweep.sorted_thresholds(thresholds)[1]
  return _sweep.bucket_sums(c, ok, sorted_t, groups=groups, num_groups=5, kernels=kernels)


@functools.partial(jax.jit, static_argnames=("kernels",))
def _packed_sums(c, ok, thresholds, kernels):
  """bootstrap_sweep's sums of packed words (_sweep.pack_samples)."""
  sorted_t = _sweep.sorted_thresholds(thresholds)[1]
  words = _sweep.pack_samples(c, ok, _sweep.bucket_ids(c, sorted_t))
  return _sweep.packed_bucket_sums(words, thresholds.shape[0] + 1, kernels=kernels)


@pytest.mark.parametrize("name", list(_kernels(DEFAULT)))
def test_accelerator_form_equals_cpu_form(name):
  # The accelerators' forms (the exact sums, the sorts, the eager checks); the CUDA kernels
  # that would replace the exact sums are off here (their own tests are below).
  forced = Recording(platform="cuda", dense=False, sorted_sums=False)
  # the accelerators' form (the "default" branch) and only it
  assert _forced_results(_kernels, name, forced).forms("exact") == {"default"}


def test_segment_sums_forms_agree_on_raw_columns():
  """Ids outside [0, S) are left out; the offset is the chunk's first sample in the input."""
  n, s = 3 * 1000 + 17, 7
  rng = np.random.default_rng(3)
  ids = rng.integers(-2, s + 2, n).astype(np.int32)
  values = rng.integers(0, 4094, (n, 3)).astype(np.int32)

  def columns(i, v, offset):
    position = offset + jnp.arange(i.shape[0], dtype=jnp.int32)
    return i, jnp.moveaxis(v, -1, 0) + (position % 3)[None]

  num_chunks, size = _exact.chunking(n, 1000)
  options = dict(num_segments=s, num_chunks=num_chunks, size=size, with_offset=True,
                 segments_per_entry=None)
  loop = jax.jit(lambda *a: _exact._chunk_loop(columns, *a, **options))(ids, values)
  at_once = jax.jit(lambda *a: _exact._chunks_at_once(columns, *a, **options))(ids, values)
  want = np.zeros((s, 3), np.int64)
  inside = (ids >= 0) & (ids < s)
  np.add.at(want, ids[inside], (values + (np.arange(n) % 3)[:, None])[inside])
  for hi, lo in (loop, at_once):
    assert np.all((0 <= np.asarray(lo)) & (np.asarray(lo) < 4096))
    np.testing.assert_array_equal(np.asarray(hi, np.int64) * 4096 + np.asarray(lo), want)


def _coverage_with(kernels, c, tau):
  """:func:`cwsa_jax.coverage` with these kernels."""
  return _selective._metrics(c, jnp.ones(c.shape, jnp.bool_), tau, kernels=kernels).coverage


def _dense_kernels(kernels):
  sweep = functools.partial(_sweep_with, kernels)
  ece = functools.partial(_ece_with, kernels)
  return {
      "sweep": lambda: sweep(C, OK, T),
      "sweep_default_grid": lambda: sweep(C, OK, cj.default_thresholds()),
      "sweep_unsorted_nan_threshold": lambda: jax.jit(sweep)(
          C, OK, jnp.asarray([0.7, jnp.nan, 0.2, 0.7], jnp.float32)),
      "coverage_one_threshold": lambda: _coverage_with(kernels, C, 0.5),
      "select_threshold": lambda: _select._select_threshold(C, OK, min_coverage=0.5,
                                                            kernels=kernels),
      "ece_width": lambda: ece(C, OK),
      "ece_mass": lambda: ece(C, OK, binning="mass"),
      "calibration_bins_63": lambda: _bins_with(kernels, C, OK, num_bins=63),
      "ece_vmapped": lambda: jax.vmap(ece)(C[:300_000].reshape(3, -1), OK[:300_000].reshape(3, -1)),
      # rows of samples: one launch, each row summed on its own
      "sweep_vmapped_rows": lambda: jax.vmap(lambda c, k: sweep(c, k, T))(
          C[:300_000].reshape(3, -1), OK[:300_000].reshape(3, -1)),
      "sweep_rows_of_small_n": lambda: jax.vmap(lambda c, k: sweep(c, k, T))(
          C[:1000].reshape(40, -1), OK[:1000].reshape(40, -1)),
      "sweep_graded_keeps_scatter": lambda: sweep(C, KAPPA, T),
      # the bins of the accelerators' eager check: both forms leave out the same confidences
      "bin_sums_drop_invalid": lambda: jax.jit(functools.partial(
          _calibration.bin_sums, drop_invalid=True, kernels=kernels))(
              jnp.asarray(np.concatenate([INVALID_OR_EDGE, C[:20_000]])),
              jnp.asarray(np.concatenate([np.ones(7, bool), OK[:20_000]])),
              _calibration.width_edges(15)),
      # derivatives: no tangent reaches the kernel (its sums are integers)
      "ece_gradient": lambda: jax.grad(lambda c: ece(c, OK[:5000]))(jnp.asarray(C[:5000])),
      "sweep_jacobian": lambda: jax.jacfwd(lambda c: sweep(c, OK[:500], T).cwsa)(
          jnp.asarray(C[:500])),
  }


@pytest.mark.parametrize("name", list(_dense_kernels(DEFAULT)))
def test_dense_gpu_form_equals_cpu_form(name):
  """The CUDA kernel of ``_dense`` (through Pallas' interpreter) gives the scatter path's integers."""
  # every way of building the operands (_dense.FORMS) on some of the kernels
  form = {"calibration_bins_63": "bits", "sweep_default_grid": "unrolled",
          "sweep_unsorted_nan_threshold": "bits", "sweep": "lanes", "ece_width": "lanes",
          "sweep_rows_of_small_n": "lanes", "ece_vmapped": "unrolled",
          "select_threshold": "unrolled"}.get(name, "bits")
  forced = Recording(platform="cuda", interpret=True, dense_form=form)
  dense = _forced_results(_dense_kernels, name, forced).forms("dense")
  assert dense == (set() if name == "sweep_graded_keeps_scatter" else {"cuda"})


def test_dense_bucket_sums_equal_scatter_sums_on_random_draws():
  """Random sizes, grids (ties, samples on thresholds, 0 and 1), rows, launch shapes and
  confidences NaN or outside [0, 1]:
  ``_dense.bucket_sums`` (interpreted) gives the scatter path's integers."""
  from cwsa_jax._kernels import _dense
  interpreted = _dispatch.Kernels(interpret=True)
  scatter = jax.jit(functools.partial(_sweep._bucket_sums_impl, num_groups=None, masked=False,
                                      given=False, drop_invalid=True, dense=False))
  rng = np.random.default_rng(5)
  for draw in range(2 * len(_dense.FORMS)):
    form = _dense.FORMS[draw % len(_dense.FORMS)]
    most = _dense.LANES_MAX_ROWS if form == "lanes" else _dense.MAX_BUCKETS
    rows, n, num_t = int(rng.choice([1, 3])), int(rng.integers(1, 3000)), int(rng.integers(1, most))
    c = np.round(rng.random((rows, n)), int(rng.integers(1, 4))).astype(np.float32)
    c.flat[rng.integers(0, c.size, 3)] = rng.choice([0.0, 1.0], 3)
    t = np.sort(np.concatenate([rng.choice(c.ravel(), num_t // 2),
                                rng.random(num_t - num_t // 2)]).astype(np.float32))
    ok = rng.random((rows, n)) < c
    if draw % 2:  # left out on both paths (-0.0 kept)
      c.flat[rng.integers(0, c.size, 4)] = rng.choice(INVALID_OR_EDGE, 4)
    # 512 samples per step: "unrolled" loads them 128 at a time (4 loads per step)
    dense = _dense.bucket_sums(jnp.asarray(c), jnp.asarray(ok), jnp.asarray(t), unit=True,
                               kernels=interpreted, form=form, block=int(rng.choice([128, 512])),
                               per_program=int(rng.choice([128, 512, 1 << 16])))
    want = scatter(jnp.asarray(c), jnp.asarray(ok), jnp.asarray(t))
    for a, b in zip(dense, want):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"draw {draw}")


T_MANY = np.concatenate([np.linspace(0.0, 0.99, 99), [0.5, 0.5]]).astype(np.float32)


def _sorted_kernels(kernels):
  sweep = functools.partial(_sweep_with, kernels)
  return {
      "sweep_65": lambda: sweep(C, OK, np.linspace(0.3, 0.95, 65).astype(np.float32)),
      "sweep_dense_grid": lambda: sweep(C, OK, T_DENSE),
      "sweep_ties_unsorted_nan": lambda: jax.jit(sweep)(
          C, OK, jnp.asarray(np.concatenate([T_MANY[::-1], [np.nan, 1.5, -0.5]]))),
      "select_threshold": lambda: _select._select_threshold(C, OK, thresholds=T_MANY,
                                                            min_coverage=0.5, kernels=kernels),
      "sweep_jacobian": lambda: jax.jacfwd(lambda c: sweep(c, OK[:300], T_MANY).cwsa)(
          jnp.asarray(C[:300])),
      "sweep_vmapped_keeps_scatter": lambda: jax.vmap(lambda c, k: sweep(c, k, T_MANY))(
          C[:300_000].reshape(3, -1), OK[:300_000].reshape(3, -1)),
  }


@pytest.mark.parametrize("name", list(_sorted_kernels(DEFAULT)))
def test_sorted_gpu_form_equals_cpu_form(name):
  """The CUDA form of ``_sorted_sums`` (one sort, prefix sums) gives the scatter path's integers."""
  forced = _forced_results(_sorted_kernels, name, Recording(platform="cuda", dense=False))
  # (vmapped: custom_vmap also traces the unbatched form, which is then not run)
  assert forced.forms("sorted_sums") == {"cuda"} or name == "sweep_vmapped_keeps_scatter"


def test_sorted_bucket_sums_equal_scatter_sums_on_random_draws():
  """Sizes around the 4096-sample chunks, ties, samples on thresholds, thresholds outside [0, 1],
  confidences NaN or outside [0, 1]."""
  import functools
  from cwsa_jax._kernels import _sorted_sums
  scatter = jax.jit(functools.partial(_sweep._bucket_sums_impl, num_groups=None, masked=False,
                                      given=False, drop_invalid=True, dense=False))
  rng = np.random.default_rng(9)
  for n in (1, 5, 4095, 4096, 4097, 3 * 4096 + 17):
    num_t = int(rng.integers(65, 300))
    c = np.round(rng.random(n), int(rng.integers(1, 4))).astype(np.float32)
    c[:2] = [0.0, 1.0][:min(2, n)]
    t = np.concatenate([rng.choice(c, num_t // 2), rng.random(num_t - num_t // 2 - 3),
                        [-0.5, 1.0, np.inf]]).astype(np.float32)
    t = np.sort(t)
    ok = rng.random(n) < c
    if n > 5:  # left out on both paths (-0.0 kept)
      c[rng.integers(0, n, 5)] = rng.choice(INVALID_OR_EDGE, 5)
    got = jax.jit(_sorted_sums.bucket_sums)(c, ok, t)
    for a, b in zip(got, scatter(jnp.asarray(c), jnp.asarray(ok), jnp.asarray(t))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"n = {n}")


def test_mass_binned_ece_cuda_form_equals_cpu_form():
  """Equal-mass edges by one sort (the CUDA form of ``_sort.order_statistics``): the same bins."""
  def kernels_of(kernels):
    return {"mass": lambda: (_ece_with(kernels, C, OK, binning="mass"),
                             _bins_with(kernels, C, KAPPA, binning="mass", num_bins=20))}

  forced = _forced_results(kernels_of, "mass", Recording(platform="cuda", dense=False))
  assert forced.forms("select") == {"cuda"}


def _tile_case(rng, n, kind):
  """Confidences with the tie structures that cross the tiles and rows of ``_group_areas``."""
  if kind == "coarse":  # long tie groups, spanning rows and tiles
    c = np.round(rng.random(n), 1)
  elif kind == "saturated":  # a third at exactly 1.0, the rest with some ties
    c = np.round(rng.random(n), 3)
    c[: n // 3] = 1.0
  elif kind == "distinct":
    c = rng.permutation(n) / max(n, 1)
  else:  # "one": every confidence equal
    c = np.full(n, 0.5)
  c = c.astype(np.float32)
  return c, rng.random(n) < np.clip(c, 0.05, 0.95)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_group_areas_equal_reference_across_tiles(convention):
  """``_group_areas``' kernel (interpreted) after the sort, and E-AURC from the same bytes: the
  float64 reference's AURC, AUGRC and E-AURC, and the CPU scan's, at sizes around its rows (32)
  and tiles (2048), with tie groups inside rows, across rows and across tiles, every sample tied,
  and all correct or all wrong; exactly 0 for an optimal order."""
  from cwsa_jax import _risk_coverage_kernels as rc
  tiles = jax.jit(functools.partial(rc._summary_by_tiles, convention=convention,
                                    with_eaurc=True, kernels=INTERPRETED))
  scan = jax.jit(functools.partial(rc._summary_kernel, convention=convention, with_eaurc=True,
                                   sequential=True))
  rng = np.random.default_rng(17)
  cases = [(n, kind) for n in (1, 2, 31, 33, 2047, 2049, 6000)
           for kind in ("coarse", "saturated", "distinct", "one")]
  for n, kind in cases:
    c, ok = _tile_case(rng, n, kind)
    if n == 2049:
      ok = np.ones(n, bool) if kind == "coarse" else (np.zeros(n, bool) if kind == "one" else ok)
    got = [float(x) for x in tiles(jnp.asarray(c), jnp.asarray(ok))]
    want = [reference.aurc(c, ok, convention), reference.aurc(c, ok, convention, generalized=True),
            reference.eaurc(c, ok, convention)]
    cpu = scan(c, ok)
    for g, w, x in zip(got, want, cpu):
      assert g == pytest.approx(w, rel=2e-6, abs=1e-7), (n, kind)
      assert g == pytest.approx(float(x), rel=2e-6, abs=1e-7), (n, kind)
    if not ok.all() and ok.any():  # an optimal order gives E-AURC exactly 0
      if convention == "step":  # correct first, every error its own group
        perfect = np.empty(n, np.float32)
        perfect[np.argsort(ok, kind="stable")[::-1]] = np.linspace(1.0, 0.0, n)
      else:  # all correct tied above all errors tied
        perfect = ok.astype(np.float32)
      assert float(tiles(jnp.asarray(perfect), jnp.asarray(ok)).eaurc) == 0.0, (n, kind)
      assert float(scan(perfect, ok).eaurc) == 0.0, (n, kind)


def test_aurc_cuda_form_equals_cpu_form():
  """AURC, AUGRC, E-AURC and the summary with the CUDA form (sort, then ``_group_areas``)
  forced, batched rows included: the CPU form's values to float32 rounding; graded
  correctness and the "published_code" convention keep the parallel scan."""
  from cwsa_jax import _risk_coverage as rc
  c2 = C[:6000].reshape(2, -1)
  ok2 = OK[:6000].reshape(2, -1)

  def metrics(kernels):
    summary = functools.partial(rc._summary, kernels=kernels)
    return [summary(C, OK, "step").aurc, summary(C, OK, "trapezoid").augrc,
            summary(c2, ok2, "step").aurc,
            jax.vmap(lambda c, k: summary(c, k, "trapezoid").aurc)(c2, ok2),
            *summary(C, OK, "step"), summary(c2, ok2, "trapezoid", binary=True).eaurc,
            summary(C, KAPPA, "step").aurc, summary(C, OK, "published_code").aurc]

  want = [np.asarray(x) for x in metrics(DEFAULT)]
  forced = Recording(platform="cuda", interpret=True)
  got = [np.asarray(x) for x in metrics(forced)]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-9)
  # Boolean outcomes with "step" or "trapezoid" take the kernel, the rest the parallel scan.
  assert forced.forms("risk_coverage") == {"cuda", "default"}
  for c, k, convention in ((C, KAPPA, "step"), (C, OK, "published_code")):
    alone = Recording(platform="cuda", interpret=True)
    rc._summary(c, k, convention, kernels=alone)
    assert alone.forms("risk_coverage") == {"default"}, convention
  assert (cj.aurc(C, OK), cj.eaurc(C, OK)) == (want[0], want[6])


def test_group_areas_not_offered_inside_shard_map():
  """Samples that vary over an enclosing ``shard_map``'s mesh axes keep the XLA scans on CUDA (as
  ``_dense`` does): ``_group_areas.applies`` is false there, true for the same samples outside."""
  from jax.sharding import PartitionSpec as P
  from cwsa_jax._kernels import _group_areas
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  seen = []

  def local(c, k):
    seen.append(_group_areas.applies(c, k, "step"))
    return c

  jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("data"),) * 2, out_specs=P("data")))(
      C[:64], OK[:64])
  jax.jit(local)(C[:64], OK[:64])
  assert seen == [False, True]
  assert not _group_areas.applies(jnp.asarray(C[:64]), jnp.asarray(KAPPA[:64]), "step")
  assert not _group_areas.applies(jnp.asarray(C[:64]), jnp.asarray(OK[:64]), "published_code")


@pytest.mark.parametrize("form,block,warps", [("lanes", 32, 4), ("unrolled", 32, 1)])
def test_dense_refuses_inexact_accumulators(form, block, warps):
  """More than 1023 samples per float32 accumulator would overflow the count column that
  shares its bits with the correct count: refused, not summed wrong."""
  from cwsa_jax._kernels import _dense
  rows = jnp.asarray(np.concatenate([[-np.inf], np.linspace(0.5, 0.9, 15)]).astype(np.float32))
  c = jnp.full((1, 1 << 16), 0.7, jnp.float32)
  with pytest.raises(ValueError, match="1023 samples per accumulator"):
    _dense.row_sums(c, c > 0.5, rows, unit=True, form=form, block=block, num_warps=warps,
                    per_program=1 << 16)


def test_unrolled_kernel_issues_several_loads_per_step_and_skips_padding_rows():
  """The Triton IR of "unrolled" (lowered for CUDA on this CPU, as on a GPU): a step of 512
  samples with 4 warps is 4 loads of each input in the loop, and a sweep of 10 thresholds
  compares 11 rows, not the 16 of its mask. The programs wholly inside [0, n) run a loop
  without the kernel's own bounds checks."""
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).parent.parent / "benchmarks" / "kernel_code_stats.py"
  spec = importlib.util.spec_from_file_location("kernel_code_stats", path)
  stats = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(stats)
  ir = stats.ttir("unrolled", 512, 4, 2, 16, 11)
  loops = [part[:part.index("scf.yield")] for part in ir.split("scf.for")[1:]]
  assert len(loops) == 2  # n = 1e8 is not a multiple of 2^16: a loop for the last program
  for loop in loops:
    assert loop.count("tt.load") == 8  # 4 of the confidences, 4 of the correctness
    assert loop.count("arith.cmpf oge") == 4 * 11  # per load, one comparison per live row
  # the last program's loop compares sample indices with n = 1e8 on top of Pallas' own masks
  counts = sorted(loop.count("100000000") for loop in loops)
  assert counts[0] < counts[1]


def _on_accelerator():
  """Kernels that treat concrete arrays as on an accelerator (the eager path a GPU takes), with
  the kernels' CPU forms."""
  return Recording(platform="cuda", dense=False, sorted_sums=False)


# The eager metrics that check confidences by their kernel's count on an accelerator.
_COUNTED = {
    "sweep": lambda c, k, kernels: _sweep_with(kernels, c, k, T),
    "ece_width": lambda c, k, kernels: _ece_with(kernels, c, k),
    "ece_mass_l2": lambda c, k, kernels: _ece_with(kernels, c, k, binning="mass", norm="l2"),
    "calibration_bins": lambda c, k, kernels: _bins_with(kernels, c, k, num_bins=10),
}


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("name", list(_COUNTED))
def test_eager_metrics_on_an_accelerator_check_by_the_kernels_count(name, graded):
  """On an accelerator an eager sweep, ECE or calibration_bins makes no pass of its own over
  the confidences (the kernel's kept count checks them): the same results, bit for bit, for
  valid samples."""
  rng = np.random.default_rng(3)
  c = jnp.asarray(np.round(rng.random((2, 5000)), 2).astype(np.float32))
  ok = jnp.asarray(rng.random((2, 5000)).astype(np.float32) if graded else rng.random((2, 5000)) < 0.7)
  want = _COUNTED[name](c, ok, DEFAULT)
  on_device = _on_accelerator()
  got = _COUNTED[name](c, ok, on_device)
  # Asked once where the confidences are (deferring them to the kernel), never again: a check
  # of their own would reduce them where they live, asking again.
  assert on_device.times_asked(c) == 1
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("bad,message", [(np.nan, "NaN or infinite"), (np.inf, "NaN or infinite"),
                                         (1.5, r"must lie in \[0, 1\]"),
                                         (-0.25, r"must lie in \[0, 1\]")])
@pytest.mark.parametrize("name", list(_COUNTED))
def test_eager_metrics_on_an_accelerator_still_raise_on_invalid_confidences(name, bad, message):
  """The kernel leaves the invalid confidence out; the metric then raises the error the check
  beforehand gave (here in the second row of two)."""
  c = np.full((2, 100), 0.6, np.float32)
  c[1, 17] = bad
  c = jnp.asarray(c)
  on_device = _on_accelerator()
  with pytest.raises(ValueError, match=message):
    _COUNTED[name](c, c > 0.5, on_device)
  # deferred to the kernel, then checked (where they live) once a row lost a sample
  assert on_device.times_asked(c) == 2


@pytest.mark.parametrize("live", [32, 51])
def test_unrolled_shares_64_rows_evenly(live):
  """64 mask rows with ``live`` of them holding samples: "unrolled", which gives each program
  its share of the live rows (32: one program, no padding row in it; 51: two of 26) and lays
  their sums back in row order, gives the product form's per-bucket sums, and 0 past ``live``."""
  from cwsa_jax._kernels import _dense
  rng = np.random.default_rng(live)
  c = jnp.asarray(np.round(rng.random((2, 700)), 2).astype(np.float32))
  ok = jnp.asarray(rng.random((2, 700)) < 0.6)
  inner = np.sort(rng.random(live - 1)).astype(np.float32)
  rows = jnp.asarray(np.concatenate([[-np.inf], inner, np.full(64 - live, np.inf)]), jnp.float32)
  interpreted = _dispatch.Kernels(interpret=True)
  got = _dense.row_sums(c, ok, rows, unit=True, form="unrolled", block=128, per_program=512,
                        live=live, kernels=interpreted)
  want = _dense.row_sums(c, ok, rows, unit=True, form="bits", block=128, per_program=512,
                         kernels=interpreted)
  # (the forms lay out their digit columns differently: compared as per-bucket sums)
  for a, b in zip(_dense._bucket_table(got, live), _dense._bucket_table(want, live)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.asarray(got)[:, :, live:].any()  # rows from `live` on hold no sample

