"""Every cwsa-jax kernel on a GPU: time, bytes read per second against the device's bandwidth, AURC against one sort.

Usage: benchmarks/accelerator.sh [--quick] [--sizes N,...] [--only KERNEL,...] [--out FILE]
       [--check-max-n 1e7] [--deadline-s 280] [--case-limit-s 90]
(or python benchmarks/accelerator.py with the repository root on PYTHONPATH)

What is measured, for n in {1e8, 1e7, 1e6} (largest first, so the goals run
first): the kernels of ``bench_vs_numpy.py`` (same cases, same data), each the
wall time of one call of the kit's public function on arrays already on the
device, blocked until ready (min and median of interleaved repeats,
compilation excluded), and

* ``bytes_read / time``: the bytes of the inputs (float32 confidences, bool
  correctness, int32 groups) divided by the minimum time, beside the device's
  spec memory bandwidth (a table of known devices, else null) and beside a
  measured read floor (``jnp.sum`` of the same arrays). Goal: ``sweep`` and
  ``ece`` at n = 1e8 read at >= 30% of the spec;
* for the AURC family, one ``lax.sort`` of the same packed int32 keys
  (``confidence bits << 1 | error``), timed interleaved with the kit. Goal:
  ``aurc`` at n = 1e8 within 2x of it;
* for the sweep with T <= 64, one fused compare-and-reduce of the counts N
  and A per threshold (:func:`fused_counts`, two of the sweep's four sums),
  timed interleaved with the kit: what a scatter-free sweep could reach;
* the batched cases: ``jax.vmap`` of the sweep over 64 models and the
  bootstraps (1000 resamples, n = 1e5).

Before timing, results at n <= ``--check-max-n`` are checked against the
float64 NumPy baselines (the time of that one NumPy call on this host's CPU
is recorded as ``numpy_cpu_single_call_s``: one run, for orientation only).
The JSON (device name, spec bandwidth, every row) is rewritten after each row,
so a run stopped early keeps what it measured; a case that would start after
``--deadline-s`` is skipped and listed, and a case still running after
``--case-limit-s`` (a kernel that hangs) is listed and ends the run (exit 3). ``--quick`` (small n) runs on a CPU
too, to test the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_numpy as bench  # noqa: E402
from _common import environment, interleaved_times, load_average, summarize, write_json_atomic  # noqa: E402

DEFAULT_OUT = "results/benchmarks/gpu.json"

# Spec memory bandwidth (GB/s) from the vendors' data sheets, matched as a
# lower-case substring of jax's device_kind, first match wins (so the more
# specific names come first).
BANDWIDTH_GB_S = (
    ("gh200", 4000),  # the 96 GB HBM3 version (the 144 GB HBM3e one has 4900)
    ("h200", 4800),
    ("h100 nvl", 3900),
    ("h100 pcie", 2000),
    ("h100", 3350),  # SXM, "NVIDIA H100 80GB HBM3"
    ("h800", 3350),
    ("b200", 8000),
    ("a100-sxm4-80gb", 2039),
    ("a100 80gb pcie", 1935),
    ("a100", 1555),  # 40 GB, SXM or PCIe
    ("l40s", 864),
    ("l40", 864),
    ("l4", 300),
    ("a10g", 600),
    ("a10", 600),
    ("v100", 900),
    ("t4", 320),
    ("rtx 4090", 1008),
)


def spec_bandwidth(device_kind: str) -> float | None:
  """Spec memory bandwidth in bytes/s of a known device, else None."""
  kind = device_kind.lower()
  for name, gb_s in BANDWIDTH_GB_S:
    if name in kind:
      return gb_s * 1e9
  return None


def nvidia_smi() -> str | None:
  """nvidia-smi's name, memory and clocks line, where it exists."""
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,clocks.max.memory,"
                          "driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None


def packed_sort():
  """One lax.sort of the int32 keys ``-(confidence bits << 1 | error)`` (the kit's AURC sort key)."""
  def sort(c, ok):
    bits = lax.bitcast_convert_type(jnp.clip(c, 0.0, 1.0), jnp.int32)
    return lax.sort(-((bits << 1) | jnp.logical_not(ok).astype(jnp.int32)))
  return jax.jit(sort)


def fused_counts():
  """Per threshold, the retained count N and correct count A in one fused compare-and-reduce.

  Two of the sweep's four sums (no digit columns for U and V), read in one pass
  with no scatter: a lower bound on what a fused-reduction sweep would take,
  timed beside the kit for T <= :data:`FUSED_MAX_T` (the work is n T).
  """
  def counts(c, ok, t):
    kept = c[:, None] >= t[None, :]
    return (jnp.sum(kept, axis=0, dtype=jnp.int32),
            jnp.sum(kept & ok[:, None], axis=0, dtype=jnp.int32))
  return jax.jit(counts)


