"""How fast NumPy sorts integer keys with each of its SIMD dispatches, beside torch.sort and XLA's sort.

Usage: python benchmarks/bench_numpy_sort.py [--sizes 1e5,1e6,1e7] [--repeats 7]
       [--out results/benchmarks/numpy_sort.json]

The kit's rank metrics sort with NumPy on the CPU (``cwsa_jax/_kernels/_sort.py``), so their speed
follows NumPy's sort, and NumPy picks its sort by the CPU features it dispatches to when
it is imported. This script times, in two child processes, one with NumPy's default
dispatch and one started with ``NPY_DISABLE_CPU_FEATURES=X86_V4`` (no AVX-512: NumPy's
AVX2 sort), the sorts the kit and the baselines use on random keys: ``np.sort`` of int32
and of int64, the kit's radix stable order (``_sort._numpy_stable_order``), and in the
first child ``torch.sort`` of int32 (when torch is installed; both cores) and ``lax.sort``
(XLA's CPU sort, n <= 1e6). Minimum and median of ``--repeats`` interleaved rounds; each child
checks the sorts equal first. Prints JSON (both children's rows, each with its
``numpy_simd``) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, interleaved_times, load_average, numpy_simd, summarize  # noqa: E402

DISPATCHES = {"default": None, "avx2": "X86_V4"}


def child(sizes: list[int], repeats: int, with_others: bool) -> dict:
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from cwsa_jax._kernels import _sort  # noqa: PLC0415

  torch = None
  if with_others:
    try:
      import torch  # noqa: PLC0415
    except ImportError:
      torch = None
  rows = []
  rng = np.random.default_rng(0)
  for n in sizes:
    keys = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)
    wide = keys.astype(np.int64) << 31 | np.arange(n, dtype=np.int64)
    fns = {"np.sort int32": lambda: np.sort(keys), "np.sort int64": lambda: np.sort(wide),
           "radix stable order int32": lambda: _sort._numpy_stable_order(keys)}
    want = np.sort(keys)
    assert np.array_equal(keys[_sort._numpy_stable_order(keys)], want)
    if torch is not None:
      tkeys = torch.from_numpy(keys)
      assert np.array_equal(torch.sort(tkeys).values.numpy(), want)
      fns["torch.sort int32"] = lambda: torch.sort(tkeys)
    if with_others and n <= 10**6:  # XLA's CPU sort takes seconds at 1e7
      xla_sort = jax.jit(jax.lax.sort)
      jkeys = jax.numpy.asarray(keys)
      assert np.array_equal(np.asarray(xla_sort(jkeys)), want)
      fns["lax.sort int32 (XLA:CPU)"] = lambda: xla_sort(jkeys)
    for fn in fns.values():  # compilation, first allocations
      jax.block_until_ready(fn())
    times = interleaved_times(fns, repeats if n < 10**7 else min(repeats, 3))
    rows.append({"n": n, "times": {k: summarize(v) for k, v in times.items()}})
  return {"numpy_simd": numpy_simd(), "rows": rows,
          "torch": None if torch is None else torch.__version__,
          "torch_threads": None if torch is None else torch.get_num_threads()}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="1e5,1e6,1e7")
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--out", help="also write the JSON here")
  p.add_argument("--child", choices=tuple(DISPATCHES), help=argparse.SUPPRESS)
  args = p.parse_args()
  sizes = [int(float(x)) for x in args.sizes.split(",")]
  if args.child:
    print(json.dumps(child(sizes, args.repeats, with_others=args.child == "default")))
    return
  runs, load_before = {}, load_average()
  for name, disabled in DISPATCHES.items():
    env = dict(os.environ)
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    if disabled:
      env["NPY_DISABLE_CPU_FEATURES"] = disabled
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name,
                           "--sizes", args.sizes, "--repeats", str(args.repeats)],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
  table = []
  for name, run in runs.items():
    for row in run["rows"]:
      cells = ", ".join(f"{k} {v['min_s'] * 1e3:.2f} ms" for k, v in row["times"].items())
      table.append(f"{name:8s} n={row['n']:>9d}: {cells}")
  emit("numpy_sort", {"settings": {"sizes": sizes, "repeats": args.repeats,
                                   "data": "uniform random int32 keys (seed 0); int64: key << 31 | position",
                                   "timing": "interleaved rounds, min (headline) and median"},
                      "dispatches": {k: v or "(NumPy default)" for k, v in DISPATCHES.items()},
                      "load_average_before": load_before, "runs": runs,
                      "load_average_after": load_average()},
       table=table, out=args.out)


if __name__ == "__main__":
  main()
