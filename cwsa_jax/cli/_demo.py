"""``cwsa-jax demo``: the paper's synthetic models and stress tests, many seeds, one report.

Nothing to download. Every case (5 models and 3 stress tests x 5 settings) is
drawn for ``--seeds`` seeds with ``jax.vmap`` over PRNG keys, stacked into one
[cases, seeds, n] batch and evaluated in a single call per metric, so the
whole run compiles each metric once.
"""

from __future__ import annotations

import argparse
import functools
import textwrap
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

import cwsa_jax as cw
from cwsa_jax import plots
from cwsa_jax import synthetic
from cwsa_jax.cli import _json, _markdown, _metrics, _output, _synthetic
from cwsa_jax.cli._figures import legend_below, reliability_caption, threshold_marker
from cwsa_jax.cli._format import fmt, fmt_convention, fmt_pm, markdown_table, text_table
from cwsa_jax.cli._metrics import Deployment, MeanStd, Metrics, threshold_index
from cwsa_jax.cli._settings import (Settings, add_min_coverage_flag, aumcc_caveat,
                                    check_min_coverage)
from cwsa_jax.cli._util import progress_enabled, stage, write_json_atomic

HELP = "run the paper's synthetic models and stress tests (no data needed)"
DESCRIPTION = ("Draw the paper's synthetic classifiers (calibrated, overconfident, underconfident, "
               "perfect, random) and three stress tests (label noise, class imbalance, confidence "
               "shift) for many seeds at once, print a summary table and write report.md, "
               "metrics.json and figures.")
DEFAULT_OUT = "cwsa-demo"


class StressTest(NamedTuple):
  """A stress test of the calibrated model: one case per value of its parameter."""
  name: str
  parameter: str      # the parameter's label (figure axes, table headers)
  case_label: str     # format of a case's name from the parameter value
  grid: tuple[float, ...]
  description: str


STRESS_TESTS = (
    StressTest("label_noise", "label noise rate", "noise {:g}", (0.0, 0.1, 0.2, 0.3, 0.4),
               "the calibrated model's labels corrupted after the fact (published "
               "`stress_noise.py`): confidences no longer match correctness"),
    StressTest("class_imbalance", "share of class 0", "class-0 share {:g}",
               (0.0, 0.1, 0.2, 0.3, 0.4),
               "class 0 takes the given share of the labels and the calibrated model is right on "
               "it only with probability 0.5 (instead of 0.9), so a larger rare-class share means "
               "more errors, all with the low confidence of a calibrated model"),
    StressTest("confidence_shift", "confidence shift", "shift {:+g}", (-0.2, -0.1, 0.0, 0.1, 0.2),
               "every confidence of the calibrated model moved by the shift and clipped to "
               "[0, 1]: negative = underconfident, positive = overconfident"),
)
MODEL_DESCRIPTIONS = {
    "calibrated": "right w.p. 0.9 (else a random label); confidence U[0.8, 1] if right, U[0.5, 0.7] if wrong",
    "overconfident": "right w.p. 0.9; confidence U[0.9, 1] whatever the outcome",
    "underconfident": "right w.p. 0.9; confidence U[0.4, 0.6] whatever the outcome",
    "perfect": "always right, confidence 1.0",
    "random": "uniformly random label; confidence U[0.3, 1]",
}
SUMMARY_TAUS = (0.5, 0.9)


class Case(NamedTuple):
  """One row of the demo's batch: a model (``group`` "model") or a stress-test setting."""
  group: str
  name: str
  parameter: float | None


