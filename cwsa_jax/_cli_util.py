"""Small helpers shared by the command-line subcommands: errors and atomic output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def add_synthetic_run_flags(p, *, default_out: str, seeds: int, num_samples: int) -> None:
  """--out, --force, --seeds, --n, --seed: the flags of the synthetic-model commands."""
  p.add_argument("--out", metavar="DIR",
                 help=f"output directory (default ./{default_out}, or {default_out}-2, -3, ... "
                 "when it exists)")
  p.add_argument("--force", action="store_true", help="replace an existing --out directory")
  p.add_argument("--seeds", type=int, default=seeds, help=f"seeds per model (default {seeds})")
  p.add_argument("--n", type=int, default=num_samples,
                 help=f"samples per model and seed (default {num_samples}, as in the paper)")
  p.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")


class UserError(Exception):
  """A problem the user can fix (bad file, bad flag): printed as one line, exit 2."""


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
  """Writes JSON to ``path`` through a temporary file and ``os.replace``."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(payload, f, indent=1, allow_nan=True)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
  """Yields a temporary directory that replaces ``out`` only if the block succeeds.

  An existing ``out`` is refused unless ``force``; with ``force`` it is
  replaced only after the new results are complete, so a failure never leaves
  a half-written result or destroys an earlier one.
  """
  out = Path(out)
  if out.exists() and not force:
    raise UserError(f"output directory {out} already exists (use --force to replace it)")
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if out.exists():
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / "previous")
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.replace(tmp, out)
