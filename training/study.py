"""The selective-classification training study: every loss, several seeds, MNIST and CIFAR-10.

Usage: python -m cwsa_jax.training.study --data-dir DATA --out runs [--datasets mnist,cifar10]
       [--variants ce,cwsa,...] [--seeds 0,1,2] [--jobs 1] [--deadline-s S] [--print]

Each run is one ``cwsa-jax train`` command (printed with ``--print``, and
recorded by the run itself in ``config.json``), written to
``OUT/<dataset>-<variant>-s<seed>``; a run whose folder already holds a
``metrics.json`` is skipped, so the study resumes where it stopped. ``--jobs``
runs several at once (on a GPU several small CNNs share the device; on a
2-core CPU keep 1). No run starts after ``--deadline-s``; with
``--stop-after-s`` the runs still going then get a Ctrl-C (they remove their
partial output or keep their last checkpoint for ``--resume``).

The variants (one place; the README of ``results/training`` names the same):

* ``ce``: cross-entropy;
* ``label_smoothing``: cross-entropy with label smoothing 0.1 (optax);
* ``focal``: focal loss, gamma 3 (Mukhoti et al. 2020's fixed-gamma setting);
* ``inverse_focal``: inverse focal loss, gamma 3;
* ``soft_aurc``: cross-entropy + soft AURC (weight 1, pairwise-sigmoid temperature 0.01);
* ``cwsa``: cross-entropy + 1 - soft CWSA, the best setting of the first study per
  dataset: MNIST weight 0.5 with tau drawn from the band [0.5, 0.95], CIFAR-10
  weight 0.1 at tau 0.5 (weight 0.5 cost CIFAR-10 three points of accuracy).

``--compare DIR`` then runs ``cwsa-jax compare`` of every run against cross-entropy of the same
dataset and seed. Then ``python -m cwsa_jax.training.summarize OUT/* --out results/training
--compare DIR/*.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

VARIANTS: dict[str, dict[str, list[str]]] = {
    "ce": {},
    "label_smoothing": {"*": ["--label-smoothing", "0.1"]},
    "focal": {"*": ["--loss", "focal", "--focal-gamma", "3"]},
    "inverse_focal": {"*": ["--loss", "inverse_focal", "--focal-gamma", "3"]},
    "soft_aurc": {"*": ["--loss", "soft_aurc", "--soft-aurc-weight", "1", "--soft-aurc-temperature",
                        "0.01"]},
    "cwsa": {"mnist": ["--loss", "cwsa", "--cwsa-weight", "0.5", "--cwsa-tau", "0.5",
                       "--cwsa-temperature", "0.05", "--cwsa-band", "0.5", "0.95"],
             "cifar10": ["--loss", "cwsa", "--cwsa-weight", "0.1", "--cwsa-tau", "0.5",
                         "--cwsa-temperature", "0.05"]},
}


def run_name(dataset: str, variant: str, seed: int) -> str:
  return f"{dataset}-{variant}-s{seed}"


def parse_run_name(name: str) -> tuple[str, str, int]:
  """``(dataset, variant, seed)`` of a run folder named by :func:`run_name`."""
  match = re.fullmatch(r"([a-z0-9]+)-(.+)-s(\d+)", name)
  if match is None:
    raise ValueError(f"{name!r} is not a run name DATASET-VARIANT-sSEED")
  dataset, variant, seed = match.groups()
  return dataset, variant, int(seed)


def train_args(dataset: str, variant: str, seed: int, data_dir: str, out: Path) -> list[str]:
  """The ``cwsa-jax train`` arguments of one run."""
  flags = VARIANTS[variant]
  extra = flags.get(dataset, flags.get("*", []))
  return ["train", "--dataset", dataset, "--seed", str(seed), *extra, "--data-dir", data_dir,
          "--out", str(out / run_name(dataset, variant, seed)), "--no-progress"]


def _out_of(train: list[str]) -> Path:
  return Path(train[train.index("--out") + 1])


def _csv(text: str) -> list[str]:
  return [s.strip() for s in text.split(",") if s.strip()]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data-dir", required=True, help="folder with mnist/ and cifar10/")
  parser.add_argument("--out", required=True, help="folder of the run folders")
  parser.add_argument("--datasets", default="mnist,cifar10")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
  parser.add_argument("--deadline-s", type=float, default=None, help="start no run after this")
  parser.add_argument("--stop-after-s", type=float, default=None,
                      help="Ctrl-C the runs still going after this many seconds")
  parser.add_argument("--max-steps", type=int, default=None,
                      help="stop each run after this many steps (to test the study)")
  parser.add_argument("--compare", default=None, metavar="DIR",
                      help="then compare every finished run against cross-entropy of the same dataset "
                      "and seed (cwsa-jax compare A B --out DIR/DATASET-sSEED-LOSS-vs-ce.json)")
  parser.add_argument("--print", action="store_true", help="print the commands, run nothing")
  args = parser.parse_args(argv)
  out = Path(args.out)
  variants = _csv(args.variants)
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    parser.error(f"unknown variant(s) {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
  # Seed-major order: a study stopped early still has complete seeds of every variant.
  queue = [train_args(ds, v, int(s), args.data_dir, out)
           for s in _csv(args.seeds) for ds in _csv(args.datasets) for v in variants]
  if args.max_steps is not None:
    queue = [[*a, "--max-steps", str(args.max_steps)] for a in queue]
  if args.print:
    for a in queue:
      print(shlex.join(["cwsa-jax", *(x for x in a if x != "--no-progress")]))
    return 0
  queue = [a for a in queue if not (_out_of(a) / "metrics.json").exists()]
  out.mkdir(parents=True, exist_ok=True)
  start = time.monotonic()
  running: dict[subprocess.Popen, tuple[str, float]] = {}
  failed = 0
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  runner = [sys.executable, "-c", "import sys; from cwsa_jax.cli import main; sys.exit(main())"]
  stopped = False
  while queue or running:
    elapsed = time.monotonic() - start
    if args.deadline_s is not None and elapsed > args.deadline_s and queue:
      print(f"study: deadline reached, {len(queue)} run(s) not started", flush=True)
      queue = []
    if args.stop_after_s is not None and elapsed > args.stop_after_s and running and not stopped:
      print(f"study: stopping {len(running)} run(s) still going", flush=True)
      for p in running:
        p.send_signal(signal.SIGINT)
      stopped = True
    while queue and len(running) < args.jobs:
      a = queue.pop(0)
      name = _out_of(a).name
      log = open(out / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
      p = subprocess.Popen([*runner, *a], stdout=log, stderr=subprocess.STDOUT, env=env)
      log.close()
      running[p] = (name, time.monotonic())
      print(f"study: [{elapsed:6.0f} s] started {name}", flush=True)
    time.sleep(0.5)
    for p in [p for p in running if p.poll() is not None]:
      name, began = running.pop(p)
      failed += p.returncode != 0
      print(f"study: [{time.monotonic() - start:6.0f} s] {name} exit {p.returncode} "
            f"({time.monotonic() - began:.0f} s)", flush=True)
  print(f"study: done in {time.monotonic() - start:.0f} s, {failed} failed", flush=True)
  if args.compare:
    failed += compare_with_ce(out, Path(args.compare), runner, env)
  return 1 if failed else 0


def compare_with_ce(runs: Path, out: Path, runner: list[str], env: dict) -> int:
  """``cwsa-jax compare`` of each finished run with the cross-entropy run of its dataset and
  seed (1000 paired resamples); the printed table goes to a .txt beside the JSON."""
  out.mkdir(parents=True, exist_ok=True)
  failed = 0
  for predictions in sorted(runs.glob("*-s*/predictions.npz")):
    dataset, variant, seed = parse_run_name(predictions.parent.name)
    baseline = runs / run_name(dataset, "ce", seed) / "predictions.npz"
    if variant == "ce" or not baseline.exists():
      continue
    name = f"{dataset}-s{seed}-{variant}-vs-ce"
    with open(out / f"{name}.txt", "w") as log:
      code = subprocess.call([*runner, "compare", str(predictions), str(baseline), "--out",
                              str(out / f"{name}.json"), "--no-progress"], stdout=log,
                             stderr=subprocess.STDOUT, env=env)
    failed += code != 0
    print(f"study: compare {name} exit {code}", flush=True)
  return failed


if __name__ == "__main__":
  sys.exit(main())