@functools.partial(jax.jit, static_argnames=("num_seeds", "num_samples"))
def _draw_all(root: jax.Array, *, num_seeds: int, num_samples: int):
  """Every case's [S, n] predictions in one compiled call (vmap over cases and seeds)."""
  def seeds(key):
    return jax.random.split(key, num_seeds)

  models = synthetic.sample_models(root, num_seeds=num_seeds, num_samples=num_samples)
  base = jax.vmap(lambda k: synthetic.calibrated(k, num_samples=num_samples))(
      seeds(jax.random.fold_in(root, 100)))

  def noisy(key, rate):
    return jax.vmap(lambda k, s: synthetic.with_label_noise(k, s, rate=rate))(seeds(key), base)

  def imbalanced(key, share):
    return jax.vmap(lambda k: synthetic.imbalanced(
        k, class0_share=share, minority_p_correct=0.5, num_samples=num_samples))(seeds(key))

  def shifted(shift):
    return jax.vmap(lambda s: synthetic.with_confidence_shift(s, shift=shift))(base)

  grids = [jnp.array(test.grid, jnp.float32) for test in STRESS_TESTS]
  keys = [jax.vmap(lambda i, o=offset: jax.random.fold_in(root, o + i))(jnp.arange(len(g)))
          for offset, g in zip((200, 300), grids)]
  groups = [models, jax.vmap(noisy)(keys[0], grids[0]), jax.vmap(imbalanced)(keys[1], grids[1]),
            jax.vmap(shifted)(grids[2])]
  return (jnp.concatenate([g.confidences for g in groups]),
          jnp.concatenate([g.correct for g in groups]))


def build_cases(seed: int, num_seeds: int, num_samples: int) -> tuple[list[Case], jax.Array, jax.Array]:
  """The demo's cases and their [cases, S, n] confidences and correct."""
  cases = [Case("model", m, None) for m in synthetic.MODELS]
  for test in STRESS_TESTS:
    cases += [Case(test.name, test.case_label.format(v), v) for v in test.grid]
  confidences, correct = _draw_all(jax.random.key(seed), num_seeds=num_seeds, num_samples=num_samples)
  return cases, confidences, correct


def _indices(cases: list[Case], group: str) -> list[int]:
  return [i for i, case in enumerate(cases) if case.group == group]


def _summary_headers() -> list[str]:
  headers = ["model", "accuracy", "ECE", "AURC", "AUGRC"]
  for tau in SUMMARY_TAUS:
    headers += [f"CWSA@{tau:g}", f"CWSA+@{tau:g}"]
  return headers


def _summary_row(name: str, s: Metrics, thresholds: np.ndarray, *, with_std: bool = True) -> list[str]:
  """One model's row of the summary table; ``s`` holds :class:`MeanStd` values."""
  def cell(v: MeanStd) -> str:
    return fmt_pm(v.mean, v.std) if with_std else fmt(v.mean)

  row = [name] + [cell(getattr(s, key)) for key in ("accuracy", "ece", "aurc", "augrc")]
  for tau in SUMMARY_TAUS:
    i = threshold_index(thresholds, tau)
    for field in ("cwsa", "cwsa_plus"):
      v = getattr(s.sweep, field)
      row.append(fmt_convention(v.mean[i], s.sweep.coverage.mean[i], v.std[i] if with_std else None))
  return row


def _aumcc_rows(cases: list[Case], metrics: Metrics, model_idx: list[int]) -> list[list[str]]:
  """Per model: AUMCC(CWSA), the coverage span the grid sweeps and AUMCC ÷ span (seed means)."""
  rows = []
  for i in model_idx:
    high, low = _metrics.coverage_span(metrics.sweep.coverage[i])  # [S]
    area = np.asarray(metrics.aumcc.cwsa[i], np.float64)
    span = high - low
    with np.errstate(invalid="ignore", divide="ignore"):
      per_span = np.where(span > 0, area / np.where(span > 0, span, 1.0), np.nan)
    mean_per_span = fmt(np.nanmean(per_span)) if np.isfinite(per_span).any() else "— (span 0)"
    rows.append([cases[i].name, fmt_pm(*_metrics.mean_std(area)),
                 f"{fmt(np.nanmean(high))} → {fmt(np.nanmean(low))}", fmt(np.nanmean(span)),
                 mean_per_span])
  return rows


class _BinSide(NamedTuple):
  """The calibration bins on one side of the diagonal, over a model's seeds."""
  ece: float         # their part of the ECE (seed mean)
  share: float       # share of the samples they hold (pooled over seeds)
  accuracy: float    # their pooled accuracy
  confidence: float  # their pooled mean confidence


