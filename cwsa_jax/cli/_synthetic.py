"""What the commands on the paper's synthetic models (``demo``, ``reproduce-paper``) share:
their flags, the checks before a run, the ``config`` of metrics.json and the closing line."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from cwsa_jax import synthetic
from cwsa_jax.cli import _output
from cwsa_jax.cli._util import UserError, add_output_flags, add_progress_flag


def add_flags(p: argparse.ArgumentParser, *, default_out: str, seeds: int) -> None:
  """--out, --force, --seeds, --n, --seed, --no-progress."""
  add_output_flags(p, default_out=default_out)
  p.add_argument("--seeds", type=int, default=seeds, help=f"seeds per model (default {seeds})")
  num_samples = synthetic.PAPER_NUM_SAMPLES
  p.add_argument("--n", type=int, default=num_samples,
                 help=f"samples per model and seed (default {num_samples}, as in the paper)")
  p.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")
  add_progress_flag(p)


def out_hint(default_out: str) -> str:
  """Appended to "already exists": the fresh default folder is the other way out."""
  return f", or omit --out for a fresh ./{default_out}-N"


def output_dir(args: argparse.Namespace, *, default_out: str, min_seeds: int = 1,
               why: str = "") -> Path:
  """Checks --seeds (at least ``min_seeds``, ``why`` says why), --n and the output folder
  before any work; returns the folder (a fresh ``./default_out-N`` without --out)."""
  if args.seeds < min_seeds:
    raise UserError(f"--seeds must be >= {min_seeds}{why}, got {args.seeds}")
  if args.n < 2:
    raise UserError(f"--n must be >= 2, got {args.n}")
  out = args.out if args.out is not None else _output.fresh_output_dir(default_out)
  return _output.check_output_dir(out, force=args.force, hint=out_hint(default_out))


def config_json(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
  """The run's ``config`` in metrics.json: seeds, samples, classes and ``extra``."""
  return {"seed": args.seed, "seeds": args.seeds, "n": args.n,
          "num_classes": synthetic.PAPER_NUM_CLASSES, **extra}


def model_parameters(model: str) -> dict[str, Any]:
  """The published generator's parameters of a synthetic ``model`` (JSON-ready)."""
  return {k: (list(v) if isinstance(v, tuple) else v)
          for k, v in synthetic.PAPER_PARAMETERS[model].items()}


def print_written(out: Path, num_figures: int, start: float) -> None:
  """The closing line: what was written where, and how long the run took."""
  print(f"\nWrote {out}/report.md, {out}/metrics.json and {num_figures} figures "
        f"in {time.perf_counter() - start:.1f} s")
