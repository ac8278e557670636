"""``cwsa-jax demo``: the paper's synthetic models and stress tests, many seeds, one report.

Nothing to download. Every case (5 models and 3 stress tests x 5 settings) is
drawn for ``--seeds`` seeds with ``jax.vmap`` over PRNG keys, stacked into one
[cases, seeds, n] batch and evaluated in a single call per metric, so the
whole run compiles each metric once.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from cwsa_jax import _output
from cwsa_jax import _report
from cwsa_jax import plots
from cwsa_jax import synthetic
from cwsa_jax._calibration import calibration_bins
from cwsa_jax._cli_util import (UserError, add_synthetic_run_flags, progress_enabled, stage,
                                write_json_atomic)
from cwsa_jax._risk_coverage import risk_coverage_curve

DEFAULT_OUT = "cwsa-demo"
_OUT_HINT = ", or omit --out for a fresh ./cwsa-demo-N"
# The stress tests: (name, parameter label, grid, description).
STRESS_TESTS = (
    ("label_noise", "label noise rate", (0.0, 0.1, 0.2, 0.3, 0.4),
     "the calibrated model's labels corrupted after the fact (published `stress_noise.py`): "
     "confidences no longer match correctness"),
    ("class_imbalance", "share of class 0", (0.0, 0.1, 0.2, 0.3, 0.4),
     "class 0 takes the given share of the labels and the calibrated model is right on it only "
     "with probability 0.5 (instead of 0.9), so a larger rare-class share means more errors, "
     "all with the low confidence of a calibrated model"),
    ("confidence_shift", "confidence shift", (-0.2, -0.1, 0.0, 0.1, 0.2),
     "every confidence of the calibrated model moved by the shift and clipped to [0, 1]: "
     "negative = underconfident, positive = overconfident"),
)
MODEL_DESCRIPTIONS = {
    "calibrated": "right w.p. 0.9 (else a random label); confidence U[0.8, 1] if right, U[0.5, 0.7] if wrong",
    "overconfident": "right w.p. 0.9; confidence U[0.9, 1] whatever the outcome",
    "underconfident": "right w.p. 0.9; confidence U[0.4, 0.6] whatever the outcome",
    "perfect": "always right, confidence 1.0",
    "random": "uniformly random label; confidence U[0.3, 1]",
}
SUMMARY_TAUS = (0.5, 0.9)


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

  grids = [jnp.array(grid, jnp.float32) for _, _, grid, _ in STRESS_TESTS]
  keys = [jax.vmap(lambda i, o=offset: jax.random.fold_in(root, o + i))(jnp.arange(len(g)))
          for offset, g in zip((200, 300), grids)]
  groups = [models, jax.vmap(noisy)(keys[0], grids[0]), jax.vmap(imbalanced)(keys[1], grids[1]),
            jax.vmap(shifted)(grids[2])]
  return (jnp.concatenate([g.confidences for g in groups]),
          jnp.concatenate([g.correct for g in groups]))


def build_cases(seed: int, num_seeds: int, num_samples: int) -> tuple[list[dict[str, Any]], jax.Array, jax.Array]:
  """The demo's cases (group, name, parameter) and their [cases, S, n] confidences and correct."""
  cases = [dict(group="model", name=m, parameter=None) for m in synthetic.MODELS]
  names = {"label_noise": "noise {:g}", "class_imbalance": "class-0 share {:g}",
           "confidence_shift": "shift {:+g}"}
  for group, _, grid, _ in STRESS_TESTS:
    cases += [dict(group=group, name=names[group].format(v), parameter=v) for v in grid]
  confidences, correct = _draw_all(jax.random.key(seed), num_seeds=num_seeds, num_samples=num_samples)
  return cases, confidences, correct


def _tau_index(thresholds: np.ndarray, tau: float) -> int:
  return int(np.argmin(np.abs(np.asarray(thresholds, np.float64) - tau)))