class CalibrationSplit(NamedTuple):
  """Where one model's (l1) ECE comes from.

  Attributes:
    under: the bins whose accuracy exceeds their mean confidence.
    over: the bins whose mean confidence exceeds their accuracy.
    max_gap: the largest |accuracy - mean confidence| of a bin, pooled over seeds.
    confidence: the overall mean confidence.
    accuracy: the overall accuracy.
  """
  under: _BinSide
  over: _BinSide
  max_gap: float
  confidence: float
  accuracy: float


def _calibration_split(conf: Any, ok: Any, settings: Settings) -> CalibrationSplit:
  """:class:`CalibrationSplit` of one model's [S, n] seeds."""
  bins = cw.calibration_bins(conf, ok, num_bins=settings.num_bins, binning=settings.binning)
  count = np.asarray(bins.count, np.float64)                       # [S, B]
  acc = np.nan_to_num(np.asarray(bins.accuracy, np.float64))
  mean_conf = np.nan_to_num(np.asarray(bins.mean_confidence, np.float64))
  weight = count / count.sum(axis=-1, keepdims=True)
  gap = acc - mean_conf

  def side(mask: np.ndarray) -> _BinSide:
    n = (count * mask).sum()
    return _BinSide(ece=float((weight * np.abs(gap) * mask).sum(-1).mean()),
                    share=float(n / count.sum()),
                    accuracy=float((count * acc * mask).sum() / n) if n else float("nan"),
                    confidence=float((count * mean_conf * mask).sum() / n) if n else float("nan"))

  pooled = count.sum(axis=0)
  with np.errstate(invalid="ignore", divide="ignore"):
    pooled_gap = ((count * gap).sum(axis=0) / pooled)[pooled > 0]
  return CalibrationSplit(
      under=side(gap > 0), over=side(gap < 0),
      max_gap=float(np.abs(pooled_gap).max()) if pooled_gap.size else float("nan"),
      confidence=float(np.asarray(conf, np.float64).mean()),
      accuracy=float(np.asarray(ok, np.float64).mean()))


# Why "calibrated" can have the larger ECE: in report.md's bullet and under the terminal table.
_ECE_REASON = ("ECE asks whether confidence equals accuracy within each confidence bin, not "
               "whether it separates right from wrong")
_ECE_VERDICT = ("By ECE the \"overconfident\" model is the better calibrated one; by E-AURC "
                "(how well confidence ranks right above wrong) the \"calibrated\" one is.")
_ECE_PAIR = ("calibrated", "overconfident")


class _EcePair(NamedTuple):
  """Seed means of ECE and E-AURC of "calibrated" and "overconfident", and their case indices."""
  ece: dict[str, float]
  eaurc: dict[str, float]
  index: dict[str, int]


def _ece_pair(cases: list[Case], summaries: list[Metrics], settings: Settings) -> _EcePair | None:
  """The numbers behind the ECE explanation, or None when "calibrated" does not have the
  larger ECE (L1) of the two (or either model is missing)."""
  index = {case.name: i for i, case in enumerate(cases) if case.group == "model"}
  if not set(_ECE_PAIR) <= set(index) or settings.ece_norm != "l1":
    return None
  ece = {m: float(summaries[index[m]].ece.mean) for m in _ECE_PAIR}
  if not ece["overconfident"] > 0 or ece["calibrated"] <= ece["overconfident"]:
    return None
  eaurc = {m: float(summaries[index[m]].eaurc.mean) for m in _ECE_PAIR}
  return _EcePair(ece, eaurc, index)


def _ece_note(cases: list[Case], summaries: list[Metrics], settings: Settings) -> str | None:
  """The reason of :func:`_ece_explanation` in short, for the terminal under the summary
  table (the table shows "calibrated" with the larger ECE); None when there is none."""
  pair = _ece_pair(cases, summaries, settings)
  if pair is None:
    return None
  ece, eaurc = pair.ece, pair.eaurc
  note = (f"Why \"calibrated\" has {ece['calibrated'] / ece['overconfident']:.1f}× the ECE of "
          f"\"overconfident\" ({fmt(ece['calibrated'])} vs {fmt(ece['overconfident'])}): the "
          f"paper names the models after their confidence ranges, and {_ECE_REASON}.")
  if eaurc["calibrated"] < eaurc["overconfident"]:
    note += (f" {_ECE_VERDICT[:-1]} (E-AURC {fmt(eaurc['calibrated'])} vs "
             f"{fmt(eaurc['overconfident'])}).")
  return note + " Details in report.md."


