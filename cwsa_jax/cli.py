"""The ``cwsa-jax`` command line.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``,
which registers the parser and sets ``func`` (a callable taking the parsed
arguments and returning an exit code). Errors a user can fix (bad files,
bad flags) are raised as :class:`UserError` and printed as one line on stderr
with exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cwsa_jax._cli_util import UserError

# Subcommand modules, in the order `--help` lists them. Modules that are not
# installed yet (optional parts of the kit) are skipped.
_COMMANDS = (
    "cwsa_jax._cmd_demo",
    "cwsa_jax._cmd_evaluate",
    "cwsa_jax._cmd_compare",
    "cwsa_jax._cmd_reproduce",
    "training._cmd_train",
)


def build_parser() -> argparse.ArgumentParser:
  from cwsa_jax import __version__
  parser = argparse.ArgumentParser(
      prog="cwsa-jax",
      description="Confidence-weighted selective accuracy (CWSA, CWSA+) and selective-prediction "
      "metrics in JAX: evaluate predictions, sweep thresholds, train with a CWSA-regularized loss.")
  parser.add_argument("--version", action="version", version=f"cwsa-jax {__version__}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  for name in _COMMANDS:
    try:
      module = importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name == name:
        continue
      raise
    module.add_parser(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not getattr(args, "func", None):
    parser.print_help()
    return 2
  try:
    return int(args.func(args) or 0)
  except UserError as e:
    print(f"cwsa-jax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"cwsa-jax {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
