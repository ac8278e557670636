"""cwsa-jax against the best vectorized NumPy (and torch CPU) implementation of every kernel.

Usage:
  python benchmarks/bench_vs_numpy.py [--quick] [--only KERNEL[,KERNEL...]] [--sizes N[,N...]]
      [--repeats R] [--min-seconds S] [--with-loops] [--rtol 1e-6] [--atol 1e-7] [--strict]
      [--out results/benchmarks/vs_numpy.json]

What is measured, per kernel, option and n in {1e5, 1e6, 1e7} (T in {10, 50,
1000} for the sweep): the wall time of one call of the kit's public function
on arrays already on the device (validation included, as a user pays it;
compilation excluded), and of each baseline of ``numpy_baselines.py`` on the
same data: NumPy variants (single-threaded) and torch CPU where natural
(torch's own intra-op threads, recorded). Before any timing the kit's result
is checked against the float64 NumPy result (``|kit - ref| <= rtol |ref| +
atol``, NaN where NaN), and every other baseline too. Then all
implementations are called in turns (interleaved, a rotation per round, in
one process; ``--repeats`` rounds, and more until the case has taken
``--min-seconds``, so that a kernel of a millisecond gets hundreds of samples
of a noisy machine rather than seven) and the minimum (headline) and median
of the rounds are kept.
``ratio`` is kit min / best baseline min, the best over the NumPy and torch
variants; the per-threshold float64 loop (``--with-loops``) is a second
column only, never the headline. Load averages are recorded before and after
each row.

Batched kernels: ``sweep_64_models`` (``jax.vmap(cw.sweep)`` over 64 models of
n = 1e5 against a NumPy loop over models and a batched NumPy sweep);
``bootstrap_sweep`` / ``bootstrap_ci_*`` (1000 resamples at n = 1e5) against
NumPy bootstraps that bucket or sort once and treat each resample as
multiplicities. Their check reproduces the kit's own resamples
(``cwsa_jax._bootstrap._sampler._resample_indices``) in NumPy on fewer resamples; the
timed NumPy runs draw their own (``np.random.default_rng``).

Prints a short table on stderr and JSON on stdout; ``--out`` also writes the
JSON (atomically). ``--quick`` is a smoke run at small n. Exit status 0, or 1
with ``--strict`` when a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_baselines as nb  # noqa: E402
from _common import environment, interleaved_times, load_average, summarize, write_json_atomic  # noqa: E402

import cwsa_jax as cw  # noqa: E402

KERNELS = ("ece", "calibration_bins", "aurc", "augrc", "eaurc", "risk_coverage_curve", "sweep",
           "sweep_by_group", "select_threshold", "sweep_64_models", "bootstrap_sweep",
           "bootstrap_ci_sweep", "bootstrap_ci_sweep_lambda", "bootstrap_ci_aurc",
           "bootstrap_ci_aurc_lambda", "bootstrap_ci_ece", "bootstrap_ci_ece_lambda")
CONVENTIONS = ("step", "trapezoid", "published_code")
SWEEP_T = (10, 50, 1000)
NUM_GROUPS = 10
NUM_MODELS = 64


# --------------------------------------------------------------------------- data and comparison


def make_data(n: int, seed: int = 0):
  """Confidences uniform on [0.3, 1) in float32 (ties appear at large n), correct with probability c."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  ok = rng.uniform(size=n) < c
  return c, ok


def leaves(x: Any, prefix: str = "") -> dict:
  """Flattens NamedTuples / dicts / arrays / scalars (JAX, NumPy, torch) into {path: float64 array}."""
  if hasattr(x, "_fields"):
    out = {}
    for f in x._fields:
      out.update(leaves(getattr(x, f), f"{prefix}{f}."))
    return out
  if isinstance(x, dict):
    out = {}
    for f, v in x.items():
      out.update(leaves(v, f"{prefix}{f}."))
    return out
  if nb.torch is not None and isinstance(x, nb.torch.Tensor):
    x = x.numpy()
  return {prefix.rstrip(".") or "value": np.asarray(x, np.float64)}


