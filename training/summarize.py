"""Collects finished training runs into ``results/training/summary.json`` and ``README.md``.

Usage: python -m cwsa_jax.training.summarize RUN_DIR [RUN_DIR ...] [--out results/training]

Each RUN_DIR holds the ``metrics.json`` and ``config.json`` written by
``cwsa-jax train``. The README gets the mean +- std over seeds per (dataset,
loss variant); for the runs with a validation split, per dataset, a table of
every (loss, confidence score) pair (accuracy, NLL and ECE before/after
temperature scaling, AURC, AUGRC, E-AURC, CWSA/CWSA+ at 0.5 and 0.9) and one
of the temperature and the deployment threshold; then one row per run with
the command that reproduces it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from cwsa_jax.cli._util import write_json_atomic
from .study import parse_run_name

FIELDS = ("dataset", "loss", "seed", "epochs", "test_accuracy", "ece", "aurc", "eaurc", "augrc",
          "cwsa", "cwsa_plus", "wall_seconds", "data_source", "device")
DATASET_LABEL = {"mnist": "MNIST", "cifar10": "CIFAR-10 (JPEG copy)"}
# The per-score table's rows (metrics.json "scores"; runs before the validation split lack them).
SCORES = ("msp", "max_logit", "margin", "neg_entropy", "doctor")
CONFIG_FIELDS = ("epochs", "batch_size", "optimizer", "learning_rate", "weight_decay", "augment",
                 "cwsa_weight", "cwsa_tau", "cwsa_temperature", "cwsa_band", "cwsa_correctness")
# Fields runs before the validation split lack (None there).
NEW_CONFIG_FIELDS = ("cwsa_temperature_start", "label_smoothing", "focal_gamma", "soft_aurc_weight",
                     "soft_aurc_temperature", "val_fraction", "threshold_metric",
                     "threshold_min_coverage", "threshold_max_risk")


def command_for(config: dict, run_dir: str) -> str:
  parts = ["cwsa-jax train", f"--dataset {config['dataset']}", f"--loss {config['loss']}",
           f"--epochs {config['epochs']}", f"--seed {config['seed']}", "--data-dir DATA",
           f"--out {run_dir}"]
  if config["loss"] == "cwsa":
    parts += [f"--cwsa-weight {config['cwsa_weight']}", f"--cwsa-tau {config['cwsa_tau']}",
              f"--cwsa-temperature {config['cwsa_temperature']}"]
    if config.get("cwsa_band"):
      parts.append("--cwsa-band {} {}".format(*config["cwsa_band"]))
    if config.get("cwsa_temperature_start"):
      parts.append(f"--cwsa-temperature-start {config['cwsa_temperature_start']}")
  if config["loss"] in ("focal", "inverse_focal"):
    parts.append(f"--focal-gamma {config['focal_gamma']}")
  if config["loss"] == "soft_aurc":
    parts += [f"--soft-aurc-weight {config['soft_aurc_weight']}",
              f"--soft-aurc-temperature {config['soft_aurc_temperature']}"]
  if config.get("label_smoothing"):
    parts.append(f"--label-smoothing {config['label_smoothing']}")
  if config.get("val_fraction") is not None:
    parts.append(f"--val-fraction {config['val_fraction']}")
  if config.get("threshold_metric") not in (None, "cwsa"):
    parts.append(f"--threshold-metric {config['threshold_metric']}")
  for field in ("threshold_min_coverage", "threshold_max_risk"):
    if config.get(field) is not None:
      parts.append(f"--{field.replace('_', '-')} {config[field]}")
  if config.get("max_steps"):
    parts.append(f"--max-steps {config['max_steps']}")
  return " ".join(parts)


def load_run(run_dir: Path) -> dict:
  metrics = json.loads((run_dir / "metrics.json").read_text())
  config = json.loads((run_dir / "config.json").read_text())
  row = {k: metrics[k] for k in FIELDS}
  row["run"] = run_dir.name
  row["command"] = command_for(config, f"runs/{run_dir.name}")
  row["config"] = {k: config[k] for k in CONFIG_FIELDS}
  row["config"].update({k: config.get(k) for k in NEW_CONFIG_FIELDS})
  # Runs with a validation split: NLL, temperature scaling, the threshold, the scores.
  row["nll"] = metrics.get("nll")
  row["temperature"] = metrics.get("temperature")
  scaled = metrics.get("temperature_scaled") or {}
  row["nll_scaled"], row["ece_scaled"] = scaled.get("nll"), scaled.get("ece")
  row["selected_threshold"] = metrics.get("selected_threshold")
  row["scores"] = metrics.get("scores")
  return row


def _variant(r) -> str:
  """The group name: schedule and loss (and, for runs with a validation split, its fraction)."""
  c = r["config"]
  loss = r["loss"]
  if loss == "cwsa":
    name = (f"cwsa w={c['cwsa_weight']} tau={c['cwsa_tau']} T={c['cwsa_temperature']}"
            + (f" band={tuple(c['cwsa_band'])}" if c.get("cwsa_band") else "")
            + (f" T0={c['cwsa_temperature_start']}" if c.get("cwsa_temperature_start") else ""))
  elif loss in ("focal", "inverse_focal"):
    name = f"{loss} gamma={c['focal_gamma']}"
  elif loss == "soft_aurc":
    name = f"soft_aurc w={c['soft_aurc_weight']} T={c['soft_aurc_temperature']}"
  else:
    name = loss
  if c.get("label_smoothing"):
    name += f" ls={c['label_smoothing']}"
  if c.get("val_fraction") is not None:
    name += f", val {c['val_fraction']}"
  return f"{c['epochs']} ep, {name}"


def _group_key(r):
  return r["dataset"], _variant(r)


def _stat(values: list) -> tuple[float, float] | None:
  """(mean, std) over the runs, or None when a run lacks the value."""
  if not values or any(v is None for v in values):
    return None
  return float(np.mean(values)), float(np.std(values))


def _get(d, *path):
  for key in path:
    if d is None:
      return None
    d = d.get(key)
  return d


def aggregate(runs: list[dict]) -> list[dict]:
  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r), []).append(r)
  out = []
  for (dataset, variant), rs in sorted(groups.items()):
    stat = lambda f: _stat([f(r) for r in rs])
    selected = lambda *path: stat(lambda r: _get(r["selected_threshold"], *path))
    out.append({
        "dataset": dataset, "variant": variant, "seeds": sorted(r["seed"] for r in rs),
        "test_accuracy": stat(lambda r: r["test_accuracy"]), "ece": stat(lambda r: r["ece"]),
        "aurc": stat(lambda r: r["aurc"]), "eaurc": stat(lambda r: r["eaurc"]),
        "augrc": stat(lambda r: r["augrc"]),
        "cwsa_0.5": stat(lambda r: r["cwsa"]["0.5"]), "cwsa_0.9": stat(lambda r: r["cwsa"]["0.9"]),
        "cwsa_plus_0.5": stat(lambda r: r["cwsa_plus"]["0.5"]),
        "cwsa_plus_0.9": stat(lambda r: r["cwsa_plus"]["0.9"]),
        "nll": stat(lambda r: r["nll"]), "nll_scaled": stat(lambda r: r["nll_scaled"]),
        "ece_scaled": stat(lambda r: r["ece_scaled"]),
        "temperature": stat(lambda r: r["temperature"]),
        "threshold": selected("threshold"),
        "validation_coverage": selected("validation", "coverage"),
        "validation_risk": selected("validation", "selective_risk"),
        "test_coverage": selected("test", "coverage"),
        "test_risk": selected("test", "selective_risk"),
        "scores": {score: {metric: stat(lambda r: _get(r["scores"], score, *metric.split(":")))
                           for metric in ("aurc", "augrc", "eaurc", "cwsa:0.5", "cwsa:0.9",
                                          "cwsa_plus:0.5", "cwsa_plus:0.9")}
                   for score in SCORES},
    })
  return out


def _pm(s, digits: int = 4) -> str:
  return "—" if s is None else f"{s[0]:.{digits}f} ± {s[1]:.{digits}f}"


def render_readme(runs: list[dict], groups: list[dict], notes: str, paired: list[str] = ()) -> str:
  pm = _pm
  lines = ["# Training results", "",
           "Written by `python -m cwsa_jax.training.summarize` from the runs' `metrics.json`; every number below "
           "comes from those files. `DATA` is a folder with `mnist/` (IDX files) and `cifar10/` "
           "(the JPEG copy); without `--data-dir` the loader uses tensorflow-datasets.", "",
           "## Mean ± std over seeds", "",
           "| dataset | loss | seeds | test acc. | ECE | AURC | E-AURC | AUGRC | CWSA@0.5 | CWSA@0.9 | CWSA+@0.5 | CWSA+@0.9 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for g in groups:
    lines.append(
        f"| {DATASET_LABEL.get(g['dataset'], g['dataset'])} | {g['variant']} | {len(g['seeds'])} | "
        f"{pm(g['test_accuracy'])} | {pm(g['ece'])} | {pm(g['aurc'], 5)} | {pm(g['eaurc'], 5)} | "
        f"{pm(g['augrc'], 5)} | {pm(g['cwsa_0.5'])} | {pm(g['cwsa_0.9'])} | {pm(g['cwsa_plus_0.5'])} | "
        f"{pm(g['cwsa_plus_0.9'])} |")
  lines += _score_tables(groups) + _threshold_table(groups) + list(paired)
  lines += ["", "## Runs", "",
            "| run | test acc. | ECE | AURC | CWSA@0.5 | CWSA@0.9 | wall s | device | command |",
            "|---|---|---|---|---|---|---|---|---|"]
  for r in runs:
    lines.append(f"| {r['run']} | {r['test_accuracy']:.4f} | {r['ece']:.4f} | {r['aurc']:.5f} | "
                 f"{r['cwsa']['0.5']:.4f} | {r['cwsa']['0.9']:.4f} | {r['wall_seconds']:.0f} | "
                 f"{r['device']} | `{r['command']}` |")
  if notes:
    lines += ["", notes.strip()]
  return "\n".join(lines) + "\n"


def _score_tables(groups: list[dict]) -> list[str]:
  """Per dataset: one row per (loss, confidence score), for the runs with a validation split."""
  with_scores = [g for g in groups if g["temperature"] is not None]
  lines = []
  for dataset in sorted({g["dataset"] for g in with_scores}):
    lines += ["", f"## {DATASET_LABEL.get(dataset, dataset)}: losses and confidence scores", "",
              "Test split. Accuracy, NLL and ECE (of the max softmax probability) before and after "
              "temperature scaling (T fitted on the validation split); AURC, AUGRC, E-AURC and "
              "CWSA/CWSA+ of each confidence score of the unscaled logits. `max_logit` and "
              "`neg_entropy` lie outside [0, 1]: their rank metrics are those of their dense ranks "
              "mapped into [0, 1] (order and ties kept exactly), and CWSA, which depends on the "
              "scale of a confidence, is not defined for them (—).", "",
              "| loss | score | seeds | test acc. | NLL | NLL (T) | ECE | ECE (T) | AURC | AUGRC | "
              "E-AURC | CWSA@0.5 | CWSA@0.9 | CWSA+@0.5 | CWSA+@0.9 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in (g for g in with_scores if g["dataset"] == dataset):
      for score in SCORES:
        s = g["scores"][score]
        lines.append(
            f"| {g['variant']} | {score} | {len(g['seeds'])} | {_pm(g['test_accuracy'])} | "
            f"{_pm(g['nll'])} | {_pm(g['nll_scaled'])} | {_pm(g['ece'])} | {_pm(g['ece_scaled'])} | "
            f"{_pm(s['aurc'], 5)} | {_pm(s['augrc'], 5)} | {_pm(s['eaurc'], 5)} | "
            f"{_pm(s['cwsa:0.5'])} | {_pm(s['cwsa:0.9'])} | {_pm(s['cwsa_plus:0.5'])} | "
            f"{_pm(s['cwsa_plus:0.9'])} |")
  return lines


def _threshold_table(groups: list[dict]) -> list[str]:
  with_split = [g for g in groups if g["temperature"] is not None]
  if not with_split:
    return []
  lines = ["", "## Temperature scaling and the deployment threshold", "",
           "T is fitted on the validation split; the threshold tau is chosen on the "
           "temperature-scaled validation confidences (max softmax probability) and applied "
           "unchanged to the test split. Risk = 1 - selective accuracy. A run whose grid had no "
           "threshold meeting its constraints shows —.", "",
           "| dataset | loss | seeds | T | tau | val. coverage | val. risk | test coverage | "
           "test risk |",
           "|---|---|---|---|---|---|---|---|---|"]
  for g in with_split:
    lines.append(
        f"| {DATASET_LABEL.get(g['dataset'], g['dataset'])} | {g['variant']} | {len(g['seeds'])} | "
        f"{_pm(g['temperature'], 3)} | {_pm(g['threshold'], 3)} | {_pm(g['validation_coverage'])} | "
        f"{_pm(g['validation_risk'], 5)} | {_pm(g['test_coverage'])} | {_pm(g['test_risk'], 5)} |")
  return lines


PAIRED_METRICS = (("accuracy", None), ("ece", None), ("aurc", None), ("augrc", None), ("eaurc", None),
                  ("cwsa", 0), ("cwsa", 1), ("coverage", 1), ("selective_accuracy", 1))


def _paired_cell(d: dict, metric: str, index: int | None) -> str:
  pick = (lambda x: x[metric]) if index is None else (lambda x: x[metric][index])
  digits = 5 if metric in ("aurc", "augrc", "eaurc") else 4
  diff, low, high, p = (pick(d[k]) for k in ("difference", "low", "high", "p_value"))
  return f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] p={p:.3f}"


def paired_table(compares: list[Path]) -> list[str]:
  """The ``cwsa-jax compare A B`` results (A a loss, B cross-entropy, same seed): one row per
  (dataset, loss, metric), one column per seed."""
  # Keyed by the metric's position in PAIRED_METRICS: the table keeps that order.
  rows: dict[tuple[str, str, int], dict[int, str]] = {}
  names: list[str] = []
  for path in compares:
    d = json.loads(path.read_text())
    dataset, variant, seed = parse_run_name(Path(d["a"]).parent.name)
    thresholds = d["settings"]["thresholds"]
    names = [metric if index is None else f"{metric}@{thresholds[index]:g}"
             for metric, index in PAIRED_METRICS]
    for j, (metric, index) in enumerate(PAIRED_METRICS):
      rows.setdefault((dataset, variant, j), {})[seed] = _paired_cell(d, metric, index)
  seeds = sorted({seed for cells in rows.values() for seed in cells})
  lines = ["", "## Paired differences against cross-entropy", "",
           "`cwsa-jax compare runs/DATASET-LOSS-sS/predictions.npz runs/DATASET-ce-sS/predictions.npz` "
           "(same seed, same test set): the loss minus cross-entropy, 95% paired percentile-bootstrap "
           "interval (1000 resamples) and two-sided bootstrap p-value (0.002 is the floor). Outputs in "
           "`compare/`.", "",
           "| dataset | loss | metric | " + " | ".join(f"seed {s}" for s in seeds) + " |",
           "|---|---|---|" + "---|" * len(seeds)]
  for (dataset, variant, j), cells in sorted(rows.items()):
    lines.append(f"| {DATASET_LABEL.get(dataset, dataset)} | {variant} | {names[j]} | "
                 + " | ".join(cells.get(s, "—") for s in seeds) + " |")
  return lines


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="run directories (with metrics.json)")
  parser.add_argument("--out", default="results/training")
  parser.add_argument("--notes", default=None, help="a Markdown file appended to the README")
  parser.add_argument("--compare", nargs="*", default=[], metavar="JSON",
                      help="cwsa-jax compare outputs (a loss against cross-entropy) to tabulate")
  args = parser.parse_args(argv)
  runs = [load_run(Path(p)) for p in args.runs]
  runs.sort(key=lambda r: (r["dataset"], r["loss"], str(r["config"]), r["seed"]))
  groups = aggregate(runs)
  out = Path(args.out)
  write_json_atomic(out / "summary.json", {"runs": runs, "groups": groups})
  notes = Path(args.notes).read_text() if args.notes else ""
  tmp = out / ".README.md.tmp"
  paired = paired_table([Path(p) for p in args.compare]) if args.compare else []
  tmp.write_text(render_readme(runs, groups, notes, paired))
  os.replace(tmp, out / "README.md")
  print(f"wrote {out / 'summary.json'} and {out / 'README.md'} ({len(runs)} runs)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