def _case_summary(metrics: dict[str, Any], c: int) -> dict[str, Any]:
  """Mean / std over seeds of case ``c`` of the stacked metrics."""
  one = {"n": metrics["n"]}
  for key, value in metrics.items():
    if key == "n":
      continue
    if isinstance(value, dict):
      one[key] = {k: (v if k == "thresholds" else v[c]) for k, v in value.items()}
    else:
      one[key] = value[c]
  return _report.summarize(one)


def _summary_row(name: str, s: dict[str, Any], thresholds: np.ndarray, *,
                 with_std: bool = True) -> list[str]:
  def cell(mean, std):
    return _report.fmt_pm(mean, std) if with_std else _report.fmt(mean)

  row = [name]
  for key in ("accuracy", "ece", "aurc", "augrc"):
    row.append(cell(s[key]["mean"], s[key]["std"]))
  for tau in SUMMARY_TAUS:
    i = _tau_index(thresholds, tau)
    for field in ("cwsa", "cwsa_plus"):
      row.append(_report.fmt_convention(s["sweep"][field]["mean"][i],
                                        s["sweep"]["coverage"]["mean"][i],
                                        s["sweep"][field]["std"][i] if with_std else None))
  return row


def _summary_headers() -> list[str]:
  headers = ["model", "accuracy", "ECE", "AURC", "AUGRC"]
  for tau in SUMMARY_TAUS:
    headers += [f"CWSA@{tau:g}", f"CWSA+@{tau:g}"]
  return headers


def _aumcc_rows(cases, metrics, model_idx) -> list[list[str]]:
  """Per model: AUMCC(CWSA), the coverage span the grid sweeps and AUMCC ÷ span (seed means)."""
  rows = []
  for i in model_idx:
    high, low = _report.coverage_span(metrics["sweep"]["coverage"][i])  # [S]
    area = np.asarray(metrics["aumcc"]["cwsa"][i], np.float64)
    span = high - low
    with np.errstate(invalid="ignore", divide="ignore"):
      per_span = np.where(span > 0, area / np.where(span > 0, span, 1.0), np.nan)
    mean_per_span = (_report.fmt(np.nanmean(per_span)) if np.isfinite(per_span).any()
                     else "— (span 0)")
    rows.append([cases[i]["name"], _report.fmt_pm(*_nan_mean_std(area)),
                 f"{_report.fmt(np.nanmean(high))} → {_report.fmt(np.nanmean(low))}",
                 _report.fmt(np.nanmean(span)), mean_per_span])
  return rows


def _nan_mean_std(x: np.ndarray) -> tuple[float, float]:
  """Mean and sample std over seeds, ignoring NaN."""
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    return float("nan"), float("nan")
  return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def _calibration_split(conf: Any, ok: Any, settings: _report.Settings) -> dict[str, float]:
  """Where one model's ECE comes from, over its [S, n] seeds (l1 ECE only).

  Returns seed means of ``ece`` = ``under`` + ``over``: the count-weighted gaps of
  the bins where accuracy exceeds mean confidence and where it falls short; and,
  pooled over seeds, the share of samples, accuracy and mean confidence of each
  kind of bin, the largest |accuracy - confidence| of a bin (``max_gap``), the
  overall mean confidence and accuracy.
  """
  bins = calibration_bins(conf, ok, num_bins=settings.num_bins, binning=settings.binning)
  count = np.asarray(bins.count, np.float64)                       # [S, B]
  acc = np.nan_to_num(np.asarray(bins.accuracy, np.float64))
  mean_conf = np.nan_to_num(np.asarray(bins.mean_confidence, np.float64))
  weight = count / count.sum(axis=-1, keepdims=True)
  gap = acc - mean_conf
  out = {"under": float((weight * np.maximum(gap, 0)).sum(-1).mean()),
         "over": float((weight * np.maximum(-gap, 0)).sum(-1).mean())}
  out["ece"] = out["under"] + out["over"]
  for kind, mask in (("under", gap > 0), ("over", gap < 0)):
    n = (count * mask).sum()
    out[f"{kind}_share"] = float(n / count.sum())
    out[f"{kind}_accuracy"] = float((count * acc * mask).sum() / n) if n else float("nan")
    out[f"{kind}_confidence"] = float((count * mean_conf * mask).sum() / n) if n else float("nan")
  pooled = count.sum(axis=0)
  with np.errstate(invalid="ignore", divide="ignore"):
    pooled_gap = ((count * gap).sum(axis=0) / pooled)[pooled > 0]
  out["max_gap"] = float(np.abs(pooled_gap).max()) if pooled_gap.size else float("nan")
  out["confidence"] = float(np.asarray(conf, np.float64).mean())
  out["accuracy"] = float(np.asarray(ok, np.float64).mean())
  return out


