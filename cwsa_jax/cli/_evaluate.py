"""``cwsa-jax evaluate FILE``: every metric of a model's saved predictions, with a report."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import cwsa_jax as cw
from cwsa_jax import _order, plots
from cwsa_jax.cli import (_figures, _format, _intervals, _io, _json, _markdown, _metrics, _output,
                          _stream)
from cwsa_jax.cli._format import selected_rows, text_table
from cwsa_jax.cli._settings import (SELECTION_CWSA, Settings, add_min_coverage_flag,
                                    check_min_coverage, parse_thresholds)
from cwsa_jax.cli._util import (UserError, add_output_flags, add_progress_flag, progress_bar,
                                progress_enabled, stage, write_json_atomic)

DEFAULT_OUT = "cwsa-evaluate"
DEFAULT_BOOTSTRAP = 1000
_NORMS = ("l1", "l2", "max")
_BINNINGS = ("width", "mass")
_CONVENTIONS = ("step", "trapezoid", "published_code")
_NORMALIZE = ("retained", "all")

# --published-code: the paper's code (grid, ECE bins, AURC recipe, CWSA divided by n).
_PUBLISHED = dict(thresholds=cw.published_thresholds(), bins=10, aurc="published_code",
                  normalize="all")
_DEFAULTS = dict(thresholds=cw.default_thresholds(), bins=15, aurc="step", normalize="retained")
# The most ECE bins --bins accepts: far more only cost time and memory (the bootstrap holds
# per-bin sums for every resample) and leave almost every bin empty.
MAX_BINS = 10_000


def settings_from_args(args: argparse.Namespace) -> Settings:
  base = _PUBLISHED if args.published_code else _DEFAULTS
  pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
  bins = pick("bins")
  if not 1 <= bins <= MAX_BINS:
    raise UserError(f"--bins must lie in [1, {MAX_BINS:,}], got {bins}")
  thresholds = pick("thresholds")
  if isinstance(thresholds, str):  # --thresholds
    thresholds = parse_thresholds(thresholds)
  min_coverage = check_min_coverage(args.min_coverage)
  return Settings(
      thresholds=tuple(float(t) for t in thresholds),
      num_bins=bins,
      binning=args.binning,
      ece_norm=args.ece_norm,
      aurc_convention=pick("aurc"),
      normalize=pick("normalize"),
      aumcc_axis=args.aumcc_axis,
      min_coverage=min_coverage,
  )


def _scoring_rules(loaded: _io.LoadedPredictions) -> _metrics.ScoringRules | None:
  """Brier score and NLL when the file holds full probability vectors or logits."""
  if loaded.scores is None:
    return None
  scores = loaded.scores
  if not loaded.from_logits:
    scores = scores / scores.sum(axis=1, keepdims=True)  # rows are within 1e-3 of 1: renormalise
  return _metrics.ScoringRules(
      brier=np.asarray(cw.brier_score(scores, loaded.labels, from_logits=loaded.from_logits)),
      nll=np.asarray(cw.nll(scores, loaded.labels, from_logits=loaded.from_logits)))


def class_probabilities(loaded: _io.LoadedPredictions) -> np.ndarray | None:
  """The per-class probabilities [n, K] of a file with probabilities or logits (the
  classwise ECE), else None."""
  if loaded.scores is None:
    return None
  scores = loaded.scores
  if loaded.from_logits:
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
  return np.clip(scores / scores.sum(axis=1, keepdims=True), 0.0, 1.0)  # as the scoring rules


def peer_inputs(loaded: _io.LoadedPredictions) -> _intervals.PeerInputs:
  """The rows the peer metrics (AUROC, AP, smooth and classwise ECE) are computed on."""
  probs = class_probabilities(loaded)
  return _intervals.PeerInputs(loaded.confidences, loaded.correct, probs=probs,
                               labels=None if probs is None else loaded.labels)


def load_selection(args: argparse.Namespace, evaluated: list[Path]) -> _io.LoadedPredictions | None:
  """The ``--select-on`` predictions the deployment threshold is chosen on (held out).

  None without ``--select-on``, or when it names one of the ``evaluated`` files: the
  threshold is then chosen on the evaluated data (in-sample).

  Raises:
    UserError: the file is missing or unreadable (one line naming it).
  """
  path = args.select_on
  if path is None or Path(path).resolve() in {Path(p).resolve() for p in evaluated}:
    return None
  if Path(path).suffix.lower() == ".npy":
    raise UserError(f"--select-on {path}: a .npy file holds only the scores and --select-on "
                    "takes no labels; pass a .csv, .parquet or .npz file")
  try:
    return _io.load_predictions(path, labels_path=None, scores=args.scores, group_by=None)
  except UserError as e:
    raise UserError(f"--select-on {e}") from None


def deployment(loaded: _io.LoadedPredictions, selection: _io.LoadedPredictions | None,
               settings: Settings, select_on: str | None) -> _metrics.Deployment:
  """The deployment threshold: chosen on ``selection`` (held out) and applied to ``loaded``,
  or without a selection file chosen on ``loaded`` itself (in-sample)."""
  c, ok = _io.compared_confidences(loaded), loaded.correct
  if selection is None:
    return _metrics.choose_threshold(c, ok, settings)
  return _metrics.choose_held_out((_io.compared_confidences(selection), selection.correct), c, ok,
                                  settings, file=str(select_on))


def model_report(loaded: _io.LoadedPredictions, settings: Settings, args: argparse.Namespace,
                 selection: _io.LoadedPredictions | None = None) -> _metrics.ModelReport:
  """The metrics, deployment threshold (chosen on ``selection`` when given, see
  :func:`deployment`), per-class and --group-by breakdowns, --worst samples.

  A file whose numbers are not all float32 values has its float64 confidences compared
  with the thresholds and bin edges, and ordered, in float64 (``_io.compared_confidences``;
  the bootstrap intervals and the figures take the float32 confidences)."""
  c, ok = _io.compared_confidences(loaded), loaded.correct
  classes = groups = worst = None
  if loaded.labels is not None:
    classes = _metrics.group_metrics(c, ok, *_io.class_groups(loaded), settings)
  if loaded.groups is not None:
    groups = _metrics.group_metrics(c, ok, loaded.groups, loaded.group_names, settings,
                                    column=args.group_by)
  if args.worst is not None:
    worst = _metrics.worst_samples(c, ok, args.worst, min(settings.thresholds))
  rows = peer_inputs(loaded)
  return _metrics.ModelReport(
      metrics=_metrics.compute_metrics(c, ok, settings),
      threshold_choice=deployment(loaded, selection, settings, getattr(args, "select_on", None)),
      scoring=_scoring_rules(loaded), classes=classes, groups=groups, worst=worst,
      peers=_metrics.peer_metrics(c, ok, settings, probs=rows.probs, labels=rows.labels,
                                  wide=loaded.wide_confidences is not None))


def output_dir(args: argparse.Namespace, paths: list[Path]) -> tuple[Path, tuple]:
  """The checked output folder (``--out``, or a fresh default one) and the inputs it must
  not hold."""
  inputs = (*paths, args.labels, args.select_on)
  out = _output.check_output_dir(
      args.out if args.out is not None else _output.fresh_output_dir(DEFAULT_OUT),
      force=args.force, inputs=inputs)
  return out, inputs


def write_outputs(args: argparse.Namespace, out: Path, inputs: tuple, paths: list[Path], *,
                  source: str, report: _metrics.ModelReport, settings: Settings,
                  draw: Callable[[Path], list[tuple[str, str]]],
                  intervals: _intervals.Intervals | None = None,
                  streaming: dict | None = None, notes: Sequence[str] = ()) -> list:
  """Writes metrics.json, report.md and the figures (``draw(folder)``, unless --no-figures)
  into ``out`` at once (nothing is left behind on failure); returns the figures."""
  name = _io.inputs_name(paths)
  with _output.atomic_output_dir(out, force=args.force, inputs=inputs, command="evaluate") as tmp:
    with stage("figures", enabled=progress_enabled(args) and not args.no_figures):
      figures = [] if args.no_figures else draw(tmp)
    payload = {"command": "evaluate", **({"file": str(paths[0])} if len(paths) == 1 else {}),
               "files": [str(path) for path in paths], "source": source,
               "settings": _json.settings_json(settings), **_json.report_json(report)}
    if streaming is not None:
      payload["streaming"] = streaming
    if intervals is not None:
      payload["intervals"] = {**_json.intervals_json(intervals), **_intervals.outside_json(
          _intervals.estimates(report.metrics), intervals.low, intervals.high,
          intervals.peers, unresampled=intervals.unresampled)}
    write_json_atomic(tmp / "metrics.json", payload)
    text = _markdown.evaluation_report(title=f"Evaluation of {name}", source=source,
                                       report=report, settings=settings, figures=figures,
                                       command="cwsa-jax evaluate", intervals=intervals,
                                       notes=notes)
    (tmp / "report.md").write_text(text, encoding="utf-8")
  return figures


def with_peer_intervals(intervals: _intervals.Intervals, rows: _intervals.PeerInputs,
                        estimate: _metrics.PeerMetrics, settings: Settings, *,
                        show: bool) -> _intervals.Intervals:
  """``intervals`` with the peer metrics' intervals from the same resamples (its scheme, seed
  and count)."""
  with progress_bar(intervals.num_resamples, "bootstrap (AUROC, AP, smooth ECE)", enabled=show,
                    unit="resample") as bar:
    peers = _intervals.peer_intervals(
        rows, estimate, settings, num_resamples=intervals.num_resamples, level=intervals.level,
        seed=intervals.seed, resampling=intervals.resampling, progress=bar.update)
  return intervals._replace(peers=peers)


def print_intervals(report: _metrics.ModelReport, intervals: _intervals.Intervals | None,
                    settings: Settings) -> None:
  if intervals is not None:
    print(f"\n{intervals.level:.0%} percentile-bootstrap intervals "
          f"({intervals.num_resamples} {intervals.resampling} resamples, seed {intervals.seed}):")
    rows = _intervals.interval_rows(report.metrics, intervals, settings)
    print(text_table(("metric", "value", "low", "high"), rows))
    for note in _intervals.outside_notes(rows):
      print(textwrap.fill(note, width=100))


def print_written(args: argparse.Namespace, out: Path, figures: list) -> None:
  print(f"\nWrote {out}/report.md, {out}/metrics.json"
        + ("" if args.no_figures else f" and {len(figures)} figures"))


REAL_NOTE = ("--scores real: the scores are real-valued, so only the order-based metrics are "
             "reported (AUROC, FPR@95%TPR, the average precision of success and of error, AURC, "
             "E-AURC, AUGRC, the risk-coverage curve); the probability metrics (ECE, smooth "
             "and classwise ECE, CWSA, CWSA+, the threshold sweep, AUMCC, Brier, NLL, the "
             "deployment threshold) are omitted.")
# The metrics --scores real reports (metrics.json, with intervals).
REAL_METRICS = ("accuracy", "aurc", "eaurc", "augrc") + _metrics.ORDER_PEERS


def _run_real(args: argparse.Namespace, settings: Settings) -> int:
  """``evaluate --scores real``: the order-based metrics of real-valued scores."""
  refused = [(args.stream, "--stream"), (args.select_on is not None, "--select-on"),
             (args.group_by is not None, "--group-by"), (args.worst is not None, "--worst"),
             (args.labels is not None, "--labels")]
  for given, flag in refused:
    if given:
      raise UserError(f"--scores real does not take {flag}: it reports only the order-based "
                      "metrics (no threshold grid, breakdowns or deployment threshold)")
  if args.chunk_rows is not None:
    raise UserError("--chunk-rows goes with --stream (the rows are read in chunks anyway)")
  _intervals.check_bootstrap_flags(args, allow_zero=True)
  resampling = _intervals.resampling_scheme(settings, args.resampling)
  paths = _io.expand_inputs(args.files)
  out, inputs = output_dir(args, paths)
  show = progress_enabled(args)
  name = _io.inputs_name(paths)
  with stage(f"loading {name}", enabled=show):
    loaded = _io.load_real_scores(paths)
  s, ok = loaded.scores, loaded.correct
  summary = cw.risk_coverage_summary(s, ok, convention=settings.aurc_convention)
  peers = _metrics.peer_metrics(s, ok, settings, real=True)
  values = {"n": int(ok.size), "accuracy": np.float32(ok.mean()),
            **{k: getattr(summary, k) for k in ("aurc", "eaurc", "augrc")},
            **{k: getattr(peers, k) for k in _metrics.ORDER_PEERS}}
  args.bootstrap = _intervals.bootstrap_resamples(args, ok.size, refuse=False)
  intervals = None
  if args.bootstrap:
    # The intervals resample float32 stand-ins in (0, 1) that order and tie exactly like the
    # scores (_order.stand_ins): every reported metric depends on that order alone.
    stand_ins = np.asarray(_order.stand_ins(s)[0], np.float32)
    with progress_bar(args.bootstrap, "bootstrap", enabled=show, unit="resample") as bar:
      intervals = _intervals.evaluation_intervals(
          stand_ins, ok, settings, num_resamples=args.bootstrap, level=args.level,
          seed=args.seed, resampling=resampling, progress=bar.update)
    intervals = with_peer_intervals(intervals, _intervals.PeerInputs(stand_ins, ok, real=True),
                                    peers, settings, show=show)
  only = frozenset(REAL_METRICS)
  rows = [["n", str(values["n"])]] + [[k, _format.fmt(values[k])] for k in REAL_METRICS]
  interval_rows = [] if intervals is None else _real_interval_rows(values, intervals)
  with _output.atomic_output_dir(out, force=args.force, inputs=inputs, command="evaluate") as tmp:
    figures = [] if args.no_figures else _real_figure(tmp, s, ok, name, values)
    payload = {"command": "evaluate", **({"file": str(paths[0])} if len(paths) == 1 else {}),
               "files": [str(path) for path in paths], "source": loaded.source,
               "scores": _io.REAL_SCORES, "note": REAL_NOTE,
               "settings": {"aurc_convention": settings.aurc_convention},
               **{k: _json.plain(v) for k, v in values.items()}}
    if intervals is not None:
      estimate = _intervals.IntervalMetrics(*([np.nan] * len(_intervals.IntervalMetrics._fields)))
      estimate = estimate._replace(**{k: values[k] for k in ("accuracy", "aurc", "eaurc", "augrc")})
      payload["intervals"] = {**_json.intervals_json(intervals, only), **_intervals.outside_json(
          estimate, intervals.low, intervals.high, intervals.peers, only)}
    write_json_atomic(tmp / "metrics.json", payload)
    (tmp / "report.md").write_text(_markdown.real_scores_report(
        title=f"Evaluation of {name}", source=loaded.source, note=REAL_NOTE, rows=rows,
        figures=figures, intervals=intervals, interval_rows=interval_rows,
        convention=settings.aurc_convention), encoding="utf-8")
  print(f"{loaded.source}: n = {ok.size}")
  print(text_table(("metric", "value"), rows[1:]))
  print(textwrap.fill(REAL_NOTE, width=100))
  if intervals is not None:
    print(f"\n{intervals.level:.0%} percentile-bootstrap intervals "
          f"({intervals.num_resamples} {intervals.resampling} resamples, seed {intervals.seed}):")
    print(text_table(("metric", "value", "low", "high"), interval_rows))
    for note in _intervals.outside_notes(interval_rows):
      print(textwrap.fill(note, width=100))
  print_written(args, out, figures)
  return 0


def _real_interval_rows(values: dict, intervals: _intervals.Intervals) -> list[list[str]]:
  """(metric, value, low, high) rows of the metrics --scores real reports."""
  rows = []
  for name in REAL_METRICS:
    source = intervals.peers if name in _metrics.ORDER_PEERS else intervals
    low, high = (float(getattr(getattr(source, end), name)) for end in ("low", "high"))
    value = float(values[name])
    outside = _intervals.outside_interval(*(_intervals.IntervalMetrics(*[x] * 9)
                                            for x in (value, low, high))).accuracy
    rows.append([name, _intervals.marked(f"{value:.5f}", outside), f"{low:.5f}",
                 f"{high:.5f}"])
  return rows


def _real_figure(folder: Path, scores: np.ndarray, correct: np.ndarray, name: str,
                 values: dict) -> list[tuple[str, str]]:
  """risk_coverage.png of real-valued scores (the only figure that needs just their order)."""
  label = f"{name} (AURC {_format.fmt(values['aurc'])}, AUGRC {_format.fmt(values['augrc'])})"
  fig = plots.risk_coverage({name: cw.risk_coverage_curve(scores, correct)},
                            title=f"{name}: risk-coverage curves", labels={name: label})
  plots.save(fig, folder / "risk_coverage.png")
  return [("risk_coverage.png", _figures.RISK_COVERAGE_CAPTION)]


def run(args: argparse.Namespace) -> int:
  settings = settings_from_args(args)
  if args.scores == _io.REAL_SCORES:
    return _run_real(args, settings)
  if args.stream:
    return _run_streamed(args, settings)
  if args.chunk_rows is not None:
    raise UserError("--chunk-rows goes with --stream (the rows are read in chunks anyway)")
  _intervals.check_bootstrap_flags(args, allow_zero=True)
  resampling = _intervals.resampling_scheme(settings, args.resampling)
  if args.worst is not None and args.worst < 1:
    raise UserError(f"--worst must be >= 1, got {args.worst}")
  # Check the output folder and read the input before any long step.
  paths = _io.expand_inputs(args.files)
  out, inputs = output_dir(args, paths)
  show = progress_enabled(args)
  name = _io.inputs_name(paths)
  with stage(f"loading {name}", enabled=show):
    loaded = _io.load_inputs(paths, labels_path=args.labels, scores=args.scores,
                             group_by=args.group_by)
  if loaded.note is not None:
    print(loaded.note, file=sys.stderr)
  selection = load_selection(args, paths)
  with stage("metrics", enabled=show):
    report = model_report(loaded, settings, args, selection)
  args.bootstrap = _intervals.bootstrap_resamples(args, len(loaded.confidences), refuse=False)
  intervals = None
  if args.bootstrap:
    with progress_bar(args.bootstrap, "bootstrap", enabled=show, unit="resample") as bar:
      intervals = _intervals.evaluation_intervals(
          loaded.confidences, loaded.correct, settings, num_resamples=args.bootstrap,
          level=args.level, seed=args.seed, resampling=resampling, progress=bar.update)
    intervals = with_peer_intervals(intervals, peer_inputs(loaded), report.peers, settings,
                                    show=show)
  figures = write_outputs(
      args, out, inputs, paths, source=loaded.source, report=report, settings=settings,
      intervals=intervals, draw=lambda tmp: _figures.model_figures(
          tmp, loaded.confidences, loaded.correct, report.metrics, settings, name=name,
          deployment=report.threshold_choice))
  print_summary(loaded.source, report, settings)
  print_intervals(report, intervals, settings)
  print_written(args, out, figures)
  return 0


def print_summary(source: str, report: _metrics.ModelReport, settings: Settings) -> None:
  metrics = report.metrics
  print(f"{source}: n = {metrics.n}")
  print(text_table(("metric", "value"),
                   _markdown.scalar_rows(metrics, report.scoring, report.peers)[1:]))
  print(textwrap.fill(_markdown.aumcc_note(metrics, settings), width=100))
  print()
  indices = selected_rows(metrics.sweep.thresholds)
  print(text_table(_markdown.SWEEP_HEADERS, _markdown.sweep_rows(metrics.sweep, indices)))
  if settings.normalize == "all":
    print("(CWSA divided by n: the published code's variant)")
  print()
  print("\n".join(_deployment_lines(report.threshold_choice)))


def _deployment_lines(choice: _metrics.Deployment) -> list[str]:
  """The terminal lines stating the deployment threshold and the data it was chosen on."""
  where = (f"on {choice.selected_on} (held out)" if choice.held_out else
           "on the evaluated data itself (in-sample)")
  if choice.choice is None:
    return [f"no threshold of this grid reaches coverage >= {choice.min_coverage:g} "
            f"(--min-coverage) {where}"]
  lines = [f"selected threshold (best {SELECTION_CWSA} with coverage >= "
           f"{choice.min_coverage:g}, --min-coverage): {choice.choice.threshold:.4g} "
           f"(coverage {choice.choice.coverage:.4f}), chosen {where}"]
  if not choice.held_out:
    return lines + ["  so optimistic: choose it on held-out predictions with --select-on FILE"]
  point = choice.evaluated
  return lines + [f"  on the evaluated data: coverage {point.coverage:.4f}, selective accuracy "
                  f"{point.selective_accuracy:.4f} (risk {point.selective_risk:.4f}), "
                  f"{SELECTION_CWSA} {point.cwsa:.4f}"]


def add_parser(sub) -> None:
  p = sub.add_parser(
      "evaluate", help="evaluate saved predictions (CSV, Parquet, .npz, .npy; one file or several shards)",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Compute CWSA, CWSA+, coverage and selective accuracy over a threshold grid, "
      "plus accuracy, ECE, AURC, E-AURC, AUGRC and AUMCC (and Brier / NLL when probabilities are "
      "given) for one model's predictions; write metrics.json, report.md and figures.",
      epilog="""input formats:
  CSV   header with y_true,y_pred,confidence (the paper's code) or confidence,correct;
        labels are integers or class names (cat, dog); delimiter , ; TAB or |
  .npz  probs [n,K] (or logits [n,K]) and labels [n] -- what `cwsa-jax train` writes --
        or confidences [n] and correct [n]
  .npy  probs or logits [n,K]; labels from --labels LABELS.npy
  .parquet  the CSV's columns, typed (integer or string labels, bool or 0/1 correct);
        needs pip install 'cwsa-jax[parquet]'
Several FILEs (or a quoted glob, or a folder of .csv/.parquet shards) are one evaluation:
their rows are joined in the order given, and every file must have the same columns.

--published-code uses the paper's code conventions: thresholds linspace(0.5, 0.99, 20),
10 ECE bins, AURC 'published_code', CWSA divided by n. Explicit flags override it.

The report also states the threshold select_threshold picks (best CWSA divided by |S|, the
paper's, even with --normalize all or --published-code, with coverage >= --min-coverage,
default 0.8): chosen on the evaluated file itself it is in-sample and optimistic; --select-on
FILE chooses it on held-out predictions (say a validation set) and reports the evaluated
file's coverage, selective accuracy and CWSA (divided by |S|) at that threshold. It
breaks the sweep down per true class when the labels are known (CSV y_true, .npz/.npy labels),
per group with --group-by COLUMN (CSV), and lists the most confident mistakes with --worst K.""")
  p.add_argument("files", nargs="+", metavar="FILE",
                 help="predictions file (.csv, .parquet, .npz or .npy); several files, a quoted "
                 "glob pattern ('shards/*.parquet') or a folder (its .csv and .parquet files, "
                 "sorted) are read as one evaluation: the same columns, rows concatenated in order")
  add_output_flags(p, default_out=DEFAULT_OUT)
  p.add_argument("--labels", metavar="FILE.npy", help="labels for a .npy scores file")
  p.add_argument("--scores", choices=_io.SCORE_KINDS + (_io.REAL_SCORES,), default="auto",
                 help="how to read a score matrix: probabilities or logits (default: auto: "
                 "probabilities when the values lie in [0, 1] and rows sum to 1, logits when "
                 "some value lies outside [0, 1]; a .npy matrix in [0, 1] whose rows do not sum "
                 "to 1 is refused); real: the files hold real-valued scores (a max logit, a "
                 "negative energy; higher = more likely correct), a CSV with a score (or "
                 "confidence) column and correct (or y_true, y_pred), or an .npz with scores "
                 "and correct: only the order-based metrics are reported (AUROC, FPR@95%%TPR, "
                 "average precision, AURC, E-AURC, AUGRC, risk-coverage curve), not ECE, CWSA, "
                 "Brier and the other probability metrics")
  p.add_argument("--thresholds", metavar="SPEC",
                 help="threshold grid: START:STOP:STEP (inclusive), linspace:START:STOP:NUM or "
                 "a comma-separated list (default 0.5:0.99:0.01)")
  p.add_argument("--bins", type=int,
                 help=f"ECE bins (default 15, at most {MAX_BINS:,})")
  p.add_argument("--binning", choices=_BINNINGS, default="width",
                 help="ECE bins of equal width or equal mass (default width)")
  p.add_argument("--ece-norm", choices=_NORMS, default="l1",
                 help="l1 = ECE, l2 = RMS calibration error, max = MCE (default l1)")
  p.add_argument("--aurc", choices=_CONVENTIONS,
                 help="AURC / AUGRC / E-AURC convention (default step)")
  p.add_argument("--normalize", choices=_NORMALIZE,
                 help="CWSA denominator: retained = |S| (the paper's definition, default), "
                 "all = n (the paper's published code)")
  p.add_argument("--aumcc-axis", choices=("coverage", "threshold"), default="coverage",
                 help="x axis of the AUMCC area (default coverage)")
  add_min_coverage_flag(p)
  p.add_argument("--select-on", metavar="FILE",
                 help="choose the deployment threshold on this held-out predictions file "
                 "(.csv, .parquet or .npz, e.g. a validation set) and apply it to FILE; "
                 "without it (or when it is FILE) the "
                 "threshold is chosen on FILE itself (in-sample, optimistic)")
  p.add_argument("--published-code", action="store_true",
                 help="the paper's published-code conventions (see below)")
  p.add_argument("--group-by", metavar="COLUMN",
                 help="CSV or Parquet column of group labels (integers or strings): per-group sweep and "
                 "best-worst gap in the report")
  p.add_argument("--worst", type=int, metavar="K",
                 help="list the K most damaging samples (confident and wrong) at the lowest "
                 "threshold of the grid")
  p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
  p.add_argument("--stream", action="store_true",
                 help="read CSV / Parquet inputs in chunks with memory bounded by the chunk, "
                 "not the file: the sweep, accuracy and ECE are exact sums over the chunks, "
                 "AURC / AUGRC / E-AURC exact from a second read of the files (more when "
                 "there are very many distinct confidences), Poisson-bootstrap intervals from "
                 "further reads (the in-memory ones); no per-class or --group-by breakdowns, "
                 "--worst, --binning mass, --aurc published_code or --resampling multinomial")
  p.add_argument("--chunk-rows", type=int, metavar="N",
                 help=f"rows per chunk with --stream (default {_stream.DEFAULT_CHUNK_ROWS:,})")
  _intervals.add_bootstrap_flags(p, default_resamples=DEFAULT_BOOTSTRAP)
  _intervals.add_resampling_flag(p)
  add_progress_flag(p)
  p.set_defaults(func=run)


def _run_streamed(args: argparse.Namespace, settings: Settings) -> int:
  """``evaluate --stream``: pass 1, the exact AURC passes, the bootstrap passes, then the same
  outputs as in memory."""
  chunk_rows = _stream.check_flags(args, settings)
  paths = _io.expand_inputs(args.files)
  for path in paths:
    if path.suffix.lower() not in _io.TABLE_EXTENSIONS:
      raise UserError(f"{path}: --stream reads CSV and Parquet files only; load "
                      f"{path.suffix or 'this file'} files without --stream")
  out, inputs = output_dir(args, paths)
  show = progress_enabled(args)
  selection = load_selection(args, paths)
  result = _stream.scan(paths, settings, chunk_rows, show=show)
  budget = _stream.sort_rows()
  summary, passes, areas = _stream.exact_areas(paths, result, settings.aurc_convention,
                                               chunk_rows, budget=budget, show=show)
  args.bootstrap = _intervals.bootstrap_resamples(args, result.n, refuse=False)
  intervals, bootstrap_passes = None, 0
  if args.bootstrap:
    intervals, bootstrap_passes = _stream.streamed_intervals(
        paths, result, settings, chunk_rows, args, first_pass=passes + 1,
        budget=min(budget, _stream.BOOTSTRAP_RANGE_ROWS), show=show)
  peers = _stream.stream_peers(result, areas)
  if intervals is not None:  # the streamed bootstrap does not resample the peer metrics
    intervals = intervals._replace(unresampled=tuple(
        name for name, value in peers._asdict().items() if value is not None))
  report = _metrics.ModelReport(metrics=_stream.stream_metrics(result, summary, settings),
                                threshold_choice=_stream.deployment(result, selection, settings,
                                                                    args.select_on),
                                peers=peers)
  source = _io.table_source(paths, result.labels)
  notes = _stream.notes(result, passes, chunk_rows)
  if intervals is not None and intervals.unresampled:
    notes.append(_intervals.unresampled_note(intervals.unresampled))
  streaming_json = {"chunk_rows": chunk_rows, "sort_rows": budget, "passes": passes,
                    "bootstrap_passes": bootstrap_passes, "aurc_exact": True,
                    "distinct_confidences": areas.groups,
                    "omitted": ["classes"] if result.labels is not None else []}
  draw = _stream.figure_drawer(result, report, settings, _io.inputs_name(paths))
  figures = write_outputs(args, out, inputs, paths, source=source, report=report,
                          settings=settings, draw=draw, streaming=streaming_json, notes=notes,
                          intervals=intervals)
  print_summary(source, report, settings)
  print("\n" + "\n".join(notes))
  print_intervals(report, intervals, settings)
  print_written(args, out, figures)
  return 0
