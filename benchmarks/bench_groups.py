"""Per-group sweep: cost of ``sweep_by_group`` against one ``sweep`` of the same data.

Usage: python benchmarks/bench_groups.py [--quick]

Prints a table (stderr) and JSON (stdout) with, for n in {1e5, 1e6} (1e5 only
with --quick), T = 50 and G in {1, 10, 100} groups: the time of one jitted
``sweep_by_group`` call and of one ``sweep`` call on the same data, measured
in the same process, and their ratio. Goal of issue 8: ratio <= 3 at
n = 1e6, T = 50, G = 100.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import best_time, emit  # noqa: E402

from cwsa_jax._groups import sweep_by_group  # noqa: E402
from cwsa_jax._sweep import sweep  # noqa: E402


def make_data(n: int, num_groups: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  ok = rng.uniform(size=n) < c
  groups = rng.integers(0, num_groups, n).astype(np.int32)
  return c, ok, groups


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
  args = parser.parse_args()
  sizes = [10**5] if args.quick else [10**5, 10**6]
  num_thresholds = 50
  th = jax.device_put(np.linspace(0.5, 0.99, num_thresholds).astype(np.float32))
  rows = []
  table = [f"{'n':>9} {'T':>4} {'G':>4} {'by_group ms':>12} {'sweep ms':>9} {'ratio':>6}"]
  for n in sizes:
    for g in [1, 10, 100]:
      c_np, ok_np, groups_np = make_data(n, g)
      c, ok, groups = (jax.device_put(x) for x in (c_np, ok_np, groups_np))
      repeats = 10
      t_sweep = best_time(lambda a, b, d: sweep(a, b, d), c, ok, th, repeats=repeats)
      t_group = best_time(lambda a, b, e, d: sweep_by_group(a, b, e, d, num_groups=g),
                          c, ok, groups, th, repeats=repeats)
      row = {"n": n, "T": num_thresholds, "num_groups": g, "sweep_by_group_s": t_group,
             "sweep_s": t_sweep, "ratio": t_group / t_sweep}
      rows.append(row)
      table.append(f"{n:>9} {num_thresholds:>4} {g:>4} {t_group*1e3:>12.2f} {t_sweep*1e3:>9.2f} "
                   f"{row['ratio']:>6.2f}")
  payload = {"rows": rows}
  if not args.quick:
    goal = [r for r in rows if r["n"] == 10**6 and r["num_groups"] == 100][0]
    payload["goals"] = {"ratio_n1e6_T50_G100": goal["ratio"], "ratio_goal": 3.0}
    table.append(f"goal: ratio at n=1e6, T=50, G=100 = {goal['ratio']:.2f} (<= 3)")
  emit("groups", payload, table=table)


if __name__ == "__main__":
  main()