def _ece_explanation(cases, conf, ok, summaries, settings: _report.Settings) -> list[str]:
  """A bullet saying, from the numbers, why "calibrated" has a larger ECE than "overconfident"."""
  index = {c["name"]: i for i, c in enumerate(cases) if c["group"] == "model"}
  if not {"calibrated", "overconfident"} <= set(index) or settings.ece_norm != "l1":
    return []
  ece = {m: float(summaries[index[m]]["ece"]["mean"]) for m in ("calibrated", "overconfident")}
  if not ece["overconfident"] > 0 or ece["calibrated"] <= ece["overconfident"]:
    return []
  cal = _calibration_split(np.asarray(conf[index["calibrated"]]), np.asarray(ok[index["calibrated"]]),
                           settings)
  over = _calibration_split(np.asarray(conf[index["overconfident"]]),
                            np.asarray(ok[index["overconfident"]]), settings)
  eaurc = {m: float(summaries[index[m]]["eaurc"]["mean"]) for m in ("calibrated", "overconfident")}
  params = synthetic.PAPER_PARAMETERS
  f = _report.fmt
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
      "the paper names the models after their confidence ranges, and ECE asks whether confidence "
      "equals accuracy within each confidence bin, not whether it separates right from wrong. "
      f"The calibrated model gives right predictions U[{right[0]:g}, {right[1]:g}] and wrong ones "
      f"U[{wrong[0]:g}, {wrong[1]:g}] (E-AURC {f(eaurc['calibrated'])}); the bins holding "
      f"{cal['under_share']:.0%} of its predictions have accuracy {f(cal['under_accuracy'])} "
      f"above their mean confidence {f(cal['under_confidence'])}, adding {f(cal['under'])} to "
      f"its ECE, and those holding {cal['over_share']:.0%} have mean confidence "
      f"{f(cal['over_confidence'])} above their accuracy {f(cal['over_accuracy'])}, adding "
      f"{f(cal['over'])}. The overconfident model {same_range} (E-AURC "
      f"{f(eaurc['overconfident'])}), but its mean confidence "
      f"{f(over['confidence'])} is close to its accuracy {f(over['accuracy'])} and no bin's "
      f"confidence is more than {f(over['max_gap'])} from its accuracy (pooled over seeds).",
  ]
  if eaurc["calibrated"] < eaurc["overconfident"]:
    lines[0] += (" By ECE the \"overconfident\" model is the better calibrated one; by E-AURC "
                 "(how well confidence ranks right above wrong) the \"calibrated\" one is.")
  return lines


def _stress_rows(group_cases, summaries, thresholds) -> list[list[str]]:
  rows = []
  i9 = _tau_index(thresholds, 0.9)
  i5 = _tau_index(thresholds, 0.5)
  for case, s in zip(group_cases, summaries):
    sw = s["sweep"]
    cov = sw["coverage"]["mean"]
    rows.append([f"{case['parameter']:g}",
                 _report.fmt(s["accuracy"]["mean"]), _report.fmt(s["ece"]["mean"]),
                 _report.fmt(s["aurc"]["mean"]),
                 _report.fmt_convention(sw["cwsa"]["mean"][i5], cov[i5], sw["cwsa"]["std"][i5]),
                 _report.fmt_convention(sw["cwsa"]["mean"][i9], cov[i9], sw["cwsa"]["std"][i9]),
                 _report.fmt(sw["coverage"]["mean"][i9]),
                 _report.fmt(sw["selective_accuracy"]["mean"][i9])])
  return rows