FUSED_MAX_T = 64


def read_floor():
  """One pass over the inputs: the fastest any kernel that reads them can be."""
  return jax.jit(lambda c, ok: jnp.sum(c) + jnp.sum(ok.astype(jnp.int32)))


def with_kernels(case: bench.Case, d: bench.Data, kernels) -> bench.Case:
  """``case`` with its kit called through the internal entry point with ``kernels`` (e.g. the
  dense launches of ``--launch``), for the kernels that take the dense sums: sweep, ece,
  calibration_bins and select_threshold on ``d``; any other case as it is."""
  from cwsa_jax import _calibration, _select, _sweep  # noqa: PLC0415
  opts = case.options
  if case.kernel == "sweep":
    t = jax.device_put(bench.thresholds(opts["T"]))
    kit = lambda: _sweep._sweep(d.jc, d.jok, t, normalize=opts["normalize"],  # noqa: E731
                                kernels=kernels)
  elif case.kernel == "ece":
    kit = lambda: _calibration._ece(d.jc, d.jok, num_bins=opts["num_bins"],  # noqa: E731
                                    norm=opts["norm"], binning=opts["binning"], kernels=kernels)
  elif case.kernel == "calibration_bins":
    kit = lambda: _calibration._calibration_bins(  # noqa: E731
        d.jc, d.jok, num_bins=opts["num_bins"], binning=opts["binning"], kernels=kernels)
  elif case.kernel == "select_threshold":
    kit = lambda: _select._select_threshold(d.jc, d.jok, metric=opts["metric"],  # noqa: E731
                                            min_coverage=opts["min_coverage"], kernels=kernels)
  else:
    return case
  return dataclasses.replace(case, kit=kit)


# The kernels with_kernels gives another launch.
LAUNCH_KERNELS = ("sweep", "ece", "calibration_bins", "select_threshold")


def input_bytes(case: bench.Case, d: bench.Data | None) -> int | None:
  if case.kernel.startswith("bootstrap"):
    return None  # resampling work, not a read of the inputs
  if case.kernel == "sweep_64_models":
    return case.n * (4 + 1)
  extra = 4 if case.kernel == "sweep_by_group" else 0
  return case.n * (4 + 1 + extra)


def run_case(case: bench.Case, d, *, repeats: int, check: bool, rtol: float, atol: float,
             spec: float | None, floor_bytes_per_s: float | None, sort_fn,
             counts_fn=None) -> dict:
  row = {"kernel": case.kernel, "options": case.options, "n": case.n}
  try:
    start = time.perf_counter()
    kit_result = jax.block_until_ready(case.kit())
    row["kit_first_call_s"] = time.perf_counter() - start
    if check:
      start = time.perf_counter()
      if case.check is not None:
        got, reference = case.check()
      else:
        got, reference = kit_result, case.baselines["numpy"]()
      row["numpy_cpu_single_call_s"] = time.perf_counter() - start
      row["check"] = bench.compare(got, reference, rtol, atol)
      if case.check_note:
        row["check"]["note"] = case.check_note
    fns = {"kit": case.kit, **case.kit_variants}
    for fn in case.kit_variants.values():
      jax.block_until_ready(fn())  # compile
    if sort_fn is not None:
      fns["lax_sort_packed_key"] = lambda: sort_fn(d.jc, d.jok)
      jax.block_until_ready(fns["lax_sort_packed_key"]())
    if counts_fn is not None:
      t = jnp.asarray(bench.thresholds(case.options["T"]))
      fns["fused_compare_counts"] = lambda: counts_fn(d.jc, d.jok, t)
      jax.block_until_ready(fns["fused_compare_counts"]())
    times = interleaved_times(fns, repeats, max_seconds=30.0)
  except Exception as e:  # noqa: BLE001 - report and go on
    row["error"] = f"{type(e).__name__}: {e}"
    return row
  row["times"] = {name: summarize(t) for name, t in times.items()}
  kit_min = row["times"]["kit"]["min_s"]
  nbytes = input_bytes(case, d)
  if nbytes is not None:
    row["bytes_read"] = nbytes
    row["bytes_read_per_s"] = nbytes / kit_min
    row["fraction_of_spec_bandwidth"] = nbytes / kit_min / spec if spec else None
    row["fraction_of_measured_read_floor"] = (nbytes / kit_min / floor_bytes_per_s
                                              if floor_bytes_per_s else None)
  if sort_fn is not None:
    row["ratio_kit_over_lax_sort"] = kit_min / row["times"]["lax_sort_packed_key"]["min_s"]
  if counts_fn is not None:
    row["ratio_kit_over_fused_counts"] = kit_min / row["times"]["fused_compare_counts"]["min_s"]
  return row


