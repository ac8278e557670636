"""``cwsa-jax train``: train an MNIST or CIFAR-10 CNN with one of the training losses, fit the
temperature and choose the deployment threshold on a validation split, evaluate the test split."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
from pathlib import Path

from cwsa_jax.cli import _interrupt, _output
from cwsa_jax.cli._util import UserError, add_progress_flag, progress_enabled
from .configs import CONFIGS, CORRECTNESS, LOSSES, THRESHOLD_METRICS, TrainConfig, get_config


def run(args: argparse.Namespace) -> int:
  # Flax and optax (the [train] extra) load when a run starts: registering the command needs neither.
  from . import data as data_lib
  from .train import (CHECKPOINT_META, check_device_count, data_mesh, request_cpu_devices,
                      reuse_host_memory, train_and_evaluate, validation_split)

  out = _output.check_folder_path(args.out)
  if out.exists() and any(out.iterdir()):
    if not args.resume:
      raise UserError(f"output directory {out} is not empty (pass --resume to continue the run in it, "
                      "or choose a new --out)")
    if not (out / CHECKPOINT_META).exists():
      raise UserError(f"--resume: {out} has no checkpoint ({CHECKPOINT_META})")
  config = config_from_args(args)
  try:
    if args.devices is not None:
      check_device_count(args.devices, config.batch_size)
    dataset = data_lib.load_dataset(args.dataset, data_dir=args.data_dir)
    validation_split(dataset.train_labels, fraction=config.val_fraction, seed=config.seed,
                     num_classes=dataset.num_classes)
  except (ValueError, OSError) as e:
    raise UserError(str(e)) from None
  print(f"data: {dataset.source} ({len(dataset.train_labels)} train, {len(dataset.test_labels)} test)")
  # Before JAX creates its CPU client: XLA's per-step temporaries then reuse freed memory.
  reuse_host_memory()
  # Also before: one CPU device per core, so that the data-parallel step uses every core.
  request_cpu_devices(args.devices, config.batch_size)
  try:
    devices = data_mesh(args.devices, config.batch_size).size
  except ValueError as e:
    raise UserError(str(e)) from None
  before = set(os.listdir(out)) if out.is_dir() else None
  # After a Ctrl-C, by the main thread or by the watchdog if the loop does not stop by itself.
  token = _interrupt.register(lambda: _interrupted(out, before, CHECKPOINT_META))
  try:
    metrics = train_and_evaluate(config, out, dataset, max_steps=args.max_steps,
                                 resume=args.resume, progress=progress_enabled(args),
                                 devices=devices)
  except KeyboardInterrupt:
    _interrupted(out, before, CHECKPOINT_META)
    raise
  finally:
    _interrupt.unregister(token)
  print(f"test accuracy {metrics['test_accuracy']:.4f}  ECE {metrics['ece']:.4f}  "
        f"AURC {metrics['aurc']:.5f}  CWSA@0.5 {metrics['cwsa']['0.5']:.4f}  "
        f"CWSA@0.9 {metrics['cwsa']['0.9']:.4f}  ({metrics['wall_seconds']:.0f} s) -> {out}")
  scaled, selected = metrics["temperature_scaled"], metrics["selected_threshold"]
  line = (f"temperature {metrics['temperature']:.4g} (fitted on {metrics['split']['validation']} "
          f"validation examples): ECE {metrics['ece']:.4f} -> {scaled['ece']:.4f}, "
          f"NLL {metrics['nll']:.4f} -> {scaled['nll']:.4f}")
  if selected["threshold"] is None:
    line += f"; no deployment threshold: {selected['reason']}"
  else:
    risk = selected["test"]["selective_risk"]
    line += (f"; threshold {selected['threshold']:.2f} ({selected['metric']} on validation): test "
             f"coverage {selected['test']['coverage']:.4f}, risk "
             + ("n/a" if risk is None else f"{risk:.4f}"))
  print(line)
  return 0


def config_from_args(args: argparse.Namespace) -> TrainConfig:
  """The dataset's default config with the flags given on the command line, validated."""
  overrides = {"loss": args.loss, "seed": args.seed}
  if args.lr is not None:
    overrides["learning_rate"] = args.lr
  if args.cwsa_band is not None:
    overrides["cwsa_band"] = tuple(args.cwsa_band)
  for field in ("epochs", "batch_size", "cwsa_weight", "cwsa_tau", "cwsa_temperature",
                "cwsa_correctness", "cwsa_temperature_start", "label_smoothing", "focal_gamma",
                "soft_aurc_weight", "soft_aurc_temperature", "val_fraction", "threshold_metric",
                "threshold_min_coverage", "threshold_max_risk"):  # flag --x-y sets field x_y
    if getattr(args, field) is not None:
      overrides[field] = getattr(args, field)
  config = dataclasses.replace(get_config(args.dataset), **overrides)
  try:
    config.validate()
  except ValueError as e:
    raise UserError(str(e)) from None
  return config


def _remove_partial_run(out: Path, before: set[str] | None, checkpoint_meta: str) -> bool:
  """After a Ctrl-C: removes what this run wrote into ``out`` (and ``out`` if it created it)
  unless a checkpoint exists, which is kept so that ``--resume`` can go on. True if removed."""
  if (out / checkpoint_meta).exists():
    return False
  with contextlib.suppress(OSError):
    for path in out.iterdir():
      if before is None or path.name not in before:
        if path.is_dir() and not path.is_symlink():
          shutil.rmtree(path, ignore_errors=True)
        else:
          path.unlink()
    if before is None:
      out.rmdir()
  return True