def _ece_explanation(cases: list[Case], conf: Any, ok: Any, summaries: list[Metrics],
                     settings: Settings) -> list[str]:
  """A bullet saying, from the numbers, why "calibrated" has a larger ECE than "overconfident"."""
  pair = _ece_pair(cases, summaries, settings)
  if pair is None:
    return []
  ece, eaurc, index = pair
  cal, over = (_calibration_split(np.asarray(conf[index[m]]), np.asarray(ok[index[m]]), settings)
               for m in _ECE_PAIR)
  params = synthetic.PAPER_PARAMETERS
  f = fmt
  right, wrong = params["calibrated"]["correct_confidence"], params["calibrated"]["wrong_confidence"]
  over_right = params["overconfident"]["correct_confidence"]
  over_wrong = params["overconfident"]["wrong_confidence"]
  same_range = (f"draws U[{over_right[0]:g}, {over_right[1]:g}] whether right or wrong, so its "
                "confidence says nothing about which predictions are right"
                if tuple(over_right) == tuple(over_wrong) else
                f"gives right predictions U[{over_right[0]:g}, {over_right[1]:g}] and wrong ones "
                f"U[{over_wrong[0]:g}, {over_wrong[1]:g}]")
  lines = [
      f"- **Why \"calibrated\" has {ece['calibrated'] / ece['overconfident']:.1f}× the ECE of "
      f"\"overconfident\"** ({f(ece['calibrated'])} vs {f(ece['overconfident'])}, seed means): "
      f"the paper names the models after their confidence ranges, and {_ECE_REASON}. "
      f"The calibrated model gives right predictions U[{right[0]:g}, {right[1]:g}] and wrong ones "
      f"U[{wrong[0]:g}, {wrong[1]:g}] (E-AURC {f(eaurc['calibrated'])}); the bins holding "
      f"{cal.under.share:.0%} of its predictions have accuracy {f(cal.under.accuracy)} "
      f"above their mean confidence {f(cal.under.confidence)}, adding {f(cal.under.ece)} to "
      f"its ECE, and those holding {cal.over.share:.0%} have mean confidence "
      f"{f(cal.over.confidence)} above their accuracy {f(cal.over.accuracy)}, adding "
      f"{f(cal.over.ece)}. The overconfident model {same_range} (E-AURC "
      f"{f(eaurc['overconfident'])}), but its mean confidence "
      f"{f(over.confidence)} is close to its accuracy {f(over.accuracy)} and no bin's "
      f"confidence is more than {f(over.max_gap)} from its accuracy (pooled over seeds).",
  ]
  if eaurc["calibrated"] < eaurc["overconfident"]:
    lines[0] += " " + _ECE_VERDICT
  return lines


_STRESS_HEADERS = ("accuracy", "ECE", "AURC", "CWSA@0.5", "CWSA@0.9", "coverage@0.9", "sel. acc.@0.9")


def _stress_rows(group_cases: list[Case], summaries: list[Metrics],
                 thresholds: np.ndarray) -> list[list[str]]:
  rows = []
  i9 = threshold_index(thresholds, 0.9)
  i5 = threshold_index(thresholds, 0.5)
  for case, s in zip(group_cases, summaries):
    sw = s.sweep
    cov = sw.coverage.mean
    rows.append([f"{case.parameter:g}", fmt(s.accuracy.mean), fmt(s.ece.mean), fmt(s.aurc.mean),
                 fmt_convention(sw.cwsa.mean[i5], cov[i5], sw.cwsa.std[i5]),
                 fmt_convention(sw.cwsa.mean[i9], cov[i9], sw.cwsa.std[i9]),
                 fmt(sw.coverage.mean[i9]), fmt(sw.selective_accuracy.mean[i9])])
  return rows


