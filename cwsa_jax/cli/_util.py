"""Small helpers shared by the commands: errors, flags, progress bars, atomic JSON files.

The output folders and their safety rules live in :mod:`cwsa_jax.cli._output`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Iterator


def add_output_flags(p, *, default_out: str) -> None:
  """--out DIR and --force of the commands that write an output folder."""
  p.add_argument("--out", metavar="DIR",
                 help=f"output folder (default ./{default_out}, or {default_out}-2, -3, ... "
                 "when taken)")
  p.add_argument("--force", action="store_true",
                 help="replace an existing --out folder written by cwsa-jax (a folder holding "
                 "files cwsa-jax did not write is refused)")


def add_progress_flag(p) -> None:
  p.add_argument("--no-progress", action="store_true",
                 help="no progress bars on stderr (they show only when stderr is a terminal, "
                 "or with CWSA_JAX_PROGRESS=1)")


def progress_enabled(args: Any) -> bool:
  """Progress bars on stderr: off with --no-progress or CWSA_JAX_PROGRESS=0, on with
  CWSA_JAX_PROGRESS=1, else only when stderr is a terminal."""
  if getattr(args, "no_progress", False):
    return False
  forced = os.environ.get("CWSA_JAX_PROGRESS", "")
  if forced in ("0", "1"):
    return forced == "1"
  return sys.stderr.isatty()


class _NoBar:
  def update(self, n: int = 1) -> None:
    pass


@contextlib.contextmanager
def progress_bar(total: int, desc: str, *, enabled: bool, unit: str = "it") -> Iterator[Any]:
  """A tqdm bar on stderr (``update(n)``), or an object that does nothing."""
  try:
    from tqdm import tqdm  # noqa: PLC0415
  except ImportError:  # tqdm is optional: no bars
    enabled = False
  if not enabled:
    yield _NoBar()
    return
  with tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
            mininterval=0.5, leave=False) as bar:
    yield bar


@contextlib.contextmanager
def stage(desc: str, *, enabled: bool) -> Iterator[None]:
  """A one-step bar for a long step that reports no progress of its own (loading, figures)."""
  with progress_bar(1, desc, enabled=enabled, unit="step") as bar:
    yield
    bar.update(1)


class UserError(Exception):
  """A problem the user can fix (bad file, bad flag): printed as one line, exit 2."""


def temp_name(name: str, kind: str = "tmp") -> str:
  """``.NAME.cwsa-KIND-PID-XXXXXXXX``: the name of a temporary beside ``NAME``."""
  return f".{name}.cwsa-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
  """Writes JSON to ``path`` through a temporary file beside it and ``os.replace``.

  The file gets mode ``0o666 & ~umask``, like any file the user creates.
  """
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / temp_name(path.name)
  try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(payload, f, indent=1, allow_nan=True)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise

