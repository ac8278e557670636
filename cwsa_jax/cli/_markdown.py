"""``report.md``: the evaluation report of one model and the sections the commands share."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from cwsa_jax import plots
from cwsa_jax.cli._format import fmt, fmt_convention, markdown_table
from cwsa_jax.cli._intervals import Intervals, interval_rows, outside_notes
from cwsa_jax.cli._metrics import (PEER_LABELS, SCALARS, Aumcc, Deployment, GroupBreakdown,
                                   Metrics, ModelReport, PeerMetrics, ScoringRules, SweepFields,
                                   WorstSamples, coverage_span, retained_only, threshold_index)
from cwsa_jax.cli._settings import SELECTION_CWSA, Settings, aumcc_caveat

AUMCC_MARK = "†"
SWEEP_HEADERS = ("τ", "coverage", "sel. accuracy", "CWSA", "CWSA+")
GROUP_TAUS = (0.5, 0.9)
MAX_GROUP_ROWS = 30

CONVENTIONS_NOTE = f"""\
- **CWSA** at threshold τ averages φ(c) = (c − τ)/(1 − τ) times +1 (correct) or −1 (wrong) over
  the retained set S = {{c ≥ τ}}, divided by |S| as the paper defines it (0 when S is empty).
  The paper's published code divides by n instead, so its CWSA equals coverage × CWSA; use
  `--normalize all` to get that variant. CWSA+ rewards correct predictions only and divides by |S|
  in both.
- **Selective accuracy** is undefined (shown as —, `null` in JSON) where nothing is retained.
- **ECE** uses top-label confidence; the last bin is closed, so a confidence of exactly 1.0 counts
  (the published code drops it).
- **AURC** conventions: `step` is the exact area under the tie-grouped empirical curve;
  `trapezoid` joins the tie-group points; `published_code` reproduces the paper's code
  (trapezoid over coverage 1/n..1, no tie grouping). E-AURC subtracts the best AURC any ranking
  of the same outcomes reaches under the same convention. AUGRC (Traub et al., 2024) uses
  errors accepted / n.
- **AUMCC** is the trapezoid area under the metric-coverage curve of the threshold grid
  (coverage on the x axis; not normalised; thresholds that retain nothing are left out), so it
  compares models only when their coverage spans match: see the note beside each AUMCC value.
- **Empty retained set**: CWSA and CWSA+ are 0 there by the paper's convention, which tables
  show as "0 (S empty)" and figures leave out of the lines (shaded, or marked with an x at 0).
- **Reliability diagrams** grey out bins with fewer than {plots.RELIABILITY_MIN_COUNT} samples (their
  accuracy is too noisy to read) and draw no gap box for them; the lower panel prints every bin's
  count.
"""


def settings_rows(settings: Settings) -> list[tuple[str, str]]:
  """(setting, value) rows of a report's *Settings* table."""
  t = np.asarray(settings.thresholds)
  step = np.diff(t)
  if t.size > 2 and np.allclose(step, step[0], atol=1e-6):
    grid = f"{t[0]:.4g} to {t[-1]:.4g}, {t.size} points, step {step[0]:.4g}"
  else:
    grid = ", ".join(f"{x:.4g}" for x in t)
  cwsa_norm = ("retained: divide by the retained count |S| (the paper's definition)"
               if settings.normalize == "retained" else
               "all: divide by n (the paper's published code; equals coverage x CWSA)")
  kind = "equal-width" if settings.binning == "width" else "equal-mass"
  rows = [
      ("thresholds", grid),
      ("CWSA normalisation", cwsa_norm),
      ("ECE", f"{settings.num_bins} {kind} bins, norm {settings.ece_norm} (top-label; the last "
              "bin includes 1.0)"),
      ("AURC / AUGRC / E-AURC", f"convention {settings.aurc_convention!r}"),
      ("AUMCC", f"trapezoid over the {settings.aumcc_axis} axis of the threshold grid, not "
                f"normalised (see {AUMCC_MARK} beside the values)"),
      ("deployment threshold", f"largest {SELECTION_CWSA} on the grid with coverage ≥ "
                               f"{settings.min_coverage:g} (`--min-coverage`)"),
  ]
  return [(name, value.replace("|", "\\|")) for name, value in rows]  # |S| inside a table cell