def _choices(cases: list[Case], conf: Any, ok: Any, settings: Settings) -> dict[str, Deployment]:
  """Deployment threshold of each model, chosen on its predictions pooled over the seeds."""
  conf, ok = np.asarray(conf), np.asarray(ok)
  return {cases[i].name: _metrics.choose_threshold(conf[i].reshape(-1), ok[i].reshape(-1), settings)
          for i in _indices(cases, "model")}


def _choice_rows(choices: dict[str, Deployment]) -> list[list[str]]:
  rows = []
  for name, deployment in choices.items():
    choice = deployment.choice
    if choice is None:
      rows.append([name, "infeasible", "—", "—", "—"])
    else:
      rows.append([name, f"{choice.threshold:.4g}", fmt(choice.coverage),
                   fmt(choice.selective_risk), fmt(choice.value)])
  return rows


def risk_coverage_figure(names: list[str], curves: cw.RiskCoverageCurve, aurc: Any,
                         augrc: Any) -> Figure:
  """The demo's risk_coverage.png: the curves of the models ``names`` (``curves`` batched
  over them, in that order), each legend with the model's area: AURC on the selective-risk
  panel, AUGRC on the generalized-risk panel."""
  curve_map = {name: type(curves)(*(np.asarray(x)[j] for x in curves))
               for j, name in enumerate(names)}
  return plots.risk_coverage(
      curve_map, title="Risk-coverage curves (seed 0)",
      labels={name: f"{name} (AURC {fmt(aurc[j])})" for j, name in enumerate(names)},
      general_labels={name: f"{name} (AUGRC {fmt(augrc[j])})" for j, name in enumerate(names)})


def _write_figures(out, cases: list[Case], conf: Any, ok: Any, metrics: Metrics,
                   per_case: list[Metrics], settings: Settings,
                   choices: dict[str, Deployment]) -> list[tuple[str, str]]:
  figures = []
  models = _indices(cases, "model")
  fig = plots.compare_models({cases[i].name: per_case[i].sweep for i in models},
                             title=f"Paper's synthetic models: mean ± 1 std over "
                             f"{metrics.sweep.cwsa.shape[1]} seeds")
  plots.save(fig, out / "comparison.png")
  figures.append(("comparison.png", "Selective accuracy, CWSA, CWSA+ and coverage vs. threshold, "
                  "one line per model (mean ± 1 std over seeds; where a model retains nothing its "
                  "CWSA and CWSA+ are marked x at 0 instead of drawn)."))
  for i in models:
    name = cases[i].name
    fig = plots.threshold_curves(per_case[i].sweep,
                                 title=f"{name} model: metrics vs. threshold (mean ± 1 std)",
                                 **threshold_marker(choices.get(name)))
    plots.save(fig, out / f"curves_{name}.png")
    figures.append((f"curves_{name}.png", f"The {name} model (as in the paper's figures)."))
  # Reliability and risk-coverage of seed 0 of each model, computed as one batch.
  conf0 = np.asarray(conf)[models, 0]
  ok0 = np.asarray(ok)[models, 0]
  bins = cw.calibration_bins(conf0, ok0, num_bins=settings.num_bins, binning=settings.binning)
  curves = cw.risk_coverage_curve(conf0, ok0)
  fig = Figure(figsize=(16.0, 4.8), layout="constrained")
  subfigs = fig.subfigures(1, len(models))
  for j, (i, sub) in enumerate(zip(models, subfigs)):
    one = type(bins)(*(np.asarray(x)[j] for x in bins))
    plots.reliability_diagram(one, title=f"{cases[i].name} (ECE {fmt(metrics.ece[i, 0])})",
                              figure=sub, legend=False)
  legend_below(fig, (axes for sub in subfigs for axes in sub.axes), max_columns=4)
  fig.suptitle("Reliability diagrams (seed 0): per-bin accuracy vs. confidence, sample counts below")
  plots.save(fig, out / "reliability.png")
  figures.append(("reliability.png", "Seed 0 of each model. " + reliability_caption(settings)))
  fig = risk_coverage_figure([cases[i].name for i in models], curves,
                             np.asarray(metrics.aurc)[models, 0],
                             np.asarray(metrics.augrc)[models, 0])
  plots.save(fig, out / "risk_coverage.png")
  figures.append(("risk_coverage.png", "Selective and generalized risk vs. coverage (seed 0)."))
  fig = Figure(figsize=(16.0, 4.6), layout="constrained")
  axes = fig.subplots(1, len(STRESS_TESTS))
  i5 = threshold_index(metrics.sweep.thresholds, 0.5)
  i9 = threshold_index(metrics.sweep.thresholds, 0.9)
  for ax, test in zip(axes, STRESS_TESTS):
    idx = _indices(cases, test.name)
    cwsa, coverage = metrics.sweep.cwsa[idx], metrics.sweep.coverage[idx]
    series = {
        "accuracy": metrics.accuracy[idx].T,
        "ECE": metrics.ece[idx].T,
        "AURC": metrics.aurc[idx].T,
        "CWSA@0.5": cwsa[:, :, i5].T,
        "CWSA@0.9": cwsa[:, :, i9].T,
    }
    empty = {"CWSA@0.5": coverage[:, :, i5].T == 0, "CWSA@0.9": coverage[:, :, i9].T == 0}
    plots.stress_test(test.grid, series, xlabel=test.parameter, ax=ax, empty=empty, legend=False,
                      title=test.name.replace("_", " ").capitalize())
  legend_below(fig, axes)
  fig.suptitle("Stress tests on the calibrated model (mean ± 1 std over seeds)")
  plots.save(fig, out / "stress_tests.png")
  figures.append(("stress_tests.png", "Metrics of the calibrated model under label noise, "
                  "class imbalance and confidence shift (x at 0: nothing retained at that "
                  "threshold, CWSA 0 by convention)."))
  return figures


