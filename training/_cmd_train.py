"""``cwsa-jax train``: train an MNIST or CIFAR-10 CNN with cross-entropy or the CWSA-regularized loss."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from cwsa_jax._cli_util import UserError
from training.configs import CONFIGS, LOSSES


def run(args: argparse.Namespace) -> int:
  from training import data as data_lib
  from training.configs import get_config
  from training.train import CHECKPOINT_META, train_and_evaluate

  out = Path(args.out)
  if out.exists() and any(out.iterdir()):
    if not args.resume:
      raise UserError(f"output directory {out} is not empty (pass --resume to continue the run in it, "
                      "or choose a new --out)")
    if not (out / CHECKPOINT_META).exists():
      raise UserError(f"--resume: {out} has no checkpoint ({CHECKPOINT_META})")
  config = get_config(args.dataset)
  overrides = {"loss": args.loss, "seed": args.seed}
  for flag, field in (("epochs", "epochs"), ("batch_size", "batch_size"), ("lr", "learning_rate"),
                      ("cwsa_weight", "cwsa_weight"), ("cwsa_tau", "cwsa_tau"),
                      ("cwsa_temperature", "cwsa_temperature"), ("cwsa_correctness", "cwsa_correctness"),
                      ("cwsa_temperature_start", "cwsa_temperature_start")):
    if getattr(args, flag) is not None:
      overrides[field] = getattr(args, flag)
  if args.cwsa_band is not None:
    overrides["cwsa_band"] = tuple(args.cwsa_band)
  config = dataclasses.replace(config, **overrides)
  try:
    config.validate()
  except ValueError as e:
    raise UserError(str(e)) from None
  try:
    dataset = data_lib.load_dataset(args.dataset, data_dir=args.data_dir)
  except (ValueError, OSError) as e:
    raise UserError(str(e)) from None
  print(f"data: {dataset.source} ({len(dataset.train_labels)} train, {len(dataset.test_labels)} test)")
  metrics = train_and_evaluate(config, out, dataset, max_steps=args.max_steps, resume=args.resume,
                               progress=not args.no_progress, _crash_at_step=args.crash_at_step)
  print(f"test accuracy {metrics['test_accuracy']:.4f}  ECE {metrics['ece']:.4f}  "
        f"AURC {metrics['aurc']:.5f}  CWSA@0.5 {metrics['cwsa']['0.5']:.4f}  "
        f"CWSA@0.9 {metrics['cwsa']['0.9']:.4f}  ({metrics['wall_seconds']:.0f} s) -> {out}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser("train", help="train an MNIST / CIFAR-10 CNN and evaluate it",
                     description="Train a Flax CNN with cross-entropy (ce) or the CWSA-regularized loss "
                     "(cwsa), checkpoint every epoch, and evaluate the test split with the hard metrics.")
  p.add_argument("--dataset", required=True, choices=sorted(CONFIGS))
  p.add_argument("--loss", default="ce", choices=LOSSES)
  p.add_argument("--epochs", type=int, default=None, help="epochs (default: the dataset's config)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--data-dir", default=None,
                 help="local dataset files (else $CWSA_JAX_DATA_DIR, else tensorflow-datasets)")
  p.add_argument("--out", required=True, help="output directory (must be new or empty unless --resume)")
  p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (short runs)")
  p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
  p.add_argument("--batch-size", type=int, default=None)
  p.add_argument("--lr", type=float, default=None, help="peak learning rate")
  p.add_argument("--cwsa-weight", type=float, default=None, help="weight of (1 - soft CWSA)")
  p.add_argument("--cwsa-tau", type=float, default=None, help="threshold of the soft CWSA")
  p.add_argument("--cwsa-temperature", type=float, default=None, help="sigmoid gate temperature")
  p.add_argument("--cwsa-temperature-start", type=float, default=None,
                 help="anneal the temperature geometrically from this value to --cwsa-temperature")
  p.add_argument("--cwsa-band", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                 help="target the soft CWSA averaged over thresholds in [LOW, HIGH] instead of one tau")
  p.add_argument("--cwsa-correctness", choices=("probability", "hard"), default=None)
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.add_argument("--crash-at-step", type=int, default=None, help=argparse.SUPPRESS)
  p.set_defaults(func=run)