def goals(rows: list, largest: int) -> dict:
  """The issue's accelerator goals, read off the rows at the largest n."""
  out = {}
  for row in rows:
    if row.get("n") != largest or "times" not in row:
      continue
    opts = row["options"]
    if row["kernel"] == "sweep" and opts.get("normalize") == "retained":
      out[f"sweep_T{opts['T']}_fraction_of_spec_bandwidth"] = row.get("fraction_of_spec_bandwidth")
    if row["kernel"] == "ece" and opts.get("binning") == "width":
      out["ece_fraction_of_spec_bandwidth"] = row.get("fraction_of_spec_bandwidth")
    if row["kernel"] == "aurc" and opts.get("convention") == "step":
      out["aurc_over_lax_sort"] = row.get("ratio_kit_over_lax_sort")
  out["bandwidth_goal"] = 0.3
  out["aurc_sort_goal"] = 2.0
  out["n"] = largest
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small n; runs on a CPU (to test the script)")
  parser.add_argument("--sizes", default=None, help="comma-separated n (default 1e8,1e7,1e6)")
  parser.add_argument("--only", default=None, help="comma-separated kernels (as bench_vs_numpy.py)")
  parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 10; 2 with --quick)")
  parser.add_argument("--check-max-n", type=float, default=1e7,
                      help="check against NumPy up to this n (default 1e7)")
  parser.add_argument("--deadline-s", type=float, default=280.0,
                      help="start no case after this many seconds (default 280)")
  parser.add_argument("--case-limit-s", type=float, default=90.0,
                      help="a case still running after this many seconds stops the run: the JSON "
                           "keeps every row so far and lists the case (default 90)")
  parser.add_argument("--rtol", type=float, default=1e-6)
  parser.add_argument("--atol", type=float, default=1e-7)
  parser.add_argument("--out", default=None, help=f"JSON file (default {DEFAULT_OUT}; none with --quick)")
  parser.add_argument("--launch", default=None,
                      help="a gpu_choices.py JSON: the dense kernel's launches it found fastest "
                           "replace the library's in the rows of " + ", ".join(LAUNCH_KERNELS)
                           + " (recorded in settings)")
  args = parser.parse_args(argv)
  from cwsa_jax._kernels import _dispatch  # noqa: PLC0415
  kernels = _dispatch.DEFAULT
  if args.launch:
    with open(args.launch) as f:
      kernels = kernels.with_launches(json.load(f).get("launch", {}))
  start_all = time.perf_counter()
  device = jax.devices()[0]
  if device.platform == "cpu" and not args.quick:
    print("accelerator.py: JAX sees no accelerator (backend cpu). Install a GPU jax "
          "(pip install -e . 'jax[cuda12]') or pass --quick to test the script on a CPU.",
          file=sys.stderr)
    return 2
  only = None if args.only is None else [o.strip() for o in args.only.split(",") if o.strip()]
  if args.sizes:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
  else:
    sizes = [20_000, 2000] if args.quick else [10**8, 10**7, 10**6]
  sizes = sorted(sizes, reverse=True)
  repeats = args.repeats or (2 if args.quick else 10)
  boot_n, boot_b, boot_check = (1000, 10, 10) if args.quick else (10**5, 1000, 100)
  models_n = 500 if args.quick else 10**5
  out_path = args.out or (None if args.quick else DEFAULT_OUT)

  kind = getattr(device, "device_kind", "")
  spec = spec_bandwidth(kind)
  payload = {
      "benchmark": "accelerator",
      **environment(),
      "device_kind": kind,
      "nvidia_smi": nvidia_smi(),
      "spec_memory_bandwidth_bytes_per_s": spec,
      "spec_source": "vendor data sheet, matched on the device name (null: not in the table)",
      "settings": {"quick": args.quick, "sizes": sizes, "repeats": repeats,
                   "check_max_n": args.check_max_n, "rtol": args.rtol, "atol": args.atol,
                   "bootstrap": {"n": boot_n, "num_resamples": boot_b, "check_resamples": boot_check},
                   "models": {"count": bench.NUM_MODELS, "n_per_model": models_n},
                   "data": "c ~ U(0.3, 1) float32, correct with probability c (seed 0)",
                   "timing": "interleaved rounds, min and median; compilation excluded",
                   "dense_launch": {str(k): list(v) for k, v in kernels.dense_launch},
                   "launch_from": args.launch,
                   "launch_kernels": list(LAUNCH_KERNELS) if args.launch else []},
      "load_average_before": load_average(),
      "read_floor": [],
      "rows": [],
      "skipped": [],
  }

  saving = threading.Lock()

  def save() -> None:
    with saving:
      payload["elapsed_s"] = time.perf_counter() - start_all
      payload["goals"] = goals(payload["rows"], sizes[0])
      if out_path:
        write_json_atomic(out_path, payload)

  def abandon(case: bench.Case) -> None:
    """Runs on a timer thread: a hung case (a kernel that never returns) ends the process."""
    reason = f"still running after {args.case_limit_s:.0f} s (--case-limit-s): the run stopped here"
    payload["skipped"].append({"kernel": case.kernel, "options": case.options, "n": case.n,
                               "reason": reason})
    save()
    print(f"accelerator.py: {case.kernel} {bench.describe(case.options)} n={case.n} {reason}",
          file=sys.stderr, flush=True)
    os._exit(3)

  def late() -> bool:
    return time.perf_counter() - start_all > args.deadline_s

  header = f"{'kernel':<20} {'options':<34} {'n':>10} {'kit ms':>10} {'GB/s':>8} {'of spec':>7} {'x sort':>6}  check"
  print(f"device: {kind} ({device.platform}); spec bandwidth "
        f"{spec / 1e12 if spec else float('nan'):.2f} TB/s", file=sys.stderr)
  print(header, file=sys.stderr)

  def record(case: bench.Case, d, sort_fn=None, floor=None) -> None:
    if late():
      payload["skipped"].append({"kernel": case.kernel, "options": case.options, "n": case.n,
                                 "reason": f"past the {args.deadline_s:.0f} s deadline"})
      return
    small_sweep = case.kernel == "sweep" and case.options["T"] <= FUSED_MAX_T
    watchdog = threading.Timer(args.case_limit_s, abandon, args=(case,))
    watchdog.daemon = True
    watchdog.start()
    try:
      row = run_case(case, d, repeats=repeats, check=case.n <= args.check_max_n, rtol=args.rtol,
                     atol=args.atol, spec=spec, floor_bytes_per_s=floor, sort_fn=sort_fn,
                     counts_fn=counts_fn if small_sweep else None)
    finally:
      watchdog.cancel()
    payload["rows"].append(row)
    save()
    if "error" in row:
      line = f"ERROR {row['error'][:100]}"
    else:
      rate = row.get("bytes_read_per_s")
      frac = row.get("fraction_of_spec_bandwidth")
      check = row.get("check")
      line = (f"{row['times']['kit']['min_s'] * 1e3:>10.3f} "
              f"{(rate or float('nan')) / 1e9:>8.1f} {(frac if frac is not None else float('nan')):>7.2f} "
              f"{row.get('ratio_kit_over_lax_sort', float('nan')):>6.2f}  "
              + ("-" if check is None else ("ok" if check["ok"] else "MISMATCH")
                 + (f" {check['max_rel_err']:.1e}" if "max_rel_err" in check else "")))
    print(f"{case.kernel:<20} {bench.describe(case.options)[:34]:<34} {case.n:>10} {line}",
          file=sys.stderr, flush=True)

  sort_fn = packed_sort()
  counts_fn = fused_counts()
  floor_fn = read_floor()
  for n in sizes:
    if late():
      payload["skipped"].append({"n": n, "reason": "past the deadline before the data was made"})
      continue
    d = bench.Data(n, use_torch=False)  # only the kit is timed here
    jax.block_until_ready(floor_fn(d.jc, d.jok))  # compile
    floor = summarize(interleaved_times({"floor": lambda: floor_fn(d.jc, d.jok)}, repeats)["floor"])
    floor["bytes_read_per_s"] = n * 5 / floor["min_s"]
    payload["read_floor"].append({"n": n, **floor})
    cases = bench.calibration_cases(d) + bench.risk_coverage_cases(d) + bench.sweep_cases(d, False)
    # The goals first: sweep, ece, aurc.
    first = {"sweep": 0, "ece": 1, "aurc": 2}
    cases.sort(key=lambda c: first.get(c.kernel, 3))
    if args.launch:
      cases = [with_kernels(case, d, kernels) for case in cases]
    for case in cases:
      if bench.selected(case.kernel, only):
        family = case.kernel in ("aurc", "augrc", "eaurc", "risk_coverage_curve")
        record(case, d, sort_fn if family else None, floor["bytes_read_per_s"])
    del d, cases
  if bench.selected("sweep_64_models", only):
    record(bench.models_case(models_n), None)
  for case in bench.bootstrap_cases(boot_n, boot_b, boot_check, only):
    record(case, None)

  payload["load_average_after"] = load_average()
  save()
  print(json.dumps(payload["goals"]), file=sys.stderr)
  print(json.dumps(payload, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