_STRESS_HEADERS = ("accuracy", "ECE", "AURC", "CWSA@0.5", "CWSA@0.9", "coverage@0.9", "sel. acc.@0.9")


def _choices(cases, conf, ok, settings) -> dict[str, dict[str, Any]]:
  """Deployment threshold of each model, chosen on its predictions pooled over the seeds."""
  conf, ok = np.asarray(conf), np.asarray(ok)
  return {c["name"]: _report.choose_threshold(conf[i].reshape(-1), ok[i].reshape(-1), settings)
          for i, c in enumerate(cases) if c["group"] == "model"}


def _choice_rows(choices: dict[str, dict[str, Any]]) -> list[list[str]]:
  rows = []
  for name, ch in choices.items():
    if ch["feasible"]:
      rows.append([name, f"{ch['threshold']:.4g}", _report.fmt(ch["coverage"]),
                   _report.fmt(ch["selective_risk"]), _report.fmt(ch["value"])])
    else:
      rows.append([name, "infeasible", "—", "—", "—"])
  return rows


def _figures(out, cases, conf, ok, metrics, settings, choices=None) -> list[tuple[str, str]]:
  figures = []
  models = [i for i, c in enumerate(cases) if c["group"] == "model"]
  sweeps = {cases[i]["name"]: {k: v[i] for k, v in metrics["sweep"].items() if k != "thresholds"}
            | {"thresholds": metrics["sweep"]["thresholds"]} for i in models}
  fig = plots.compare_models(sweeps, title=f"Paper's synthetic models: mean ± 1 std over "
                             f"{metrics['sweep']['cwsa'].shape[1]} seeds")
  plots.save(fig, out / "comparison.png")
  figures.append(("comparison.png", "Selective accuracy, CWSA, CWSA+ and coverage vs. threshold, "
                  "one line per model (mean ± 1 std over seeds; where a model retains nothing its "
                  "CWSA and CWSA+ are marked x at 0 instead of drawn)."))
  for name, result in sweeps.items():
    choice = (choices or {}).get(name)
    marker = choice["threshold"] if choice and choice["feasible"] else None
    fig = plots.threshold_curves(result, title=f"{name} model: metrics vs. threshold (mean ± 1 std)",
                                 marker=marker,
                                 marker_label=None if marker is None else _report.marker_text(choice))
    plots.save(fig, out / f"curves_{name}.png")
    figures.append((f"curves_{name}.png", f"The {name} model (as in the paper's figures)."))
  # Reliability and risk-coverage of seed 0 of each model, computed as one batch.
  conf0 = np.asarray(conf)[models, 0]
  ok0 = np.asarray(ok)[models, 0]
  bins = calibration_bins(conf0, ok0, num_bins=settings.num_bins, binning=settings.binning)
  curves = risk_coverage_curve(conf0, ok0)
  fig = Figure(figsize=(16.0, 4.8), layout="constrained")
  subfigs = fig.subfigures(1, len(models))
  legend: dict[str, Any] = {}
  for j, (i, sub) in enumerate(zip(models, subfigs)):
    one = type(bins)(*(np.asarray(x)[j] for x in bins))
    plots.reliability_diagram(one, title=f"{cases[i]['name']} (ECE {_report.fmt(metrics['ece'][i, 0])})",
                              figure=sub, legend=False)
    for axes in sub.axes:
      for handle, label in zip(*axes.get_legend_handles_labels()):
        legend.setdefault(label, handle)
  fig.legend(list(legend.values()), list(legend), loc="outside lower center",
             ncols=min(len(legend), 4), frameon=False, fontsize="small")
  fig.suptitle("Reliability diagrams (seed 0): per-bin accuracy vs. confidence, sample counts below")
  plots.save(fig, out / "reliability.png")
  figures.append(("reliability.png", "Seed 0 of each model. " + _report.reliability_caption(settings)))
  curve_map = {cases[i]["name"]: type(curves)(*(np.asarray(x)[j] for x in curves))
               for j, i in enumerate(models)}
  labels = {cases[i]["name"]: f"{cases[i]['name']} (AURC {_report.fmt(metrics['aurc'][i, 0])})"
            for i in models}
  fig = plots.risk_coverage(curve_map, title="Risk-coverage curves (seed 0)", labels=labels)
  plots.save(fig, out / "risk_coverage.png")
  figures.append(("risk_coverage.png", "Selective and generalized risk vs. coverage (seed 0)."))
  fig = Figure(figsize=(16.0, 4.6), layout="constrained")
  axes = fig.subplots(1, len(STRESS_TESTS))
  legend = {}
  i5 = _tau_index(metrics["sweep"]["thresholds"], 0.5)
  i9 = _tau_index(metrics["sweep"]["thresholds"], 0.9)
  for ax, (group, xlabel, grid, _) in zip(axes, STRESS_TESTS):
    idx = [i for i, c in enumerate(cases) if c["group"] == group]
    series = {
        "accuracy": metrics["accuracy"][idx].T,
        "ECE": metrics["ece"][idx].T,
        "AURC": metrics["aurc"][idx].T,
        "CWSA@0.5": metrics["sweep"]["cwsa"][idx, :, i5].T,
        "CWSA@0.9": metrics["sweep"]["cwsa"][idx, :, i9].T,
    }
    empty = {"CWSA@0.5": metrics["sweep"]["coverage"][idx, :, i5].T == 0,
             "CWSA@0.9": metrics["sweep"]["coverage"][idx, :, i9].T == 0}
    plots.stress_test(grid, series, xlabel=xlabel, ax=ax, empty=empty, legend=False,
                      title=group.replace("_", " ").capitalize())
    for handle, label in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(label, handle)
  fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=len(legend),
             frameon=False, fontsize="small")
  fig.suptitle("Stress tests on the calibrated model (mean ± 1 std over seeds)")
  plots.save(fig, out / "stress_tests.png")
  figures.append(("stress_tests.png", "Metrics of the calibrated model under label noise, "
                  "class imbalance and confidence shift (x at 0: nothing retained at that "
                  "threshold, CWSA 0 by convention)."))
  return figures