def run(args: argparse.Namespace) -> int:
  out = _synthetic.output_dir(args, default_out=DEFAULT_OUT)
  start = time.perf_counter()
  show = progress_enabled(args)
  settings = Settings(min_coverage=check_min_coverage(args.min_coverage))
  with stage("drawing the models", enabled=show):
    cases, conf, ok = build_cases(args.seed, args.seeds, args.n)
  with stage("metrics", enabled=show):
    metrics = _metrics.compute_metrics(conf, ok, settings)
  per_case = [_metrics.map_values(lambda x, i=i: x[i], metrics) for i in range(len(cases))]
  summaries = [_metrics.summarize(m) for m in per_case]
  thresholds = metrics.sweep.thresholds

  model_idx = _indices(cases, "model")
  choices = _choices(cases, conf, ok, settings)
  summary_rows = [_summary_row(cases[i].name, summaries[i], thresholds) for i in model_idx]
  print(f"cwsa-jax demo: the paper's synthetic models, n = {args.n}, mean over {args.seeds} seeds "
        "(± std in report.md);\nCWSA as the paper defines it (divided by the retained count)\n")
  print(text_table(
      _summary_headers(),
      [_summary_row(cases[i].name, summaries[i], thresholds, with_std=False) for i in model_idx]))
  note = _ece_note(cases, summaries, settings)
  if note is not None:
    print("\n" + textwrap.fill(note, width=100))

  with _output.atomic_output_dir(out, force=args.force, command="demo",
                                 hint=_synthetic.out_hint(DEFAULT_OUT)) as tmp:
    with stage("figures", enabled=show and not args.no_figures):
      figures = [] if args.no_figures else _write_figures(tmp, cases, conf, ok, metrics, per_case,
                                                          settings, choices)
    payload = {
        "command": "demo",
        "config": _synthetic.config_json(args),
        "settings": _json.settings_json(settings),
        "models": {cases[i].name: {"parameters": _synthetic.model_parameters(cases[i].name),
                                   **_json.metrics_json(summaries[i]),
                                   "threshold_choice": _json.deployment_json(choices[cases[i].name])}
                   for i in model_idx},
        "stress_tests": {
            test.name: {"parameter": test.parameter, "values": list(test.grid),
                        "results": [_json.metrics_json(summaries[i])
                                    for i in _indices(cases, test.name)]}
            for test in STRESS_TESTS},
    }
    write_json_atomic(tmp / "metrics.json", payload)
    text = _report_text(args, cases, summaries, summary_rows, settings, figures, thresholds,
                        choices, _aumcc_rows(cases, metrics, model_idx),
                        _ece_explanation(cases, conf, ok, summaries, settings))
    (tmp / "report.md").write_text(text, encoding="utf-8")
  _synthetic.print_written(out, len(figures), start)
  return 0


