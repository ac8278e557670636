"""``cwsa-jax compare A B``: paired bootstrap comparison of two models on the same test set."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cwsa_jax import _io
from cwsa_jax import _report
from cwsa_jax._cli_util import UserError, write_json_atomic

HEADERS = ("metric", "A", "B", "A - B", "low", "high", "p")


def add_bootstrap_flags(p: argparse.ArgumentParser, *, default_resamples: int) -> None:
  """--bootstrap N, --level L, --seed S (shared by evaluate and compare)."""
  p.add_argument("--bootstrap", type=int, default=default_resamples, metavar="N",
                 help=f"bootstrap resamples for the intervals (default {default_resamples}"
                 + ("; 0 = no intervals)" if default_resamples else ")"))
  p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
  p.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")


def check_bootstrap_flags(args: argparse.Namespace, *, allow_zero: bool) -> None:
  if args.bootstrap < (0 if allow_zero else 1):
    raise UserError(f"--bootstrap must be >= {0 if allow_zero else 1}, got {args.bootstrap}")
  if not 0.0 < args.level < 1.0:
    raise UserError(f"--level must lie in (0, 1), got {args.level}")


def run(args: argparse.Namespace) -> int:
  from cwsa_jax import _intervals  # noqa: PLC0415 - imports JAX

  check_bootstrap_flags(args, allow_zero=False)
  thresholds = tuple(float(t) for t in _report.parse_thresholds(args.thresholds))
  a, b = (_io.load_predictions(p, scores=args.scores) for p in (args.a, args.b))
  if len(a.confidences) != len(b.confidences):
    raise UserError(f"{args.a} has {len(a.confidences)} samples and {args.b} has "
                    f"{len(b.confidences)}: a paired comparison needs the same test set")
  if a.labels is not None and b.labels is not None and not np.array_equal(a.labels, b.labels):
    raise UserError(f"{args.a} and {args.b} have different labels: not the same test set "
                    "(or not in the same order)")
  if args.out is not None and not args.force and Path(args.out).exists():
    raise UserError(f"output file {args.out} already exists (use --force to replace it)")
  settings = _report.Settings(thresholds=thresholds)
  comp = _intervals.comparison((a.confidences, a.correct), (b.confidences, b.correct), settings,
                               num_resamples=args.bootstrap, level=args.level, seed=args.seed)
  print(f"A = {args.a}\nB = {args.b}\nn = {len(a.confidences)} (paired), {args.bootstrap} "
        f"resamples, {args.level:.0%} intervals of A - B, two-sided bootstrap p-values")
  print(_report.text_table(HEADERS, _intervals.comparison_rows(comp, thresholds)))
  if args.out is not None:
    write_json_atomic(args.out, {"command": "compare", "a": str(args.a), "b": str(args.b),
                                 "n": len(a.confidences), "settings": settings.to_json(), **comp})
    print(f"\nWrote {args.out}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser(
      "compare", help="paired comparison of two models' predictions on the same test set",
      description="Paired percentile bootstrap of A - B for accuracy, ECE, AURC, E-AURC, AUGRC and "
      "CWSA, CWSA+, selective accuracy and coverage at the given thresholds: the difference, its "
      "interval and a two-sided p-value. Both files must hold the same test samples in the same "
      "order (same formats as `evaluate`).")
  p.add_argument("a", help="predictions of model A (.csv, .npz or .npy)")
  p.add_argument("b", help="predictions of model B")
  p.add_argument("--thresholds", default="0.5,0.9", metavar="SPEC",
                 help="thresholds for CWSA & co. (default 0.5,0.9; same syntax as evaluate)")
  p.add_argument("--scores", choices=_io.SCORE_KINDS, default="auto",
                 help="how to read a score matrix: probabilities or logits (default: auto)")
  p.add_argument("--out", metavar="FILE.json", help="also write the comparison as JSON")
  p.add_argument("--force", action="store_true", help="replace an existing --out file")
  add_bootstrap_flags(p, default_resamples=1000)
  p.set_defaults(func=run)
