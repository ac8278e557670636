"""``cwsa-jax compare A B``: paired bootstrap comparison of two models on the same test set."""

from __future__ import annotations

import argparse
import textwrap

import numpy as np

from cwsa_jax.cli import _evaluate, _intervals, _io, _json, _metrics, _output
from cwsa_jax.cli._format import text_table
from cwsa_jax.cli._settings import Settings, parse_thresholds
from cwsa_jax.cli._util import (UserError, add_progress_flag, progress_bar, progress_enabled,
                                stage)

HELP = "paired comparison of two models' predictions on the same test set"
DESCRIPTION = ("Paired percentile bootstrap of A - B for accuracy, ECE, AURC, E-AURC, AUGRC, "
               "AUROC, FPR@95%TPR, the average precision of success and of error, smooth ECE "
               "(and classwise ECE when both files hold per-class probabilities), and "
               "CWSA, CWSA+, selective accuracy and coverage at the given thresholds: the "
               "difference, its interval and a two-sided p-value. Both files must hold the same "
               "test samples in the same order (the formats of `evaluate` but .npy); that is "
               "checked only when both hold the true labels, not for confidence,correct files. "
               "Both models get the same resamples (Poisson row weights by default, as in "
               "`evaluate`), and each is sorted once.")
# compare has none of evaluate's --binning and --aurc: Poisson always applies.
RESAMPLING_HELP = ("bootstrap resamples, the same for A and B: poisson (each row weighted by a "
                   "Poisson(1) draw; the default) or multinomial (n rows drawn with replacement)")
HEADERS = ("metric", "A", "B", "A - B", "low", "high", "p")


def _refuse_npy(*paths: str) -> None:
  """compare takes no --labels, so a bare .npy score matrix (no labels) cannot be compared."""
  for path in paths:
    if str(path).lower().endswith(".npy"):
      raise UserError(f"{path}: compare cannot read a .npy file (it holds only the scores, and "
                      "compare takes no --labels): save the scores and labels together as an "
                      ".npz, e.g. np.savez('a.npz', probs=probs, labels=labels)")


def _peer_comparison(a: _io.LoadedPredictions, b: _io.LoadedPredictions, settings: Settings,
                     comp: _intervals.Comparison, args: argparse.Namespace, *, show: bool):
  """The paired bootstrap of the peer metrics on the resamples of ``comp``; the classwise ECE
  only when both files hold per-class probabilities."""
  rows = [_evaluate.peer_inputs(x) for x in (a, b)]
  if any(r.probs is None for r in rows):
    rows = [r._replace(probs=None, labels=None) for r in rows]
  estimates = tuple(_metrics.peer_metrics(r.scores, r.correct, settings, probs=r.probs,
                                          labels=r.labels) for r in rows)
  with progress_bar(args.bootstrap, "bootstrap (AUROC, AP, smooth ECE)", enabled=show,
                    unit="resample") as bar:
    return _intervals.peer_comparison(*rows, estimates, settings, num_resamples=args.bootstrap,
                                      level=args.level, seed=args.seed,
                                      resampling=comp.resampling, progress=bar.update)


def run(args: argparse.Namespace) -> int:
  _intervals.check_bootstrap_flags(args, allow_zero=False)
  _refuse_npy(args.a, args.b)
  thresholds = tuple(float(t) for t in parse_thresholds(args.thresholds))
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
  _intervals.bootstrap_resamples(args, len(a.confidences), refuse=True)
  settings = Settings(thresholds=thresholds)
  with progress_bar(args.bootstrap, "bootstrap", enabled=show, unit="resample") as bar:
    comp = _intervals.comparison((a.confidences, a.correct), (b.confidences, b.correct), settings,
                                 num_resamples=args.bootstrap, level=args.level, seed=args.seed,
                                 resampling=args.resampling, progress=bar.update)
  comp = comp._replace(peers=_peer_comparison(a, b, settings, comp, args, show=show))
  print(f"A = {args.a}\nB = {args.b}\nn = {len(a.confidences)} (paired), {args.bootstrap} "
        f"{comp.resampling} resamples, {args.level:.0%} intervals of A - B, two-sided bootstrap "
        "p-values")
  rows = _intervals.comparison_rows(comp, thresholds)
  print(text_table(HEADERS, rows))
  for note in _intervals.outside_notes(rows):
    print(textwrap.fill(note, width=100))
  left_out = _intervals.compared_thresholds(thresholds)[1]
  if left_out is not None:
    print(f"{left_out}; " + (f"{args.out} holds every threshold" if args.out is not None else
                             "--out FILE.json writes every threshold"))
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
         "labels_checked": not unchecked, "settings": _json.settings_json(settings),
         **_json.comparison_json(comp),
         **_intervals.outside_json(comp.difference, comp.low, comp.high,
                                   (comp.peers.difference, comp.peers.low, comp.peers.high))}))
    print(f"\nWrote {args.out}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser("compare", help=HELP, description=DESCRIPTION)
  p.add_argument("a", help="predictions of model A (.csv, .parquet or .npz; not .npy: "
                 "compare takes no --labels)")
  p.add_argument("b", help="predictions of model B")
  p.add_argument("--thresholds", default="0.5,0.9", metavar="SPEC",
                 help="thresholds for CWSA & co. (default 0.5,0.9; same syntax as evaluate)")
  p.add_argument("--scores", choices=_io.SCORE_KINDS, default="auto",
                 help="how to read a score matrix: probabilities or logits (default: auto)")
  p.add_argument("--out", metavar="FILE.json", help="also write the comparison as JSON")
  p.add_argument("--force", action="store_true",
                 help="replace an existing --out file written by cwsa-jax compare")
  _intervals.add_bootstrap_flags(p, default_resamples=1000, allow_zero=False)
  _intervals.add_resampling_flag(p, RESAMPLING_HELP)
  add_progress_flag(p)
  p.set_defaults(func=run)