def settings_section(settings: Settings) -> list[str]:
  """The *Settings* and *Conventions* sections that end every report."""
  return ["## Settings", "", markdown_table(("setting", "value"), settings_rows(settings), "ll"), "",
          "## Conventions", "", CONVENTIONS_NOTE]


def figure_lines(figures: Sequence[tuple[str, str]]) -> list[str]:
  """Each (file, caption) as an image with its caption below."""
  lines = []
  for file, caption in figures:
    lines += [f"![{caption}]({file})", "", f"*{caption}*", ""]
  return lines


def scalar_rows(metrics: Metrics, scoring: ScoringRules | None = None,
                peers: PeerMetrics | None = None) -> list[tuple[str, str]]:
  """(metric, value) rows for one model; AUMCC rows carry :data:`AUMCC_MARK` (see :func:`aumcc_note`)."""
  rows = [("samples (n)", str(metrics.n))]
  rows += [(plots.METRIC_LABELS[name], fmt(getattr(metrics, name))) for name in SCALARS]
  rows += [(f"AUMCC ({plots.METRIC_LABELS[name]}) {AUMCC_MARK}", fmt(value))
           for name, value in zip(Aumcc._fields, metrics.aumcc)]
  if scoring is not None:
    rows += [("Brier score", fmt(scoring.brier)), ("NLL", fmt(scoring.nll))]
  return rows + peer_rows(peers)


def peer_rows(peers: PeerMetrics | None) -> list[tuple[str, str]]:
  """(metric, value) rows of the peer metrics that apply."""
  if peers is None:
    return []
  return [(PEER_LABELS[name], fmt(value)) for name, value in peers._asdict().items()
          if value is not None]


def sweep_rows(sweep: SweepFields, indices: Sequence[int] | None = None) -> list[list[str]]:
  """Table rows (τ, coverage, selective accuracy, CWSA, CWSA+); CWSA at an empty S is marked."""
  t = np.asarray(sweep.thresholds)
  indices = range(t.size) if indices is None else indices
  cov = sweep.coverage
  return [[f"{t[i]:.4g}", fmt(cov[i]), fmt(sweep.selective_accuracy[i]),
           fmt_convention(sweep.cwsa[i], cov[i]), fmt_convention(sweep.cwsa_plus[i], cov[i])]
          for i in indices]


def aumcc_note(metrics: Metrics, settings: Settings) -> str:
  """The AUMCC caveat for one model, with its coverage span and span-normalised values."""
  text = f"{AUMCC_MARK} {aumcc_caveat(settings.aumcc_axis)}"
  if settings.aumcc_axis != "coverage":
    return text
  high, low = (float(x) for x in coverage_span(metrics.sweep.coverage))
  if not math.isfinite(high):
    return text + " Here no threshold retains anything."
  span = high - low
  text += f" Here the grid sweeps coverage {fmt(high)} down to {fmt(low)} (span {fmt(span)})"
  if span <= 0:
    return text + "."
  means = ", ".join(f"{plots.METRIC_LABELS[name]} {fmt(float(value) / span)}"
                    for name, value in zip(Aumcc._fields, metrics.aumcc))
  return text + f"; AUMCC ÷ span: {means}."


IN_SAMPLE_NOTE = ("This operating point is therefore optimistic: choose the threshold on "
                  "held-out predictions with `--select-on FILE`.")


