"""Fused threshold sweep: speed against a float64 NumPy loop, flatness in T, memory.

Usage: python benchmarks/bench_sweep.py [--quick]

Prints a table (stderr) and JSON (stdout) with, for n in {1e4, 1e5, 1e6, 1e7}
and T in {10, 50, 1000}: the time of one jitted ``sweep`` call, the time of one
plain pass over the same data (``jnp.sum`` of both arrays: the floor), and,
where it takes under a minute, a float64 NumPy loop over thresholds (the
baseline). Then the goals of issue 2: speed-up at n = 1e6, T = 50; the ratio
time(T = 1000)/time(T = 10) at n = 1e6; the peak memory of n = 1e7, T = 1000
measured in a fresh subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import best_time, emit  # noqa: E402

from cwsa_jax import sweep  # noqa: E402


def numpy_loop(confidences: np.ndarray, correct: np.ndarray, thresholds: np.ndarray):
  """The obvious float64 implementation: one masked pass per threshold."""
  c = confidences.astype(np.float64)
  ok = correct.astype(np.float64)
  out = np.zeros((len(thresholds), 4))
  for j, tau in enumerate(thresholds.astype(np.float64)):
    mask = c >= tau
    count = mask.sum()
    if count == 0:
      out[j] = (0.0, np.nan, 0.0, 0.0)
      continue
    phi = (c[mask] - tau) / (1.0 - tau)
    k = ok[mask]
    out[j] = (count / len(c), k.mean(), np.mean(phi * (2 * k - 1)), np.mean(phi * k))
  return out


def make_data(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  ok = rng.uniform(size=n) < c
  return c, ok


def memory_probe() -> dict:
  """Runs n = 1e7, T = 1000 in a fresh process; reports its peak RSS."""
  code = (
      "import resource, jax, numpy as np\n"
      "from cwsa_jax import sweep\n"
      "rng = np.random.default_rng(0)\n"
      "c = rng.uniform(0.3, 1.0, 10**7).astype(np.float32); ok = rng.uniform(size=10**7) < c\n"
      "th = np.linspace(0.0, 0.99, 1000).astype(np.float32)\n"
      "c, ok, th = jax.device_put(c), jax.device_put(ok), jax.device_put(th)\n"
      "del rng\n"
      "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
      "jax.block_until_ready(sweep(c, ok, th))\n"
      "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
      "print(before, after)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  before_kb, after_kb = map(int, out.stdout.split())
  return {"peak_rss_mb": after_kb / 1024, "rss_before_call_mb": before_kb / 1024,
          "call_increase_mb": (after_kb - before_kb) / 1024}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
  args = parser.parse_args()
  sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6, 10**7]
  num_thresholds = [10, 50, 1000]
  floor = jax.jit(lambda c, ok: jnp.sum(c) + jnp.sum(ok))
  rows, table = [], [f"{'n':>9} {'T':>5} {'sweep ms':>9} {'floor ms':>9} {'numpy ms':>10} {'speedup':>8} {'x floor':>8}"]
  for n in sizes:
    c_np, ok_np = make_data(n)
    c, ok = jax.device_put(c_np), jax.device_put(ok_np)
    t_floor = best_time(floor, c, ok, repeats=10)
    for t in num_thresholds:
      th_np = np.linspace(0.5, 0.99, t).astype(np.float32)
      th = jax.device_put(th_np)
      t_sweep = best_time(lambda a, b, d: sweep(a, b, d), c, ok, th, repeats=5 if n >= 10**7 else 10)
      t_numpy = None
      if n * t <= 5 * 10**7:
        t_numpy = best_time(numpy_loop, c_np, ok_np, th_np, repeats=2 if n * t > 10**7 else 3)
      row = {"n": n, "T": t, "sweep_s": t_sweep, "floor_s": t_floor, "numpy_loop_s": t_numpy,
             "speedup_vs_numpy": (t_numpy / t_sweep) if t_numpy else None,
             "ratio_to_floor": t_sweep / t_floor}
      rows.append(row)
      table.append(f"{n:>9} {t:>5} {t_sweep*1e3:>9.2f} {t_floor*1e3:>9.3f} "
                   f"{(t_numpy*1e3 if t_numpy else float('nan')):>10.1f} "
                   f"{(row['speedup_vs_numpy'] or float('nan')):>8.1f} {row['ratio_to_floor']:>8.1f}")
  payload = {"rows": rows}
  if not args.quick:
    by = {(r["n"], r["T"]): r for r in rows}
    payload["goals"] = {
        "speedup_n1e6_T50": by[(10**6, 50)]["speedup_vs_numpy"],
        "speedup_goal": 30.0,
        "flatness_T1000_over_T10_n1e6": by[(10**6, 1000)]["sweep_s"] / by[(10**6, 10)]["sweep_s"],
        "flatness_goal": 3.0,
        "memory_n1e7_T1000": memory_probe(),
        "memory_goal_mb": 1024,
    }
    table.append(json.dumps(payload["goals"]))
  emit("sweep", payload, table=table)


if __name__ == "__main__":
  main()
