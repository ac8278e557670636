"""Overhead of the CWSA regulariser in one Flax train step of the MNIST CNN.

Times one jitted NNX train step (forward, backward, Adam update) of
``cwsa_jax.training.models.MnistCNN`` on the same batch with

* ``ce``:   mean softmax cross-entropy (optax),
* ``cwsa``: ``cwsa_jax.losses.cwsa_regularized_loss`` (defaults: weight 1,
  tau 0.5, temperature 0.05, true-class-probability correctness),
* ``cwsa_band``: the same with ``band=(0.5, 0.9)`` (9 thresholds),

in one process. The variants are interleaved round by round (the order
rotates each round) so that load from other processes hits them alike; the
reported overhead is the median over rounds of the per-round ratio
(paired), next to the ratio of the medians. The loss head alone (value and
gradient with respect to the [batch, 10] logits) is timed too, which shows
the regulariser's absolute cost without the network's noise.

  .venv/bin/python benchmarks/bench_loss_step.py [--batch-size 128] [--rounds 15]

Prints JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cwsa_jax.losses import cwsa_regularized_loss
from cwsa_jax.training.models import MnistCNN

LOSSES = {
    "ce": lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(
        logits, labels).mean(),
    "cwsa": lambda logits, labels: cwsa_regularized_loss(logits, labels),
    "cwsa_band": lambda logits, labels: cwsa_regularized_loss(logits, labels, band=(0.5, 0.9)),
}


def make_train_step(loss):
  def loss_fn(model, images, labels):
    logits = model(images)
    return loss(logits, labels), logits

  @nnx.jit
  def train_step(model, optimizer, images, labels):
    (value, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, images, labels)
    optimizer.update(model, grads)
    return value

  return train_step


def time_calls(fn, args, calls):
  start = time.perf_counter()
  for _ in range(calls):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps-per-round", type=int, default=5)
  parser.add_argument("--head-calls", type=int, default=200)
  args = parser.parse_args()

  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.normal(size=(args.batch_size, 28, 28, 1)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 10, args.batch_size), jnp.int32)
  base = MnistCNN(rngs=nnx.Rngs(0))
  base.train()

  runs = {}
  for name, loss in LOSSES.items():
    model = nnx.clone(base)
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    step = make_train_step(loss)
    step(model, optimizer, images, labels).block_until_ready()  # compile
    head = jax.jit(jax.value_and_grad(loss))
    logits = jnp.asarray(rng.normal(size=(args.batch_size, 10)) * 3, jnp.float32)
    jax.block_until_ready(head(logits, labels))
    runs[name] = dict(step=step, args=(model, optimizer, images, labels), head=head,
                      head_args=(logits, labels), step_times=[], head_times=[])

  names = list(LOSSES)
  for round_index in range(args.rounds):
    order = names[round_index % len(names):] + names[:round_index % len(names)]
    for name in order:
      run = runs[name]
      run["step_times"].append(time_calls(run["step"], run["args"], args.steps_per_round))
      run["head_times"].append(time_calls(run["head"], run["head_args"], args.head_calls))

  ce_steps = np.array(runs["ce"]["step_times"])
  ce_heads = np.array(runs["ce"]["head_times"])
  results = {}
  for name in names:
    steps = np.array(runs[name]["step_times"])
    heads = np.array(runs[name]["head_times"])
    results[name] = dict(
        step_ms_median=1e3 * float(np.median(steps)),
        step_ms_min=1e3 * float(np.min(steps)),
        step_ms_all=[round(1e3 * t, 3) for t in steps],
        paired_step_ratio_median=float(np.median(steps / ce_steps)),
        paired_step_ratio_quartiles=[float(q) for q in np.quantile(steps / ce_steps, [0.25, 0.75])],
        ratio_of_median_steps=float(np.median(steps) / np.median(ce_steps)),
        ratio_of_min_steps=float(np.min(steps) / np.min(ce_steps)),
        head_us_median=1e6 * float(np.median(heads)),
        head_extra_us_vs_ce=1e6 * float(np.median(heads) - np.median(ce_heads)),
        head_extra_fraction_of_ce_step=float((np.median(heads) - np.median(ce_heads))
                                             / np.median(ce_steps)),
    )
  load = os.getloadavg() if hasattr(os, "getloadavg") else None
  report = dict(
      benchmark="bench_loss_step", model="MnistCNN", batch_size=args.batch_size,
      rounds=args.rounds, steps_per_round=args.steps_per_round, device=str(jax.devices()[0]),
      platform=platform.platform(), cpu_count=os.cpu_count(), load_average_at_end=load,
      jax=jax.__version__, numpy=np.__version__, optax=optax.__version__,
      baseline="ce", results=results)
  print(json.dumps(report, indent=1))
  print(f"\nMnistCNN train step, batch {args.batch_size}, {args.rounds} interleaved rounds "
        f"({report['device']}, load {load[0]:.1f})" if load else "")
  print(f"{'loss':10s} {'step ms (median)':>17s} {'step ms (min)':>14s} {'paired ratio':>13s} "
        f"{'IQR':>15s} {'head us':>8s} {'head extra / step':>18s}")
  for name, r in results.items():
    q = r["paired_step_ratio_quartiles"]
    print(f"{name:10s} {r['step_ms_median']:17.2f} {r['step_ms_min']:14.2f} "
          f"{r['paired_step_ratio_median']:13.4f} {f'{q[0]:.3f}-{q[1]:.3f}':>15s} "
          f"{r['head_us_median']:8.1f} {100 * r['head_extra_fraction_of_ce_step']:17.3f}%")


if __name__ == "__main__":
  main()
