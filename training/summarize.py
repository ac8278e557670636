"""Collects finished training runs into ``results/training/summary.json`` and ``README.md``.

Usage: python -m cwsa_jax.training.summarize RUN_DIR [RUN_DIR ...] [--out results/training]

Each RUN_DIR holds the ``metrics.json`` and ``config.json`` written by
``cwsa-jax train``; the README table gets one row per run with the command
that reproduces it, then the mean +- std over seeds per (dataset, loss).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from cwsa_jax.cli._util import write_json_atomic

FIELDS = ("dataset", "loss", "seed", "epochs", "test_accuracy", "ece", "aurc", "eaurc", "augrc",
          "cwsa", "cwsa_plus", "wall_seconds", "data_source", "device")
DATASET_LABEL = {"mnist": "MNIST", "cifar10": "CIFAR-10 (JPEG copy)"}


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
  if config.get("max_steps"):
    parts.append(f"--max-steps {config['max_steps']}")
  return " ".join(parts)


def load_run(run_dir: Path) -> dict:
  metrics = json.loads((run_dir / "metrics.json").read_text())
  config = json.loads((run_dir / "config.json").read_text())
  row = {k: metrics[k] for k in FIELDS}
  row["run"] = run_dir.name
  row["command"] = command_for(config, f"runs/{run_dir.name}")
  row["config"] = {k: config[k] for k in ("epochs", "batch_size", "optimizer", "learning_rate",
                                          "weight_decay", "augment", "cwsa_weight", "cwsa_tau",
                                          "cwsa_temperature", "cwsa_band", "cwsa_correctness")}
  row["config"]["cwsa_temperature_start"] = config.get("cwsa_temperature_start")
  return row


def _group_key(r):
  c = r["config"]
  variant = f"{c['epochs']} ep, " + ("ce" if r["loss"] == "ce" else (
      f"cwsa w={c['cwsa_weight']} tau={c['cwsa_tau']} T={c['cwsa_temperature']}"
      + (f" band={tuple(c['cwsa_band'])}" if c.get("cwsa_band") else "")
      + (f" T0={c['cwsa_temperature_start']}" if c.get("cwsa_temperature_start") else "")))
  return r["dataset"], variant


def aggregate(runs: list[dict]) -> list[dict]:
  groups: dict = {}
  for r in runs:
    groups.setdefault(_group_key(r), []).append(r)
  out = []
  for (dataset, variant), rs in sorted(groups.items()):
    stat = lambda f: (float(np.mean([f(r) for r in rs])), float(np.std([f(r) for r in rs])))
    out.append({
        "dataset": dataset, "variant": variant, "seeds": sorted(r["seed"] for r in rs),
        "test_accuracy": stat(lambda r: r["test_accuracy"]), "ece": stat(lambda r: r["ece"]),
        "aurc": stat(lambda r: r["aurc"]), "eaurc": stat(lambda r: r["eaurc"]),
        "augrc": stat(lambda r: r["augrc"]),
        "cwsa_0.5": stat(lambda r: r["cwsa"]["0.5"]), "cwsa_0.9": stat(lambda r: r["cwsa"]["0.9"]),
        "cwsa_plus_0.5": stat(lambda r: r["cwsa_plus"]["0.5"]),
        "cwsa_plus_0.9": stat(lambda r: r["cwsa_plus"]["0.9"]),
    })
  return out


def render_readme(runs: list[dict], groups: list[dict], notes: str) -> str:
  pm = lambda s, d=4: f"{s[0]:.{d}f} ± {s[1]:.{d}f}"
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="run directories (with metrics.json)")
  parser.add_argument("--out", default="results/training")
  parser.add_argument("--notes", default=None, help="a Markdown file appended to the README")
  args = parser.parse_args(argv)
  runs = [load_run(Path(p)) for p in args.runs]
  runs.sort(key=lambda r: (r["dataset"], r["loss"], str(r["config"]), r["seed"]))
  groups = aggregate(runs)
  out = Path(args.out)
  write_json_atomic(out / "summary.json", {"runs": runs, "groups": groups})
  notes = Path(args.notes).read_text() if args.notes else ""
  tmp = out / ".README.md.tmp"
  tmp.write_text(render_readme(runs, groups, notes))
  os.replace(tmp, out / "README.md")
  print(f"wrote {out / 'summary.json'} and {out / 'README.md'} ({len(runs)} runs)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