def _interrupted(out: Path, before: set[str] | None, checkpoint_meta: str) -> None:
  """Ends the progress line; removes the partial run or says how to resume it."""
  _close_progress_bars()
  if not _remove_partial_run(out, before, checkpoint_meta):
    print(f"interrupted: the last checkpoint is in {out}; continue with --resume",
          file=sys.stderr, flush=True)


def _close_progress_bars() -> None:
  """Ends the training loop's progress line, so that the next message starts a line."""
  try:
    from tqdm import tqdm  # noqa: PLC0415
  except ImportError:
    return
  for bar in list(getattr(tqdm, "_instances", ())):
    with contextlib.suppress(Exception):
      bar.close()


def _defaults(field: str) -> str:
  """``mnist X, cifar10 Y`` (or one value when the configs agree): a default for --help."""
  values = {name: getattr(make(), field) for name, make in sorted(CONFIGS.items())}
  if len(set(map(repr, values.values()))) == 1:
    return f"{next(iter(values.values()))}"
  return ", ".join(f"{name} {value}" for name, value in values.items())


def add_parser(sub) -> None:
  p = sub.add_parser("train", help="train an MNIST / CIFAR-10 CNN and evaluate it",
                     description="Train a Flax CNN with one of the losses, checkpoint every epoch, hold "
                     "out a validation split (stratified, seeded by --seed) on which the softmax "
                     "temperature is fitted and the deployment threshold chosen, and evaluate the test "
                     "split with the hard metrics before and after temperature scaling.")
  p.add_argument("--dataset", required=True, choices=sorted(CONFIGS))
  p.add_argument("--loss", default="ce", choices=LOSSES,
                 help="ce = cross-entropy, cwsa = CE + weight (1 - soft CWSA), focal / inverse_focal "
                 "= CE weighted by (1 -/+ p_y)^gamma, soft_aurc = CE + weight soft AURC (default ce)")
  p.add_argument("--epochs", type=int, default=None,
                 help=f"epochs (default {_defaults('epochs')})")
  p.add_argument("--seed", type=int, default=0, help="seed of the model, data order and dropout "
                 "(default 0)")
  p.add_argument("--data-dir", default=None,
                 help="local dataset files (else $CWSA_JAX_DATA_DIR, else tensorflow-datasets)")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="output folder (must be new or empty unless --resume)")
  p.add_argument("--max-steps", type=int, default=None,
                 help="stop after this many steps (short runs; default: all epochs)")
  p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
  p.add_argument("--devices", type=int, default=None, metavar="N",
                 help="train data parallel on N devices, each taking batch-size / N examples of "
                 "every batch (same seed, same data order and initialisation; results equal up to "
                 "float rounding). On a CPU, JAX gets N CPU devices, one per core. Default: all "
                 "devices (on a CPU one per core), at most as many as divide the batch size")
  p.add_argument("--batch-size", type=int, default=None,
                 help=f"batch size (default {_defaults('batch_size')})")
  p.add_argument("--lr", type=float, default=None,
                 help=f"peak learning rate (default {_defaults('learning_rate')})")
  p.add_argument("--cwsa-weight", type=float, default=None,
                 help=f"weight of (1 - soft CWSA) (default {_defaults('cwsa_weight')})")
  p.add_argument("--cwsa-tau", type=float, default=None,
                 help=f"threshold of the soft CWSA (default {_defaults('cwsa_tau')})")
  p.add_argument("--cwsa-temperature", type=float, default=None,
                 help=f"sigmoid gate temperature (default {_defaults('cwsa_temperature')})")
  p.add_argument("--cwsa-temperature-start", type=float, default=None,
                 help="anneal the temperature geometrically from this value to --cwsa-temperature "
                 "(default: no annealing)")
  p.add_argument("--cwsa-band", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                 help="target the soft CWSA averaged over thresholds in [LOW, HIGH] instead of one "
                 "tau (default: one tau)")
  p.add_argument("--cwsa-correctness", choices=CORRECTNESS, default=None,
                 help="correctness in the soft CWSA: the true class's probability or 0/1 "
                 f"(default {_defaults('cwsa_correctness')})")
  p.add_argument("--label-smoothing", type=float, default=None, metavar="ALPHA",
                 help="smooth the targets of the cross-entropy term (ce, cwsa, soft_aurc) with "
                 f"optax.smooth_labels, ALPHA in [0, 1) (default {_defaults('label_smoothing')})")
  p.add_argument("--focal-gamma", type=float, default=None, metavar="GAMMA",
                 help=f"gamma >= 0 of focal and inverse_focal (default {_defaults('focal_gamma')})")
  p.add_argument("--soft-aurc-weight", type=float, default=None,
                 help=f"weight of the soft AURC in soft_aurc (default {_defaults('soft_aurc_weight')})")
  p.add_argument("--soft-aurc-temperature", type=float, default=None,
                 help="temperature > 0 of the soft AURC's pairwise sigmoids "
                 f"(default {_defaults('soft_aurc_temperature')})")
  p.add_argument("--val-fraction", type=float, default=None, metavar="FRACTION",
                 help="share of the training set held out, per class, for temperature scaling and "
                 f"the threshold choice, in (0, 0.5] (default {_defaults('val_fraction')})")
  p.add_argument("--threshold-metric", choices=THRESHOLD_METRICS, default=None,
                 help="what the deployment threshold maximises on the temperature-scaled validation "
                 f"confidences (default {_defaults('threshold_metric')})")
  p.add_argument("--threshold-min-coverage", type=float, default=None, metavar="COVERAGE",
                 help="only thresholds keeping at least this validation coverage (default: none)")
  p.add_argument("--threshold-max-risk", type=float, default=None, metavar="RISK",
                 help="only thresholds with at most this validation selective risk (default: none)")
  add_progress_flag(p)
  p.set_defaults(func=run)
