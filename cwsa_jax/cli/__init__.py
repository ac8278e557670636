"""The ``cwsa-jax`` command line: commands, reports, file input and output.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``,
which registers the parser and sets ``func`` (a callable taking the parsed
arguments and returning an exit code). Errors a user can fix (bad files,
bad flags) are raised as :class:`UserError` and printed as one line on stderr
with exit status 2; no traceback. So is any ``OSError`` (a full disk, a
read-only folder). Ctrl-C ends every command with status 130 within seconds
and leaves no partial output (:mod:`cwsa_jax.cli._interrupt`).

The modules, from the entry point down:

- commands: ``_demo``, ``_evaluate`` (``_stream``: its ``--stream`` mode),
  ``_compare``, ``_reproduce`` (and ``cwsa_jax.training._cmd_train``);
  ``_synthetic`` holds what the two commands on the paper's synthetic models share;
- reports: ``_metrics`` computes them as typed results, ``_json`` writes
  metrics.json, ``_markdown`` report.md (numbers and tables from ``_format``),
  ``_figures`` the PNGs; ``_settings`` holds the conventions, ``_intervals``
  the bootstrap;
- files: ``_io`` and ``_csv`` read predictions, ``_output`` writes output
  folders safely, ``_interrupt`` handles Ctrl-C, ``_util`` the shared flags.

They use the library through its public names (``import cwsa_jax as cw``), and
the bootstrap's progress hook for the progress bars (in ``_intervals``); the
metrics of computed sweeps (``_select.select_from_sweep`` and ``_aumcc.area``, in
``_metrics``) and the key layout of :mod:`cwsa_jax.streaming` (in ``_stream``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

import jax

import cwsa_jax
from cwsa_jax.cli import _interrupt
from cwsa_jax.cli._util import UserError

# Subcommands in the order `--help` lists them: (name, module, the optional
# modules a run with these arguments needs, checked before it starts).
_COMMANDS = (
    ("demo", "cwsa_jax.cli._demo", lambda args: ("matplotlib",)),
    ("evaluate", "cwsa_jax.cli._evaluate",
     lambda args: () if getattr(args, "no_figures", False) else ("matplotlib",)),
    ("compare", "cwsa_jax.cli._compare", lambda args: ()),
    ("reproduce-paper", "cwsa_jax.cli._reproduce", lambda args: ("matplotlib",)),
    ("train", "cwsa_jax.training._cmd_train", lambda args: ("flax", "optax")),
)

# Optional modules: (the distribution to install, the extra of pyproject.toml that has it).
# The core install (jax, numpy) has none of them.
_OPTIONAL = {
    "matplotlib": ("matplotlib", "plots"),
    "flax": ("flax", "train"),
    "optax": ("optax", "train"),
    "tensorflow_datasets": ("tensorflow-datasets", "train"),
    "PIL": ("pillow", "train"),
    "pyarrow": ("pyarrow", "parquet"),
}


def missing_extra_message(module: str) -> str | None:
  """One line naming the extra that installs ``module``; None if no extra does."""
  top = (module or "").partition(".")[0]
  if top not in _OPTIONAL:
    return None
  distribution, extra = _OPTIONAL[top]
  return (f"needs {distribution}, which is not installed (an optional part of cwsa-jax): "
          f"pip install 'cwsa-jax[{extra}]'")


def _is_installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def _missing_module(args: argparse.Namespace) -> str | None:
  """The first optional module the parsed command needs and cannot import, else None."""
  if getattr(args, "missing_module", None):
    return args.missing_module
  for name, _, needs in _COMMANDS:
    if name == args.command:
      return next((m for m in needs(args) if not _is_installed(m)), None)
  return None


def build_parser() -> argparse.ArgumentParser:
  """The ``cwsa-jax`` parser with every subcommand (a stub naming the extra for those whose
  optional dependencies are missing)."""
  parser = argparse.ArgumentParser(
      prog="cwsa-jax",
      description="Confidence-weighted selective accuracy (CWSA, CWSA+) and selective-prediction "
      "metrics in JAX: evaluate predictions, sweep thresholds, train with a CWSA-regularized loss.")
  parser.add_argument("--version", action="version", version=f"cwsa-jax {cwsa_jax.__version__}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  for command, name, _ in _COMMANDS:
    try:
      module = importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name == name:
        continue
      if missing_extra_message(e.name) is None:
        raise
      # Registered anyway, so that running it names the extra to install.
      stub = sub.add_parser(command, add_help=False, help=missing_extra_message(e.name))
      stub.set_defaults(func=None, missing_module=e.name)
      continue
    module.add_parser(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  """Runs ``cwsa-jax`` with ``argv`` (default: the process's arguments); returns the exit status."""
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv)
  missing = _missing_module(args) if getattr(args, "command", None) else None
  if missing:
    print(f"cwsa-jax {args.command}: error: {missing_extra_message(missing)}", file=sys.stderr)
    return 2
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  if not getattr(args, "func", None):
    parser.print_help()
    return 2
  label = f"cwsa-jax {args.command}"
  # The commands compute in 32 bits whatever JAX_ENABLE_X64 says (the kit's definitions).
  with _interrupt.guard(label), jax.enable_x64(False):
    try:
      code = int(args.func(args) or 0)
      _interrupt.check()  # a Ctrl-C whose KeyboardInterrupt Python dropped (in a __del__)
      return code
    except KeyboardInterrupt:
      pass
    except ModuleNotFoundError as e:
      if missing_extra_message(e.name) is None:
        raise
      print(f"{label}: error: {missing_extra_message(e.name)}", file=sys.stderr)
      return 2
    except (UserError, OSError) as e:
      if not _interrupt.interrupted():
        print(f"{label}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception:
      # A Ctrl-C that lands inside a C extension can surface as another error (matplotlib's
      # renderer: "Invalid bounding box"); after a Ctrl-C it is part of the interruption.
      if not _interrupt.interrupted():
        raise
  print(f"{label}: interrupted", file=sys.stderr)
  if argv is None:  # the program itself, not a caller: end without interpreter teardown
    _interrupt.exit_now()
  return _interrupt.EXIT_INTERRUPTED


def _one_line(error: Exception) -> str:
  """The message of a UserError, or ``FILE: reason`` of an OSError, on one line."""
  text = str(error)
  if isinstance(error, OSError) and error.strerror:
    text = f"{error.filename}: {error.strerror}" if error.filename is not None else error.strerror
  return " ".join(text.split())