def compare(result: Any, reference: Any, rtol: float, atol: float) -> dict:
  """Every field of ``reference`` against the same field of ``result``: errors and a verdict."""
  got, want = leaves(result), leaves(reference)
  missing = sorted(set(want) - set(got))
  if missing:
    return {"ok": False, "error": f"fields missing from the result: {missing}"}
  worst_abs, worst_rel, worst_field, ok = 0.0, 0.0, None, True
  for name, b in want.items():
    a = np.broadcast_to(got[name], b.shape) if got[name].size == 1 else got[name]
    if a.shape != b.shape:
      return {"ok": False, "error": f"{name}: shape {a.shape} != {b.shape}"}
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if np.any(nan_a != nan_b):
      return {"ok": False, "error": f"{name}: NaN in different places"}
    a, b = a[~nan_b], b[~nan_b]
    if a.size == 0:
      continue
    err = np.abs(a - b)
    rel = err / np.maximum(np.abs(b), np.finfo(np.float64).tiny)
    field_ok = bool(np.all(err <= rtol * np.abs(b) + atol))
    ok &= field_ok
    if err.max() > worst_abs or (not field_ok and worst_field is None):
      worst_field = name
    worst_abs = max(worst_abs, float(err.max()))
    worst_rel = max(worst_rel, float(np.max(np.where(b != 0, rel, 0.0))))
  return {"ok": ok, "max_abs_err": worst_abs, "max_rel_err": worst_rel, "worst_field": worst_field}


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass
class Case:
  """One row: the kit's call and its baselines on the same data."""
  kernel: str
  options: dict
  n: int
  kit: Callable[[], Any]
  baselines: dict  # name -> callable; "numpy" is the float64 reference
  second_column: tuple = ()  # baselines reported but never the headline (per-threshold loops)
  check: Callable[[], tuple] | None = None  # () -> (kit result, reference) when not kit() vs numpy()
  check_note: str = ""
  goal: dict | None = None  # {"against": baseline name, "ratio_at_most": x}
  kit_variants: dict = dataclasses.field(default_factory=dict)  # other ways to call the kit, timed too


class Data:
  """The arrays of one n: NumPy, on the JAX device, and as torch tensors (``use_torch``)."""

  def __init__(self, n: int, use_torch: bool = True):
    self.n = n
    self.c, self.ok = make_data(n)
    self.groups = np.random.default_rng(1).integers(0, NUM_GROUPS, n).astype(np.int32)
    self.jc, self.jok, self.jgroups = (jax.device_put(x) for x in (self.c, self.ok, self.groups))
    self.torch = use_torch and nb.HAVE_TORCH
    if self.torch:
      torch = nb.load_torch()
      self.tc, self.tok = torch.from_numpy(self.c), torch.from_numpy(self.ok)


def thresholds(num: int) -> np.ndarray:
  return np.linspace(0.5, 0.99, num).astype(np.float32)


def calibration_cases(d: Data) -> list:
  cases = []
  for binning in ("width", "mass"):
    baselines = {
        "numpy": lambda b=binning: nb.ece(d.c, d.ok, binning=b),
        "numpy_float32_gaps": lambda b=binning: nb.ece(d.c, d.ok, binning=b, gap_dtype=np.float32),
    }
    if d.torch and binning == "width":
      baselines["torch"] = lambda: nb.torch_ece(d.tc, d.tok)
    cases.append(Case("ece", {"binning": binning, "norm": "l1", "num_bins": 15}, d.n,
                      lambda b=binning: cw.ece(d.jc, d.jok, binning=b), baselines))
    cases.append(Case("calibration_bins", {"binning": binning, "num_bins": 15}, d.n,
                      lambda b=binning: cw.calibration_bins(d.jc, d.jok, binning=b),
                      {"numpy": lambda b=binning: nb.calibration_bins(d.c, d.ok, binning=b)}))
  return cases