def run(args: argparse.Namespace) -> int:
  if args.seeds < 1:
    raise UserError(f"--seeds must be >= 1, got {args.seeds}")
  if args.n < 2:
    raise UserError(f"--n must be >= 2, got {args.n}")
  out = _output.check_output_dir(
      args.out if args.out is not None else _report.fresh_output_dir(DEFAULT_OUT),
      force=args.force, hint=_OUT_HINT)
  start = time.perf_counter()
  show = progress_enabled(args)
  settings = _report.Settings(min_coverage=_report.check_min_coverage(args.min_coverage))
  with stage("drawing the models", enabled=show):
    cases, conf, ok = build_cases(args.seed, args.seeds, args.n)
  with stage("metrics", enabled=show):
    metrics = _report.compute_metrics(conf, ok, settings)
  summaries = [_case_summary(metrics, i) for i in range(len(cases))]
  thresholds = metrics["sweep"]["thresholds"]

  model_idx = [i for i, c in enumerate(cases) if c["group"] == "model"]
  choices = _choices(cases, conf, ok, settings)
  summary_rows = [_summary_row(cases[i]["name"], summaries[i], thresholds) for i in model_idx]
  print(f"cwsa-jax demo: the paper's synthetic models, n = {args.n}, mean over {args.seeds} seeds "
        "(± std in report.md);\nCWSA as the paper defines it (divided by the retained count)\n")
  print(_report.text_table(
      _summary_headers(),
      [_summary_row(cases[i]["name"], summaries[i], thresholds, with_std=False) for i in model_idx]))

  with _output.atomic_output_dir(out, force=args.force, command="demo", hint=_OUT_HINT) as tmp:
    with stage("figures", enabled=show and not args.no_figures):
      figures = [] if args.no_figures else _figures(tmp, cases, conf, ok, metrics, settings,
                                                    choices)
    payload = {
        "command": "demo",
        "config": {"seed": args.seed, "seeds": args.seeds, "n": args.n,
                   "num_classes": synthetic.PAPER_NUM_CLASSES},
        "settings": settings.to_json(),
        "models": {cases[i]["name"]: {"parameters": _params_json(cases[i]["name"]),
                                      **_report.to_json(summaries[i]),
                                      "threshold_choice": _report.to_json(choices[cases[i]["name"]])}
                   for i in model_idx},
        "stress_tests": {
            group: {"parameter": label, "values": list(grid),
                    "results": [_report.to_json(summaries[i]) for i, c in enumerate(cases)
                                if c["group"] == group]}
            for group, label, grid, _ in STRESS_TESTS},
    }
    write_json_atomic(tmp / "metrics.json", payload)
    text = _report_text(args, cases, summaries, summary_rows, settings, figures, thresholds,
                        choices, _aumcc_rows(cases, metrics, model_idx),
                        _ece_explanation(cases, conf, ok, summaries, settings))
    (tmp / "report.md").write_text(text, encoding="utf-8")
  elapsed = time.perf_counter() - start
  print(f"\nWrote {out}/report.md, {out}/metrics.json and {len(figures)} figures "
        f"in {elapsed:.1f} s")
  return 0