def choice_sentence(deployment: Deployment) -> str:
  """Markdown sentences stating the selected threshold (or why there is none) and the data it
  was chosen on: the evaluated data itself (in-sample) or a ``--select-on`` file (held out)."""
  constraint = (f"maximising {SELECTION_CWSA} over the threshold grid subject to coverage ≥ "
                f"{deployment.min_coverage:g} (`--min-coverage`)")
  held_out = deployment.held_out
  where = (f" on `{deployment.selected_on}` (held out)" if held_out else
           " on the evaluated data itself (in-sample)")
  choice = deployment.choice
  if choice is None:
    return (f"**Deployment threshold**: none — {constraint} is infeasible{where}: "
            f"{deployment.reason}.")
  metric = deployment.metric.upper().replace('_PLUS', '+')
  text = (f"**Deployment threshold** ({constraint}, `select_threshold`), chosen{where}: "
          f"τ = {choice.threshold:.4g}, with coverage {fmt(choice.coverage)}, selective risk "
          f"{fmt(choice.selective_risk)} and {metric} {fmt(choice.value)} (divided by |S|)"
          f"{' there' * held_out}.")
  if not held_out:
    return f"{text} {IN_SAMPLE_NOTE}"
  point = deployment.evaluated
  return (f"{text} Applied to the evaluated data: coverage {fmt(point.coverage)}, selective "
          f"accuracy {fmt(point.selective_accuracy)} (risk {fmt(point.selective_risk)}) and "
          f"{metric} {fmt(point.cwsa)} (divided by |S|).")


def group_section(title: str, groups: GroupBreakdown, key: str) -> list[str]:
  """Markdown lines: per-group coverage, selective accuracy and CWSA at τ ≈ 0.5 and 0.9."""
  thresholds = np.asarray(groups.sweep.thresholds)
  cols = [threshold_index(thresholds, t) for t in GROUP_TAUS]
  headers = ["group", "n"]
  for j in cols:
    tau = f"{thresholds[j]:.3g}"
    headers += [f"coverage@{tau}", f"sel. acc.@{tau}", f"CWSA@{tau}"]
  fields = ("coverage", "selective_accuracy", "cwsa")
  shown = retained_only(groups.sweep)  # CWSA — where a group retains nothing, as sel. accuracy
  rows = []
  for g, name in enumerate(groups.names[:MAX_GROUP_ROWS]):
    row = [str(name), str(int(groups.counts[g]))]
    for j in cols:
      row += [fmt(getattr(shown, f)[g][j]) for f in fields]
    rows.append(row)
  gap = ["best − worst", ""]
  for j in cols:
    gap += [fmt(getattr(groups.gap, f)[j]) for f in fields]
  rows.append(gap)
  more = (f" Only the first {MAX_GROUP_ROWS} of {len(groups.names)} groups are shown."
          if len(groups.names) > MAX_GROUP_ROWS else "")
  return [f"## {title}", "", markdown_table(headers, rows), "",
          f"Every group's full sweep and the best-worst gap at each threshold are in "
          f"`metrics.json` (`{key}`). Where a group retains nothing, its selective accuracy "
          f"and CWSA show as — and it is left out of those best − worst gaps (its coverage, 0, "
          f"counts in the coverage gap; `metrics.json` keeps its CWSA at 0, the paper's "
          f"convention).{more}", ""]


def worst_section(worst: WorstSamples) -> list[str]:
  """Markdown lines listing the most damaging samples."""
  rows = [[str(s.index), fmt(s.confidence), fmt(s.term)] for s in worst.samples]
  lines = [f"## Most damaging samples (τ = {worst.tau:.4g})", "",
           f"The (at most) {worst.k} retained wrong predictions with the most negative CWSA "
           f"terms φ(c)(2·correct − 1), i.e. the most confident mistakes (`most_damaging`); the "
           "index is the 0-based position in the input.", ""]
  if rows:
    lines += [markdown_table(("index", "confidence", "CWSA term"), rows), ""]
  else:
    lines += ["No retained prediction is wrong.", ""]
  return lines


_RESAMPLES = {"multinomial": "resamples of the test set (n rows drawn with replacement)",
              "poisson": "Poisson resamples of the test set (each row weighted by a Poisson(1) "
                         "draw)"}


