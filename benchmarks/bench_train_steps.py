"""``cwsa-jax train`` steps per second: data parallel (the default) against one device, and
against an older checkout of the code.

Usage: python benchmarks/bench_train_steps.py [--dataset mnist] [--steps 300] [--rounds 3]
       [--old-tree PATH] [--out results/benchmarks/train_steps.json]

Each run is ``cwsa-jax train --dataset D --epochs 1 --max-steps S --no-progress`` in a fresh
process (local data: ``CWSA_JAX_DATA_DIR``). The variants run interleaved, one after the
other, ``--rounds`` times: ``default`` (one CPU device per core, the batch split over them),
``devices=1``, and with ``--old-tree PATH`` the code of that checkout (e.g. ``git worktree add
/tmp/old 5d45e12``; run with ``PYTHONPATH=PATH``, which must import its own ``cwsa_jax``).
A run's rate is the steps between its first progress update (step 20, after compilation)
and its last one, over the time between them: the loop synchronises at each update. The
load average is recorded before each run; min and median per variant, and the ratios of
the medians to the old code's, are printed as JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, load_average  # noqa: E402

_MARK = "STEPS/S"


def child(argv: list[str]) -> int:
  """Runs ``cwsa-jax train argv`` with a progress hook that records (time, step) at each
  update, then prints the rate and the module it measured."""
  import cwsa_jax.cli  # noqa: PLC0415
  if hasattr(cwsa_jax.cli, "__path__"):  # the current layout
    from cwsa_jax.training import train  # noqa: PLC0415
  else:  # older checkouts: a top-level training package
    from training import train  # noqa: PLC0415
  marks = []

  class Marks:
    def __init__(self, total, desc, enabled=True):
      self.n = 0

    def update(self, n, **postfix):
      self.n += n
      if n:
        marks.append((time.perf_counter(), self.n))

    def close(self):
      pass

  train.Progress = Marks
  code = cwsa_jax.cli.main(["train", *argv])
  (t0, s0), (t1, s1) = marks[0], marks[-1]
  print(f"{_MARK} {(s1 - s0) / (t1 - t0):.4f} {s1 - s0} {t1 - t0:.3f} {train.__file__}")
  return code


def run(variant: str, args: argparse.Namespace, folder: str) -> dict:
  env = dict(os.environ)
  extra = []
  if variant == "old":
    env["PYTHONPATH"] = args.old_tree
  elif variant == "devices=1":
    extra = ["--devices", "1"]
  out = os.path.join(folder, variant.replace("=", ""))
  load = load_average()
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", "--dataset", args.dataset,
       "--epochs", "1", "--max-steps", str(args.steps), "--no-progress", "--out", out, *extra],
      env=env, capture_output=True, text=True, check=False)
  line = [x for x in proc.stdout.splitlines() if x.startswith(_MARK)]
  if proc.returncode or not line:
    raise SystemExit(f"{variant}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
  _, rate, steps, seconds, module = line[0].split(maxsplit=4)
  subprocess.run(["rm", "-rf", out], check=True)
  return {"variant": variant, "steps_per_s": float(rate), "steps": int(steps),
          "seconds": float(seconds), "module": module, "load_average_before": load}


def summarize(rows: list[dict], variants: list[str]) -> dict:
  """Min, median and max steps/s per variant; with an "old" variant, each median over its median."""
  summary = {}
  for v in variants:
    rates = sorted(x["steps_per_s"] for x in rows if x["variant"] == v)
    summary[v] = {"min": rates[0], "median": round(statistics.median(rates), 4),
                  "max": rates[-1]}
  if "old" in summary:
    for v in summary:
      if v != "old":
        summary[v]["median_vs_old"] = round(summary[v]["median"] / summary["old"]["median"], 3)
  return summary


def main() -> None:
  if "--child" in sys.argv:
    argv = [a for a in sys.argv[1:] if a != "--child"]
    raise SystemExit(child(argv))
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--dataset", default="mnist", choices=("mnist", "cifar10"))
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--old-tree", help="a checkout of older code to compare with")
  p.add_argument("--out", help="also write the JSON here")
  args = p.parse_args()
  variants = (["old"] if args.old_tree else []) + ["default", "devices=1"]
  rows = []
  with tempfile.TemporaryDirectory() as folder:
    for r in range(args.rounds):
      for v in variants:
        row = run(v, args, folder)
        rows.append({"round": r, **row})
        print(f"round {r} {v}: {row['steps_per_s']:.2f} steps/s (load {row['load_average_before']})",
              file=sys.stderr)
  summary = summarize(rows, variants)
  payload = {"dataset": args.dataset,
             "steps": args.steps, "rounds": args.rounds, "old_tree": args.old_tree,
             "rows": rows, "summary": summary, "load_average_after": load_average()}
  emit("train_steps", payload, out=args.out)


if __name__ == "__main__":
  main()
