"""The kit's GPU forms against the forms they replace, on a GPU: exactness first, then time.

Usage: python benchmarks/gpu_choices.py [--n 1e8] [--out FILE] [--repeats 10]
       python benchmarks/gpu_choices.py --quick     (small n, Pallas' interpreter: runs on a CPU)

For a sweep of T = 10, 20 and 50 thresholds (16, 32 and 64 mask rows) and the
15 equal-width bins of the ECE, on ``c ~ U(0.3, 1)`` float32 and
``correct ~ Bernoulli(c)``:

* the exact per-bucket sums of the scatter path (``_exact.segment_sums``, as
  on every backend before ``_dense``) and of the dense kernels in several
  launches (form, samples per step, warps, pipeline stages: :data:`CONFIGS`),
  each checked equal to the scatter path's integers, bit for bit, before
  timing; the fastest exact launch of each mask height (in the first case of
  that height) is written to the JSON's ``launch`` (``accelerator.py
  --launch`` applies it) and used by
* the public ``sweep`` / ``ece`` with the dense kernel on and off (their internal entry
  points, each compiled ahead of time with ``Kernels(dense=...)``), results compared;
* one read of the inputs (``jnp.sum``), the floor of any kernel;
* ``jax.vmap`` of the sweep over 64 models of 10^5 samples, the kernel on and off;
* the sweep at T = 1000 with ``_sorted_sums`` (one sort, prefix sums;
  ``Kernels.sorted_sums``) and the equal-mass ECE with its edges by one sort
  (``_sort.order_statistics``, ``Kernels.select_by_sort``), each on and off, beside
  one ``lax.sort`` of the packed keys.

And for the AURC family: ``aurc`` "step" and "trapezoid", ``eaurc`` "step" and
``risk_coverage_summary`` "trapezoid" with the sort and ``_group_areas``'
kernel (``Kernels.group_areas``) against the XLA scans
(results compared, their largest relative difference recorded), and
``risk_coverage_curve``'s group starts by running maxima
(``Kernels.starts_by_running_max``) against a scatter and a gather, each
beside one ``lax.sort`` of the packed keys. ``--switches`` picks among these
cases (and the two above); ``--deadline-s`` stops trying launches.

All timed interleaved (min and median), compilation excluded; bytes read are
5 n (float32 c, bool correct), also given as a fraction of the spec bandwidth
(``accelerator.spec_bandwidth``). Prints a table on stderr and the JSON on
stdout (and to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerator  # noqa: E402
from _common import environment, interleaved_times, summarize, write_json_atomic  # noqa: E402

import cwsa_jax as cj  # noqa: E402
from cwsa_jax import _calibration, _sweep  # noqa: E402
from cwsa_jax._kernels import _dense, _dispatch  # noqa: E402

# Launches of the dense kernels tried per mask height R (16, 32 or 64 rows): (form, samples per
# step, warps, pipeline stages); the library's (``_dispatch.DENSE_LAUNCH``) is always tried first.
# "unrolled" reads a step as block / (32 warps) loads of one sample per thread: with up to 2^16
# samples per program that is at most 1023 per accumulator only from 64 lanes (2 warps) on.
CONFIGS = {
    16: (("unrolled", 512, 4, 2), ("unrolled", 1024, 4, 2), ("unrolled", 256, 4, 2),
         ("unrolled", 1024, 8, 2), ("unrolled", 128, 4, 2), ("lanes", 128, 4, 2),
         ("bits", 256, 4, 2)),
    32: (("unrolled", 512, 4, 2), ("unrolled", 256, 4, 2), ("unrolled", 1024, 8, 2),
         ("unrolled", 128, 4, 2), ("lanes", 128, 4, 2), ("lanes", 256, 8, 2), ("bits", 128, 4, 2)),
    64: (("unrolled", 512, 4, 2), ("unrolled", 256, 8, 2), ("unrolled", 128, 4, 2),
         ("bits", 128, 4, 2), ("bits", 512, 8, 2)),
}
QUICK_CONFIGS = {16: (("bits", 128, 4, 2), ("lanes", 256, 4, 2), ("unrolled", 512, 4, 2)),
                 32: (("lanes", 128, 4, 2),), 64: (("bits", 256, 8, 2), ("unrolled", 128, 4, 2))}


def fits(form: str, block: int, warps: int) -> bool:
  """Whether ``_dense.row_sums`` takes this launch at its largest program (2^16 samples)."""
  if form not in _dense.FORMS:
    return False
  if form not in ("lanes", "unrolled"):
    return True
  lanes = min(block, 32 * warps) if form == "unrolled" else block
  return (1 << 16) // lanes <= 1023


def _sweep_with(t):
  """The public sweep at thresholds ``t``, as a function of the kernels it runs with."""
  return lambda kernels: lambda c, k: _sweep._sweep(c, k, t, kernels=kernels)


def _ece_with(t):
  """The public ECE (15 equal-width bins), as a function of the kernels it runs with."""
  del t
  return lambda kernels: lambda c, k: _calibration._ece(c, k, kernels=kernels)


def cases():
  grid = lambda t: np.sort(np.asarray(t, np.float32))  # noqa: E731
  return {
      "sweep_T10": dict(rows=grid(np.arange(10) / 20 + 0.5), unit=True, public=_sweep_with),
      "ece_15_bins": dict(rows=np.asarray(_calibration.width_edges(15))[1:-1], unit=False,
                          public=_ece_with),
      # 32 mask rows: the lanes form's largest height (its accumulators: 5 x 32 per sample slot)
      "sweep_T20": dict(rows=grid(np.linspace(0.5, 0.975, 20)), unit=True, public=_sweep_with),
      "sweep_T50": dict(rows=grid(cj.default_thresholds()), unit=True, public=_sweep_with),
  }


def compare(on, off, *args, differences=None) -> bool:
  """Whether two compiled forms give equal results (their largest relative difference goes
  into ``differences``, a list, where given)."""
  pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64))
           for x, y in zip(jax.tree.leaves(on(*args)), jax.tree.leaves(off(*args)))]
  if differences is not None:
    differences.append(max((float(np.nanmax(np.abs(x - y) / np.maximum(np.abs(y), 1e-30)))
                             if x.size else 0.0) for x, y in pairs))
  return all(np.array_equal(x, y, equal_nan=True) for x, y in pairs)


def configured(fn_of, kernels: _dispatch.Kernels, option: str, *args, differences=None):
  """``fn_of(kernels)`` compiled ahead of time with ``kernels.option`` True and False, and
  whether their results are equal (see :func:`compare`)."""
  on, off = (jax.jit(fn_of(dataclasses.replace(kernels, **{option: value}))).lower(*args).compile()
             for value in (True, False))
  return on, off, compare(on, off, *args, differences=differences)


def report(name: str, label: str, s: dict, note="") -> None:
  print(f"{name:<12} {label:<28} {s['min_s'] * 1e3:9.3f} ms {s['median_s'] * 1e3:9.3f} ms "
        f"{s['bytes_read_per_s'] / 1e9:8.1f} GB/s {s['fraction_of_spec_bandwidth'] or float('nan'):6.3f}"
        f"  {note}", file=sys.stderr, flush=True)


def timed(fns: dict, repeats: int, nbytes: int, spec) -> dict:
  for fn in fns.values():
    jax.block_until_ready(fn())
  out = {}
  for label, t in interleaved_times(fns, repeats, max_seconds=20.0).items():
    s = summarize(t)
    s["bytes_read_per_s"] = nbytes / s["min_s"]
    s["fraction_of_spec_bandwidth"] = nbytes / s["min_s"] / spec if spec else None
    out[label] = s
  return out


def models_case(repeats, spec, payload, quick, kernels) -> None:
  """``jax.vmap`` of the sweep (T = 50) over 64 models of 10^5 samples, the kernel on and off."""
  models, n = (4, 5000) if quick else (64, 100_000)
  key_c, key_k = jax.random.split(jax.random.key(1))
  c = jax.random.uniform(key_c, (models, n), jnp.float32, 0.3, 1.0)
  ok = jax.random.uniform(key_k, (models, n), jnp.float32) < c
  t = jnp.asarray(cj.default_thresholds())
  fn_of = lambda kernels: jax.vmap(_sweep_with(t)(kernels))  # noqa: E731
  out = {"models": models, "n_per_model": n}
  payload["cases"]["sweep_64_models"] = out
  on, off, out["public_equal"] = configured(fn_of, kernels, "dense", c, ok)
  out["times"] = timed({"public_dense_on": lambda: on(c, ok), "public_dense_off": lambda: off(c, ok)},
                       repeats, 5 * models * n, spec)
  for label, s in out["times"].items():
    report("64_models", label, s)
  print(f"64 models: results equal with the kernel on and off: {out['public_equal']}",
        file=sys.stderr)


def switch_cases(c, ok, repeats, nbytes, spec, payload, kernels, only=None) -> None:
  """Kernel choices on and off, each beside one ``lax.sort`` of the packed keys: the sweep at
  T = 1000 by one sort (``_sorted_sums``), the equal-mass ECE's edges by one sort
  (``_sort.order_statistics``), the AURC family's group tiles and the AURC scan's group starts
  by running maxima."""
  from cwsa_jax import _risk_coverage as rc
  t = jnp.asarray(accelerator.bench.thresholds(1000))
  sort_fn = accelerator.packed_sort()
  sorts, scans = ("public_sort_on", "public_sort_off"), ("running_max", "scatter_gather")
  tiles = ("group_tiles", "xla_scans")
  mass_ece = lambda kernels: lambda c, k: _calibration._ece(  # noqa: E731
      c, k, binning="mass", kernels=kernels)
  def summary(convention, field=None, binary=False):
    def of(kernels):
      def fn(c, k):
        s = rc._summary(c, k, convention, binary=binary, with_eaurc=field in (None, "eaurc"),
                        kernels=kernels)
        return s if field is None else getattr(s, field)
      return fn
    return of

  curve = lambda kernels: functools.partial(rc._curve, kernels=kernels)  # noqa: E731
  # (name, function of the kernels, the Kernels option switched, labels)
  for name, fn, switch, labels in (
      ("sweep_T1000", _sweep_with(t), "sorted_sums", sorts),
      ("ece_mass", mass_ece, "select_by_sort", sorts),
      ("aurc_step", summary("step", "aurc"), "group_areas", tiles),
      ("aurc_trapezoid", summary("trapezoid", "aurc"), "group_areas", tiles),
      ("eaurc_step", summary("step", "eaurc", binary=True), "group_areas", tiles),
      ("summary_trapezoid", summary("trapezoid"), "group_areas", tiles),
      ("curve", curve, "starts_by_running_max", scans)):
    if only is not None and name not in only:
      continue
    out = {"switch": f"Kernels.{switch}"}
    payload["cases"][name] = out
    try:
      differences = []
      on, off, out["equal"] = configured(fn, kernels, switch, c, ok, differences=differences)
      out["max_relative_difference"] = differences[0]
    except Exception as e:  # noqa: BLE001 - report and go on
      out["error"] = f"{type(e).__name__}: {str(e)[:400]}"
      print(f"{name}: ERROR {str(e)[:200]}", file=sys.stderr)
      continue
    out["times"] = timed({labels[0]: lambda: on(c, ok), labels[1]: lambda: off(c, ok),
                          "lax_sort_packed_key": lambda: sort_fn(c, ok)}, repeats, nbytes, spec)
    for label, s in out["times"].items():
      report(name, label, s)
    print(f"{name}: results equal with {switch} on and off: {out['equal']}", file=sys.stderr)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=float, default=1e8)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=None)
  parser.add_argument("--switches", default=None,
                      help="comma-separated switch cases to run (default all: sweep_T1000, "
                           "ece_mass, aurc_step, aurc_trapezoid, eaurc_step, summary_trapezoid, "
                           "curve)")
  parser.add_argument("--deadline-s", type=float, default=200.0,
                      help="no further dense launch is tried after this many seconds")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  n = 50_000 if args.quick else int(args.n)
  configs = QUICK_CONFIGS if args.quick else CONFIGS
  deadline = start + args.deadline_s
  launches = {}  # mask height -> the fastest exact launch (the first case of that height)
  # --quick runs on a CPU: the dense kernels through Pallas' interpreter. The public functions
  # run with these kernels, each height's fastest launch put in once found.
  kernels = _dispatch.Kernels(interpret=args.quick)
  device = jax.devices()[0]
  kind = getattr(device, "device_kind", "")
  spec = accelerator.spec_bandwidth(kind)
  key_c, key_k = jax.random.split(jax.random.key(0))
  c = jax.random.uniform(key_c, (n,), jnp.float32, 0.3, 1.0)
  ok = jax.random.uniform(key_k, (n,), jnp.float32) < c
  nbytes = 5 * n
  payload = {"benchmark": "gpu_choices", **environment(), "device_kind": kind,
             "spec_memory_bandwidth_bytes_per_s": spec, "n": n, "repeats": args.repeats,
             "data": "c ~ U(0.3, 1) float32, correct with probability c (jax.random key 0)",
             "cases": {}}
  floor_fn = jax.jit(lambda c, k: jnp.sum(c) + jnp.sum(k.astype(jnp.int32)))
  jax.block_until_ready(floor_fn(c, ok))
  print(f"device {kind}; n = {n:.0e}; spec {spec or float('nan'):.3g} B/s", file=sys.stderr)
  for name, case in cases().items():
    rows = jnp.asarray(case["rows"])
    out = {"rows": int(rows.shape[0]), "configs": {}}
    payload["cases"][name] = out
    scatter = jax.jit(functools.partial(_sweep._bucket_sums_impl, num_groups=None, masked=False,
                                        given=False, dense=False))
    want = [np.asarray(x) for x in scatter(c, ok, rows)]
    fns = {"read_floor": lambda: floor_fn(c, ok), "scatter_sums": lambda: scatter(c, ok, rows)}
    height = _dense._num_rows(rows.shape[0] + 1)
    library = _dispatch.DEFAULT.launch(height)
    tried = (library,) + tuple(x for x in configs[height]
                               if tuple(x) != library and fits(*tuple(x)[:3]))
    labels = {}
    for form, block, warps, stages in tried:
      label = f"dense_{form}_b{block}_w{warps}_s{stages}"
      if time.perf_counter() > deadline:
        out["configs"][label] = {"skipped": "deadline"}
        continue
      fn = jax.jit(functools.partial(_dense.bucket_sums, unit=case["unit"], block=block,
                                     form=form, num_warps=warps, num_stages=stages,
                                     kernels=kernels))
      try:
        got = [np.asarray(x) for x in fn(c, ok, rows)]
      except Exception as e:  # noqa: BLE001 - report and go on
        out["configs"][label] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print(f"{name} {label}: ERROR {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        continue
      exact = all(np.array_equal(a, b) for a, b in zip(got, want))
      out["configs"][label] = {"exact": exact}
      if exact:
        fns[label] = functools.partial(fn, c, ok, rows)
        labels[label] = [form, block, warps, stages]
    # The fastest exact launch, timed on its own first; the public functions then use it.
    kernel_times = timed({k: fns[k] for k in labels}, args.repeats, nbytes, spec) if labels else {}
    if kernel_times:
      best = min(kernel_times, key=lambda k: kernel_times[k]["min_s"])
      out["fastest_launch"] = labels[best]
      launches.setdefault(height, labels[best])
      kernels = kernels.with_launches({height: launches[height]})
    out["public_launch"] = list(kernels.launch(height))
    public = case["public"](rows if name.startswith("sweep") else None)
    try:
      on, off, out["public_equal"] = configured(public, kernels, "dense", c, ok)
      fns["public_dense_on"] = lambda: on(c, ok)
      fns["public_dense_off"] = lambda: off(c, ok)
    except Exception as e:  # noqa: BLE001
      out["public_error"] = f"{type(e).__name__}: {str(e)[:400]}"
      print(f"{name} public: ERROR {str(e)[:200]}", file=sys.stderr)
    out["times"] = {**kernel_times,
                    **timed({k: f for k, f in fns.items() if k not in labels}, args.repeats,
                            nbytes, spec)}
    for label, s in out["times"].items():
      report(name, label, s, out["configs"].get(label, {}).get("exact", ""))
    print(f"{name}: public results equal with the kernel on and off: {out.get('public_equal')}",
          file=sys.stderr)
    if args.out:
      write_json_atomic(args.out, payload)
  payload["launch"] = {str(k): v for k, v in launches.items()}
  models_case(args.repeats, spec, payload, args.quick, kernels)
  switch_cases(c, ok, args.repeats, nbytes, spec, payload, kernels,
               None if args.switches is None else args.switches.split(","))
  payload["elapsed_s"] = time.perf_counter() - start
  if args.out:
    write_json_atomic(args.out, payload)
  print(json.dumps(payload, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