def risk_coverage_cases(d: Data) -> list:
  cases = []
  for kernel in ("aurc", "augrc", "eaurc"):
    kit_fn, numpy_fn = getattr(cw, kernel), getattr(nb, kernel)
    for conv in CONVENTIONS:
      baselines = {"numpy": lambda f=numpy_fn, v=conv: f(d.c, d.ok, convention=v)}
      if d.torch:
        baselines["torch"] = lambda k=kernel, v=conv: getattr(nb.torch_risk_coverage_areas(
            d.tc, d.tok, convention=v, with_eaurc=k == "eaurc"), k)
      cases.append(Case(kernel, {"convention": conv}, d.n,
                        lambda f=kit_fn, v=conv: f(d.jc, d.jok, convention=v), baselines))
  cases.append(Case("risk_coverage_curve", {}, d.n, lambda: cw.risk_coverage_curve(d.jc, d.jok),
                    {"numpy": lambda: nb.risk_coverage_curve(d.c, d.ok)}))
  return cases


def sweep_cases(d: Data, with_loops: bool) -> list:
  cases = []
  for num_t, normalize in [(t, "retained") for t in SWEEP_T] + [(50, "all")]:
    th = thresholds(num_t)
    jth = jax.device_put(th)
    baselines = {
        "numpy": lambda th=th, m=normalize: nb.sweep(d.c, d.ok, th, normalize=m),
        "numpy_searchsorted": lambda th=th, m=normalize: nb.sweep(d.c, d.ok, th, normalize=m,
                                                                  bucketing="searchsorted"),
    }
    if d.torch:
      baselines["torch"] = lambda th=th, m=normalize: nb.torch_sweep(d.tc, d.tok, th, normalize=m)
    second = ()
    if with_loops and d.n * num_t <= 5 * 10**7:
      baselines["numpy_threshold_loop"] = lambda th=th, m=normalize: nb.sweep_per_threshold_loop(
          d.c, d.ok, th, normalize=m)
      second = ("numpy_threshold_loop",)
    cases.append(Case("sweep", {"T": num_t, "normalize": normalize}, d.n,
                      lambda jth=jth, m=normalize: cw.sweep(d.jc, d.jok, jth, normalize=m),
                      baselines, second_column=second))
  th = thresholds(50)
  jth = jax.device_put(th)
  cases.append(Case(
      "sweep_by_group", {"T": 50, "num_groups": NUM_GROUPS}, d.n,
      lambda: cw.sweep_by_group(d.jc, d.jok, d.jgroups, jth, num_groups=NUM_GROUPS),
      {"numpy": lambda: nb.sweep_by_group(d.c, d.ok, d.groups, th, num_groups=NUM_GROUPS)}))
  cases.append(Case(
      "select_threshold", {"metric": "cwsa", "min_coverage": 0.5, "T": 50}, d.n,
      lambda: cw.select_threshold(d.jc, d.jok, min_coverage=0.5),
      {"numpy": lambda: nb.select_threshold(d.c, d.ok, min_coverage=0.5)}))
  return cases


def models_case(n: int) -> Case:
  """jax.vmap of cw.sweep over 64 models (T = 50) against NumPy, looped over models and batched."""
  rng = np.random.default_rng(2)
  c = rng.uniform(0.3, 1.0, (NUM_MODELS, n)).astype(np.float32)
  ok = rng.uniform(size=(NUM_MODELS, n)) < c
  jc, jok = jax.device_put(c), jax.device_put(ok)
  th = thresholds(50)
  jth = jax.device_put(th)
  vmapped = jax.vmap(cw.sweep, in_axes=(0, 0, None))  # as the README shows it
  jitted = jax.jit(vmapped)
  return Case("sweep_64_models", {"T": 50, "models": NUM_MODELS, "n_per_model": n}, n * NUM_MODELS,
              lambda: vmapped(jc, jok, jth),
              {"numpy": lambda: nb.sweep(c, ok, th),
               "numpy_loop_over_models": lambda: nb.sweep_loop_over_models(c, ok, th)},
              goal={"against": "numpy_loop_over_models", "ratio_at_most": 0.5},
              kit_variants={"kit_batched_call": lambda: cw.sweep(jc, jok, jth),
                            "kit_jit_of_vmap": lambda: jitted(jc, jok, jth)})