def _report_text(args, cases, summaries, summary_rows, settings, figures, thresholds,
                 choices, aumcc_rows=(), ece_lines=()) -> str:
  md = markdown_table
  mark = _markdown.AUMCC_MARK
  parts = [
      "# cwsa-jax demo: the paper's synthetic models",
      "",
      f"Each model draws n = {args.n} predictions over 3 classes; every number is the mean ± "
      f"sample standard deviation over {args.seeds} seeds (base seed {args.seed}), all drawn in "
      "one `jax.vmap` over PRNG keys. CWSA divides by the retained count, as the paper defines it "
      "(see *Conventions*). Regenerate with `cwsa-jax demo`.",
      "",
      "## The models",
      "",
      md(("model", "definition"), [(m, MODEL_DESCRIPTIONS[m]) for m in synthetic.MODELS], "ll"),
      "",
      "## Summary",
      "",
      md(_summary_headers(), summary_rows),
      "",
      "What to look for:",
      "",
      "- **overconfident** vs **calibrated**: nearly the same accuracy, but CWSA penalises the "
      "confident mistakes; at τ = 0.9 the calibrated model keeps only correct predictions.",
      "- **underconfident**: high accuracy but CWSA and CWSA+ are small (φ is at most 0.2 at "
      "τ = 0.5) and zero above τ = 0.6, where nothing is retained.",
      "- **random**: CWSA is negative at every threshold (two thirds of the retained predictions "
      "are wrong); the paper's Table (random model) reports −0.110 at τ = 0.5 because its code "
      "divides by n: coverage × CWSA.",
      "- **perfect**: every metric saturates (CWSA = CWSA+ = 1, ECE = AURC = 0).",
      *ece_lines,
      "",
      "Cells marked *0 (S empty)*: no seed retains anything at that threshold; CWSA and CWSA+ "
      "are 0 there by the paper's convention, not by measurement.",
      "",
      "### AUMCC",
      "",
      md(("model", f"AUMCC(CWSA) {mark}", "coverage swept (τ low → high)",
          "coverage span", "AUMCC ÷ span"), aumcc_rows),
      "",
      f"{mark} {aumcc_caveat(settings.aumcc_axis)} Here the perfect "
      "model's coverage never moves (every confidence is 1.0), so its area is 0 although its CWSA "
      "is 1 at every threshold; AUMCC ÷ span is the mean CWSA over the coverage the grid sweeps "
      "(seed means).",
      "",
      *_markdown.figure_lines(figures[:1]),
      "## Deployment threshold",
      "",
      f"The threshold `select_threshold` picks for each model: the largest CWSA (divided by |S|) "
      f"on the grid subject to coverage ≥ {settings.min_coverage:g} (`--min-coverage`), chosen on "
      "the model's "
      f"predictions pooled over the {args.seeds} seeds; the per-model figures mark it. "
      "*infeasible*: no threshold of the grid keeps that coverage.",
      "",
      md(("model", "threshold", "coverage", "selective risk", "CWSA"), _choice_rows(choices)),
      "",
      "## Stress tests",
      "",
  ]
  for test in STRESS_TESTS:
    idx = _indices(cases, test.name)
    parts += [f"### {test.name.replace('_', ' ').capitalize()}", "",
              f"{test.description.capitalize()}.", "",
              md((test.parameter,) + _STRESS_HEADERS,
                 _stress_rows([cases[i] for i in idx], [summaries[i] for i in idx], thresholds)),
              ""]
  if figures[1:]:
    parts += ["## Figures", ""] + _markdown.figure_lines(figures[1:])
  parts += _markdown.settings_section(settings)
  return "\n".join(parts)


def add_parser(sub) -> None:
  p = sub.add_parser("demo", help=HELP, description=DESCRIPTION)
  _synthetic.add_flags(p, default_out=DEFAULT_OUT, seeds=100)
  p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
  add_min_coverage_flag(p)
  p.set_defaults(func=run)
