"""``cwsa-jax compare A B``: paired bootstrap comparison of two models on the same test set."""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from cwsa_jax import _io
from cwsa_jax import _output
from cwsa_jax import _report
from cwsa_jax._cli_util import (UserError, add_progress_flag, progress_bar, progress_enabled,
                                stage)

HEADERS = ("metric", "A", "B", "A - B", "low", "high", "p")


# A percentile interval's ends are order statistics of the resamples: with fewer than
# MIN_TAIL_RESAMPLES beyond each end they are noise; with fewer than MIN_BOOTSTRAP_SAMPLES
# samples the resamples take so few distinct values that the intervals mean nothing.
MIN_TAIL_RESAMPLES = 5
MIN_BOOTSTRAP_SAMPLES = 10


def add_bootstrap_flags(p: argparse.ArgumentParser, *, default_resamples: int,
                        allow_zero: bool = True) -> None:
  """--bootstrap N, --level L, --seed S (shared by evaluate and compare)."""
  p.add_argument("--bootstrap", type=int, default=default_resamples, metavar="N",
                 help=f"bootstrap resamples for the intervals (default {default_resamples}; at "
                 f"least {min_resamples(0.95)} for 95%% intervals"
                 + ("; 0 = no intervals)" if allow_zero else ")"))
  p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
  p.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")


def min_resamples(level: float) -> int:
  """The fewest resamples that leave MIN_TAIL_RESAMPLES beyond each end of a ``level`` interval."""
  return math.ceil(round(2 * MIN_TAIL_RESAMPLES / (1.0 - level), 6))


def check_bootstrap_flags(args: argparse.Namespace, *, allow_zero: bool) -> None:
  """Refuses a --level outside (0, 1) and too few --bootstrap resamples for that level."""
  if not 0.0 < args.level < 1.0:
    raise UserError(f"--level must lie in (0, 1), got {args.level}")
  if args.bootstrap < (0 if allow_zero else 1):
    raise UserError(f"--bootstrap must be >= {0 if allow_zero else 1}, got {args.bootstrap}")
  fewest = min_resamples(args.level)
  if 0 < args.bootstrap < fewest:
    raise UserError(f"--bootstrap {args.bootstrap} is too few resamples for {args.level * 100:g}% "
                    f"intervals: fewer than {MIN_TAIL_RESAMPLES} would fall beyond each end; "
                    f"use at least {fewest}" + (" (or 0 for no intervals)" if allow_zero else ""))


def bootstrap_resamples(args: argparse.Namespace, num_samples: int, *, refuse: bool) -> int:
  """``args.bootstrap``, or 0 when ``num_samples`` is too few to resample.

  With ``refuse`` too few samples is a :class:`UserError`; else a warning on
  stderr says that no intervals are reported.
  """
  if not args.bootstrap or num_samples >= MIN_BOOTSTRAP_SAMPLES:
    return args.bootstrap
  message = (f"n = {num_samples} sample(s) is too few for bootstrap intervals (need at least "
             f"{MIN_BOOTSTRAP_SAMPLES})")
  if refuse:
    raise UserError(message)
  print(f"cwsa-jax {args.command}: warning: {message}; no intervals reported", file=sys.stderr)
  return 0


def run(args: argparse.Namespace) -> int:
  from cwsa_jax import _bootstrap, _intervals  # noqa: PLC0415 - imports JAX

  check_bootstrap_flags(args, allow_zero=False)
  thresholds = tuple(float(t) for t in _report.parse_thresholds(args.thresholds))
  if args.out is not None:
    _output.check_output_file(args.out, force=args.force, command="compare",
                              inputs=(args.a, args.b))
  show = progress_enabled(args)
  with stage("loading", enabled=show):
    a, b = (_io.load_predictions(p, scores=args.scores) for p in (args.a, args.b))
  if len(a.confidences) != len(b.confidences):
    raise UserError(f"{args.a} has {len(a.confidences)} samples and {args.b} has "
                    f"{len(b.confidences)}: a paired comparison needs the same test set")
  labels_a, labels_b = _io.label_values(a), _io.label_values(b)
  if labels_a is not None and labels_b is not None and not np.array_equal(labels_a, labels_b):
    raise UserError(f"{args.a} and {args.b} have different labels: not the same test set "
                    "(or not in the same order)")
  bootstrap_resamples(args, len(a.confidences), refuse=True)
  settings = _report.Settings(thresholds=thresholds)
  with progress_bar(args.bootstrap, "bootstrap", enabled=show, unit="resample") as bar, \
      _bootstrap.reporting(bar.update):
    comp = _intervals.comparison((a.confidences, a.correct), (b.confidences, b.correct), settings,
                                 num_resamples=args.bootstrap, level=args.level, seed=args.seed)
  print(f"A = {args.a}\nB = {args.b}\nn = {len(a.confidences)} (paired), {args.bootstrap} "
        f"resamples, {args.level:.0%} intervals of A - B, two-sided bootstrap p-values")
  print(_report.text_table(HEADERS, _intervals.comparison_rows(comp, thresholds)))
  unchecked = [str(f) for f, labels in ((args.a, labels_a), (args.b, labels_b)) if labels is None]
  if unchecked:
    print(f"\nnote: {' and '.join(unchecked)} {'hold' if len(unchecked) > 1 else 'holds'} no "
          "labels (only confidences and correctness), so compare cannot check that A and B are "
          "the same test set in the same order: make sure they are")
  if args.out is not None:
    _output.check_output_file(args.out, force=args.force, command="compare",
                              inputs=(args.a, args.b))
    _output.write_output_file(args.out, _output.json_text(
        {"command": "compare", "a": str(args.a), "b": str(args.b), "n": len(a.confidences),
         "labels_checked": not unchecked, "settings": settings.to_json(), **comp}))
    print(f"\nWrote {args.out}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser(
      "compare", help="paired comparison of two models' predictions on the same test set",
      description="Paired percentile bootstrap of A - B for accuracy, ECE, AURC, E-AURC, AUGRC and "
      "CWSA, CWSA+, selective accuracy and coverage at the given thresholds: the difference, its "
      "interval and a two-sided p-value. Both files must hold the same test samples in the same "
      "order (same formats as `evaluate`); that is checked only when both hold the true labels, "
      "not for confidence,correct files.")
  p.add_argument("a", help="predictions of model A (.csv, .npz or .npy)")
  p.add_argument("b", help="predictions of model B")
  p.add_argument("--thresholds", default="0.5,0.9", metavar="SPEC",
                 help="thresholds for CWSA & co. (default 0.5,0.9; same syntax as evaluate)")
  p.add_argument("--scores", choices=_io.SCORE_KINDS, default="auto",
                 help="how to read a score matrix: probabilities or logits (default: auto)")
  p.add_argument("--out", metavar="FILE.json", help="also write the comparison as JSON")
  p.add_argument("--force", action="store_true",
                 help="replace an existing --out file written by cwsa-jax compare")
  add_bootstrap_flags(p, default_resamples=1000, allow_zero=False)
  add_progress_flag(p)
  p.set_defaults(func=run)