def _params_json(model: str) -> dict[str, Any]:
  return {k: (list(v) if isinstance(v, tuple) else v)
          for k, v in synthetic.PAPER_PARAMETERS[model].items()}


def _report_text(args, cases, summaries, summary_rows, settings, figures, thresholds,
                 choices, aumcc_rows=(), ece_lines=()) -> str:
  md = _report.markdown_table
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
      md(("model", f"AUMCC(CWSA) {_report.AUMCC_MARK}", "coverage swept (τ low → high)",
          "coverage span", "AUMCC ÷ span"), aumcc_rows),
      "",
      f"{_report.AUMCC_MARK} {_report.aumcc_caveat(settings.aumcc_axis)} Here the perfect "
      "model's coverage never moves (every confidence is 1.0), so its area is 0 although its CWSA "
      "is 1 at every threshold; AUMCC ÷ span is the mean CWSA over the coverage the grid sweeps "
      "(seed means).",
      "",
  ]
  for file, caption in figures[:1]:
    parts += [f"![{caption}]({file})", "", f"*{caption}*", ""]
  parts += [
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
  ]
  parts += ["## Stress tests", ""]
  for group, label, grid, description in STRESS_TESTS:
    idx = [i for i, c in enumerate(cases) if c["group"] == group]
    parts += [f"### {group.replace('_', ' ').capitalize()}", "", f"{description.capitalize()}.", "",
              md((label,) + _STRESS_HEADERS,
                 _stress_rows([cases[i] for i in idx], [summaries[i] for i in idx], thresholds)),
              ""]
  if figures[1:]:
    parts += ["## Figures", ""]
  for file, caption in figures[1:]:
    parts += [f"![{caption}]({file})", "", f"*{caption}*", ""]
  parts += ["## Settings", "", md(("setting", "value"), settings.describe(), "ll"), "",
            "## Conventions", "", _report.CONVENTIONS_NOTE]
  return "\n".join(parts)


def add_parser(sub) -> None:
  p = sub.add_parser(
      "demo", help="run the paper's synthetic models and stress tests (no data needed)",
      description="Draw the paper's synthetic classifiers (calibrated, overconfident, "
      "underconfident, perfect, random) and three stress tests (label noise, class imbalance, "
      "confidence shift) for many seeds at once, print a summary table and write report.md, "
      "metrics.json and figures.")
  add_synthetic_run_flags(p, default_out=DEFAULT_OUT, seeds=100,
                          num_samples=synthetic.PAPER_NUM_SAMPLES)
  p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
  _report.add_min_coverage_flag(p)
  p.set_defaults(func=run)
