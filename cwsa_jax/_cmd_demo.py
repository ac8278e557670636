"""``cwsa-jax demo``: threshold sweep of a synthetic calibrated model (no data to fetch)."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import sweep


def _calibrated(key, n: int, num_classes: int = 3):
  """The paper's calibrated model: right w.p. 0.9 (else a uniform label); conf by outcome."""
  k1, k2, k3, k4, k5 = jax.random.split(key, 5)
  labels = jax.random.randint(k1, (n,), 0, num_classes)
  guess = jax.random.randint(k2, (n,), 0, num_classes)
  pred = jnp.where(jax.random.uniform(k3, (n,)) < 0.9, labels, guess)
  correct = pred == labels
  conf = jnp.where(correct, jax.random.uniform(k4, (n,), minval=0.8, maxval=1.0),
                   jax.random.uniform(k5, (n,), minval=0.5, maxval=0.7))
  return conf, correct


def run(args: argparse.Namespace) -> int:
  conf, correct = _calibrated(jax.random.key(args.seed), args.n)
  thresholds = jnp.round(jnp.arange(50) * 0.01 + 0.5, 2).astype(jnp.float32)
  r = sweep(conf, correct, thresholds)
  print(f"Synthetic calibrated model (n={args.n}, seed={args.seed}): threshold sweep")
  print(f"{'tau':>5} {'coverage':>9} {'sel.acc':>8} {'CWSA':>8} {'CWSA+':>8}")
  for row in np.stack([r.thresholds, r.coverage, r.selective_accuracy, r.cwsa, r.cwsa_plus], 1)[::5]:
    print(f"{row[0]:5.2f} {row[1]:9.4f} {row[2]:8.4f} {row[3]:8.4f} {row[4]:8.4f}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser("demo", help="run the synthetic demo (no data needed)",
                     description="Sweep CWSA, CWSA+, coverage and selective accuracy over "
                     "thresholds for the paper's synthetic calibrated model.")
  p.add_argument("--n", type=int, default=1000, help="samples (default 1000)")
  p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
  p.set_defaults(func=run)