def intervals_section(metrics: Metrics, intervals: Intervals, settings: Settings) -> str:
  """The bootstrap intervals of the scalar metrics and of the sweep at a few thresholds."""
  rows = interval_rows(metrics, intervals, settings)
  lines = ["", f"## {intervals.level:.0%} bootstrap intervals", "",
           f"Percentile bootstrap over {intervals.num_resamples} {_RESAMPLES[intervals.resampling]} "
           f"(seed {intervals.seed}); every threshold's interval is in metrics.json "
           "(`intervals`).", "", "| metric | value | low | high |", "|---|---:|---:|---:|"]
  lines += [f"| {' | '.join(r)} |" for r in rows]
  lines += [f"\n{note}" for note in outside_notes(rows)]
  return "\n".join(lines) + "\n"


def evaluation_report(*, title: str, source: str, report: ModelReport, settings: Settings,
                      figures: Sequence[tuple[str, str]], command: str,
                      intervals: Intervals | None = None, notes: Sequence[str] = ()) -> str:
  """Markdown for one evaluated model; ``notes`` (how it was computed, what is left out) are
  listed under the first line."""
  metrics = report.metrics
  parts = [
      f"# {title}",
      "",
      f"Predictions: `{source}`. Generated by `{command}`.",
      "",
      *[f"- {note}" for note in notes],
      *([""] if notes else []),
      "## Summary",
      "",
      markdown_table(("metric", "value"), scalar_rows(metrics, report.scoring, report.peers)),
      "",
      aumcc_note(metrics, settings),
      "",
      "## Threshold sweep",
      "",
      markdown_table(SWEEP_HEADERS, sweep_rows(metrics.sweep)),
      "",
      "The full sweep is in `metrics.json` (`sweep`).",
      "",
      choice_sentence(report.threshold_choice),
      "",
  ]
  if report.classes is not None:
    parts += group_section("Per-class breakdown (true class)", report.classes, "classes")
  if report.groups is not None:
    parts += group_section(f"Per-group breakdown (column `{report.groups.column}`)",
                           report.groups, "groups")
  if report.worst is not None:
    parts += worst_section(report.worst)
  if figures:
    parts += ["## Figures", ""] + figure_lines(figures)
  parts += settings_section(settings)
  text = "\n".join(parts)
  if intervals is not None:
    text += intervals_section(metrics, intervals, settings)
  return text


def real_scores_report(*, title: str, source: str, note: str, rows: Sequence[Sequence[str]],
                       figures: Sequence[tuple[str, str]], intervals: Intervals | None,
                       interval_rows: Sequence[Sequence[str]], convention: str) -> str:
  """Markdown for ``evaluate --scores real``: the order-based metrics of real-valued scores
  (``rows``: (metric, value); ``interval_rows``: (metric, value, low, high))."""
  parts = [f"# {title}", "", f"Predictions: `{source}`. Generated by `cwsa-jax evaluate "
           "--scores real`.", "", f"- {note}", "", "## Summary", "",
           markdown_table(("metric", "value"), rows), "",
           f"AURC, E-AURC and AUGRC use the convention `{convention}` (see `--aurc`); AUROC, "
           "FPR@95%TPR and the average precisions rank by the score, ties accepted together.",
           ""]
  if figures:
    parts += ["## Figures", ""] + figure_lines(figures)
  text = "\n".join(parts)
  if intervals is not None:
    lines = ["", f"## {intervals.level:.0%} bootstrap intervals", "",
             f"Percentile bootstrap over {intervals.num_resamples} "
             f"{_RESAMPLES[intervals.resampling]} (seed {intervals.seed}).", "",
             "| metric | value | low | high |", "|---|---:|---:|---:|"]
    lines += [f"| {' | '.join(r)} |" for r in interval_rows]
    lines += [f"\n{n}" for n in outside_notes([list(r) for r in interval_rows])]
    text += "\n".join(lines) + "\n"
  return text