def bootstrap_cases(n: int, num_resamples: int, check_resamples: int, only) -> list:
  """bootstrap_sweep and bootstrap_ci of sweep / aurc / ece against the multiplicity bootstraps."""
  if not any(selected(k, only) for k in KERNELS if k.startswith("bootstrap")):
    return []
  c, ok = make_data(n, seed=3)
  jc, jok = jax.device_put(c), jax.device_put(ok)
  th = thresholds(50)
  jth = jax.device_put(th)
  key = jax.random.key(0)
  try:
    from cwsa_jax._bootstrap._sampler import _resample_indices
    indices = np.asarray(_resample_indices(key, n, check_resamples))
  except Exception as e:  # noqa: BLE001 - a private helper of the kit; the check degrades
    indices, note = None, f"kit's resample indices unavailable ({e!r}): estimates compared only"
  else:
    note = (f"kit's first {check_resamples} resamples reproduced in NumPy; the timed runs use "
            f"{num_resamples} resamples, NumPy's drawn by np.random.default_rng")
  sweep_fn = lambda a, b: cw.sweep(a, b, jth)  # noqa: E731 - one object: compiled once
  sweep_partial = functools.partial(cw.sweep, thresholds=jth)
  aurc_fn = lambda a, b: cw.aurc(a, b)  # noqa: E731
  ece_fn = lambda a, b: cw.ece(a, b)  # noqa: E731
  opts = {"n": n, "num_resamples": num_resamples, "level": 0.95}
  specs = {
      "bootstrap_sweep": (
          {"T": 50, **opts},
          lambda b: cw.bootstrap_sweep(jc, jok, jth, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_sweep(c, ok, th, num_resamples=b, indices=idx)),
      # A keyword-only partial of cw.sweep: bootstrap_ci buckets once; a lambda: the generic path.
      "bootstrap_ci_sweep": (
          {"T": 50, "fn": "functools.partial(cw.sweep, thresholds=th)", **opts},
          lambda b: cw.bootstrap_ci(sweep_partial, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_sweep(c, ok, th, num_resamples=b, indices=idx)),
      "bootstrap_ci_sweep_lambda": (
          {"T": 50, "fn": "lambda c, k: cw.sweep(c, k, th)", **opts},
          lambda b: cw.bootstrap_ci(sweep_fn, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_sweep(c, ok, th, num_resamples=b, indices=idx)),
      # cw.aurc itself: bootstrap_ci sorts once; a lambda: the generic path (a sort per resample).
      "bootstrap_ci_aurc": (
          {"convention": "step", "fn": "cw.aurc", **opts},
          lambda b: cw.bootstrap_ci(cw.aurc, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_aurc(c, ok, num_resamples=b, indices=idx)),
      "bootstrap_ci_aurc_lambda": (
          {"convention": "step", "fn": "lambda c, k: cw.aurc(c, k)", **opts},
          lambda b: cw.bootstrap_ci(aurc_fn, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_aurc(c, ok, num_resamples=b, indices=idx)),
      # cw.ece itself: bootstrap_ci buckets once; a lambda around it: the generic path.
      "bootstrap_ci_ece": (
          {"binning": "width", "norm": "l1", "fn": "cw.ece", **opts},
          lambda b: cw.bootstrap_ci(cw.ece, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_ece(c, ok, num_resamples=b, indices=idx)),
      "bootstrap_ci_ece_lambda": (
          {"binning": "width", "norm": "l1", "fn": "lambda c, k: cw.ece(c, k)", **opts},
          lambda b: cw.bootstrap_ci(ece_fn, jc, jok, key=key, num_resamples=b),
          lambda b, idx=None: nb.bootstrap_ece(c, ok, num_resamples=b, indices=idx)),
  }
  cases = []
  for kernel, (options, kit, numpy_fn) in specs.items():
    if not selected(kernel, only):
      continue
    if indices is not None:
      check = lambda kit=kit, f=numpy_fn: (kit(check_resamples), f(check_resamples, indices))  # noqa: E731
    else:
      check = lambda kit=kit, f=numpy_fn: (kit(check_resamples).estimate,  # noqa: E731
                                           f(check_resamples).estimate)
    cases.append(Case(kernel, options, n, lambda kit=kit: kit(num_resamples),
                      {"numpy_multiplicities": lambda f=numpy_fn: f(num_resamples)},
                      check=check, check_note=note,
                      goal={"against": "numpy_multiplicities", "ratio_at_most": 0.5}))
  return cases


def selected(kernel: str, only) -> bool:
  return only is None or any(kernel == o or kernel.startswith(o + "_") for o in only)


# --------------------------------------------------------------------------- running


def run_case(case: Case, repeats: int, rtol: float, atol: float, max_seconds: float,
             min_seconds: float = 0.0) -> dict:
  """Checks, then times one case; returns its JSON row."""
  row = {"kernel": case.kernel, "options": case.options, "n": case.n,
         "load_average_before": load_average()}
  try:
    start = time.perf_counter()
    kit_result = jax.block_until_ready(case.kit())
    row["kit_first_call_s"] = time.perf_counter() - start  # compilation included
    if case.check is not None:
      checked, reference = case.check()
      row["check"] = compare(checked, reference, rtol, atol)
    else:
      reference = case.baselines["numpy"]()
      row["check"] = compare(kit_result, reference, rtol, atol)
    if case.check_note:
      row["check"]["note"] = case.check_note
    for name, fn in case.kit_variants.items():
      row.setdefault("kit_variant_checks", {})[name] = compare(
          jax.block_until_ready(fn()), reference, rtol, atol)
    row["baseline_checks"] = {}
    for name, fn in case.baselines.items():
      if case.check is None and name != "numpy":
        row["baseline_checks"][name] = compare(fn(), reference, rtol, atol)
      elif case.check is not None:
        fn()  # warm-up only: the timed runs draw other resamples
    fns = {"kit": case.kit, **case.kit_variants, **case.baselines}
    times = interleaved_times(fns, repeats, max_seconds=max_seconds, min_seconds=min_seconds)
  except Exception as e:  # noqa: BLE001 - the kit may be mid-rewrite; report and go on
    row["error"] = f"{type(e).__name__}: {e}"
    row["load_average_after"] = load_average()
    return row
  row["times"] = {name: summarize(t) for name, t in times.items()}
  eligible = {name: row["times"][name]["min_s"] for name in case.baselines
              if name not in case.second_column
              and row["baseline_checks"].get(name, {"ok": True})["ok"]}
  if not eligible:  # every variant failed its check: compare with the reference anyway
    eligible = {name: row["times"][name]["min_s"] for name in list(case.baselines)[:1]}
  best = min(eligible, key=eligible.get)
  kit_min = row["times"]["kit"]["min_s"]
  row["best_baseline"] = best
  row["ratio_kit_over_best"] = kit_min / eligible[best]
  row["ratio_kit_over"] = {name: kit_min / row["times"][name]["min_s"] for name in case.baselines}
  for variant in case.kit_variants:
    row.setdefault("kit_variant_ratio_over_best", {})[variant] = (
        row["times"][variant]["min_s"] / eligible[best])
  if case.goal:
    ratio = row["ratio_kit_over"][case.goal["against"]]
    row["goal"] = {**case.goal, "ratio": ratio, "met": ratio <= case.goal["ratio_at_most"]}
  row["load_average_after"] = load_average()
  return row


def describe(options: dict) -> str:
  return ",".join(f"{k}={v}" for k, v in options.items() if k not in ("n", "level"))


def table_line(row: dict) -> str:
  head = f"{row['kernel']:<20} {describe(row['options'])[:34]:<34} {row['n']:>9}"
  if "error" in row:
    return f"{head}  ERROR {row['error'][:80]}"
  t = row["times"]
  check = row["check"]
  verdict = ("ok" if check["ok"] else "MISMATCH") + (
      f" {check['max_rel_err']:.1e}" if "max_rel_err" in check else f" {check.get('error', '')}")
  return (f"{head} {t['kit']['min_s'] * 1e3:>10.2f} {row['best_baseline']:<22} "
          f"{t[row['best_baseline']]['min_s'] * 1e3:>10.2f} {row['ratio_kit_over_best']:>6.2f}  {verdict}")


def summary(rows: list, sizes: list) -> dict:
  ok_rows = [r for r in rows if "error" not in r]
  per_kernel = [r for r in ok_rows if not r["kernel"].startswith("bootstrap")
                and r["kernel"] != "sweep_64_models" and r["n"] in sizes]
  slower = [{"kernel": r["kernel"], "options": r["options"], "n": r["n"],
             "ratio": r["ratio_kit_over_best"], "best_baseline": r["best_baseline"]}
            for r in per_kernel if r["ratio_kit_over_best"] > 1.0]
  return {
      "kernels_timed": len(per_kernel),
      "kernels_slower_than_best_baseline": slower,
      "goal_every_kernel_at_most_1x": not slower and bool(per_kernel),
      "batched_goals": [{"kernel": r["kernel"], **r["goal"]} for r in ok_rows if "goal" in r],
      "checks_failed": [{"kernel": r["kernel"], "options": r["options"], "n": r["n"], **r["check"]}
                        for r in ok_rows if not r["check"]["ok"]],
      "baseline_checks_failed": [{"kernel": r["kernel"], "n": r["n"], "baseline": name, **c}
                                 for r in ok_rows for name, c in r["baseline_checks"].items()
                                 if not c["ok"]],
      "errors": [{"kernel": r["kernel"], "options": r["options"], "n": r["n"], "error": r["error"]}
                 for r in rows if "error" in r],
  }


def print_summary(s: dict) -> None:
  """A few lines on stderr: the goals and every failure."""
  lines = ["", f"kernels timed: {s['kernels_timed']}; kit slower than the best baseline in "
               f"{len(s['kernels_slower_than_best_baseline'])}"]
  lines += [f"  batched goal {g['kernel']}: kit / {g['against']} = {g['ratio']:.2f} "
            f"(goal <= {g['ratio_at_most']}) {'met' if g['met'] else 'NOT met'}"
            for g in s["batched_goals"]]
  lines += [f"  CHECK FAILED {c['kernel']} {describe(c['options'])} n={c['n']}: "
            f"{c.get('error') or 'max rel err %.2e in %s' % (c['max_rel_err'], c['worst_field'])}"
            for c in s["checks_failed"]]
  lines += [f"  BASELINE CHECK FAILED {c['kernel']} n={c['n']} {c['baseline']}" for c in
            s["baseline_checks_failed"]]
  lines += [f"  ERROR {e['kernel']} {describe(e['options'])} n={e['n']}: {e['error'][:200]}"
            for e in s["errors"]]
  for line in lines:
    print(line, file=sys.stderr)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a smoke run: small n, 2 repeats")
  parser.add_argument("--only", default=None,
                      help=f"comma-separated kernels (or prefixes such as 'bootstrap'): {', '.join(KERNELS)}")
  parser.add_argument("--sizes", default=None, help="comma-separated n (default 1e5,1e6,1e7)")
  parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; 2 with --quick)")
  parser.add_argument("--min-seconds", type=float, default=None,
                      help="more rounds until a case has taken this long (default 1; 0 with --quick)")
  parser.add_argument("--with-loops", action="store_true",
                      help="also time the per-threshold float64 loop (a second column)")
  parser.add_argument("--rtol", type=float, default=1e-6)
  parser.add_argument("--atol", type=float, default=1e-7)
  parser.add_argument("--strict", action="store_true", help="exit 1 when a check failed")
  parser.add_argument("--no-torch", action="store_true", help="leave out the torch baselines")
  parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")
  args = parser.parse_args(argv)
  only = None if args.only is None else [o.strip() for o in args.only.split(",") if o.strip()]
  if only:
    unknown = [o for o in only if not any(selected(k, [o]) for k in KERNELS)]
    if unknown:
      parser.error(f"unknown kernel(s) {unknown}; choose from {', '.join(KERNELS)}")
  if args.sizes:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
  else:
    sizes = [1000, 10_000] if args.quick else [10**5, 10**6, 10**7]
  repeats = args.repeats or (2 if args.quick else 7)
  boot_n, boot_b, boot_check = (min(sizes[0], 2000), 20, 20) if args.quick else (10**5, 1000, 100)
  models_n = min(sizes[0], 1000) if args.quick else 10**5
  max_seconds = 10.0 if args.quick else 90.0
  min_seconds = args.min_seconds if args.min_seconds is not None else (0.0 if args.quick else 1.0)

  load_before = load_average()
  rows, table = [], [f"{'kernel':<20} {'options':<34} {'n':>9} {'kit ms':>10} {'best baseline':<22} "
                     f"{'ms':>10} {'ratio':>6}  check (max rel err)"]
  print(table[0], file=sys.stderr)

  def record(case: Case, case_repeats: int) -> None:
    row = run_case(case, case_repeats, args.rtol, args.atol, max_seconds, min_seconds)
    rows.append(row)
    table.append(table_line(row))
    print(table[-1], file=sys.stderr, flush=True)

  for n in sizes:
    d = Data(n, use_torch=not args.no_torch)
    cases = calibration_cases(d) + risk_coverage_cases(d) + sweep_cases(d, args.with_loops)
    for case in cases:
      if selected(case.kernel, only):
        record(case, repeats if n < 10**7 else min(repeats, 5))
    del d
  if selected("sweep_64_models", only):
    record(models_case(models_n), min(repeats, 5))
  for case in bootstrap_cases(boot_n, boot_b, boot_check, only):
    record(case, min(repeats, 5))

  payload = {
      "benchmark": "vs_numpy",
      **environment(),
      "torch": nb.torch.__version__ if nb.torch is not None else None,
      "torch_threads": nb.torch.get_num_threads() if nb.torch is not None else None,
      "threads_note": "NumPy runs on one thread; torch and XLA may use every core",
      "settings": {"quick": args.quick, "sizes": sizes, "repeats": repeats,
                   "min_seconds": min_seconds, "rtol": args.rtol,
                   "atol": args.atol, "bootstrap": {"n": boot_n, "num_resamples": boot_b,
                                                    "check_resamples": boot_check},
                   "models": {"count": NUM_MODELS, "n_per_model": models_n},
                   "data": "c ~ U(0.3, 1) float32, correct with probability c (seed 0)",
                   "timing": "interleaved rounds (at least `repeats`, more until a case took "
                             "`min_seconds`), min (headline) and median; compilation excluded"},
      "load_average_before": load_before,
      "load_average_after": load_average(),
      "rows": rows,
      "summary": summary(rows, sizes),
  }
  print_summary(payload["summary"])
  print(json.dumps(payload, indent=1))
  if args.out:
    write_json_atomic(args.out, payload)
  failed = payload["summary"]["checks_failed"] or payload["summary"]["errors"]
  return 1 if args.strict and failed else 0


if __name__ == "__main__":
  sys.exit(main())
