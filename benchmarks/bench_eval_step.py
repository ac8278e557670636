"""Cost of the kit's NNX metrics inside an ``nnx.jit`` eval step (issue 45, item 7).

Usage: python benchmarks/bench_eval_step.py [--quick] [--out results/benchmarks/eval_step.json]

An MLP of MNIST-sized inputs (784 -> hidden -> 10, ``--hidden`` 128 by default: a
short step, where the metrics' share is large) is evaluated by one ``nnx.jit``
step, forward pass, cross-entropy and ``metrics.update(logits=, labels=,
loss=)``, with

* ``base``: ``nnx.MultiMetric(accuracy=Accuracy(), loss=Average("loss"))``,
* ``kit``: the same plus :class:`cwsa_jax.nnx.SweepMetric` (10 thresholds),
  :class:`~cwsa_jax.nnx.CalibrationMetric` (15 bins) and
  :class:`~cwsa_jax.nnx.RiskCoverageMetric` (default 8 mantissa bits),
* ``sweep``, ``ece``, ``aurc`` (not with ``--quick``): ``base`` plus that one
  kit metric, to attribute the cost,

each at batch sizes 128 and 1000, with the metrics' state donated
(``nnx.jit(..., donate_argnums=1)``) or not. The variants run interleaved in one
process, the order rotating every round; a round times ``--steps`` calls of a
variant. Reported per variant: the minimum and median seconds per step (wall
clock, and the process's CPU time, all threads: on a shared machine the less
noisy of the two) and the paired ratio to ``base`` of the same batch size and
donation (the median over rounds of the per-round ratio, and the ratio of the
minima). In fresh subprocesses (no trace or compile caches): the first step
(tracing and compilation) and the first ``compute()`` of ``base`` and ``kit``.

Prints a table (stderr) and JSON (stdout). The machine may be shared: the
load average is recorded and every figure comes with min and median.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import emit, load_average, summarize  # noqa: E402

from cwsa_jax import nnx as kit  # noqa: E402

THRESHOLDS = np.linspace(0.5, 0.95, 10)
KIT = {
    "sweep": lambda: kit.SweepMetric(THRESHOLDS),
    "ece": lambda: kit.CalibrationMetric(15),
    "aurc": lambda: kit.RiskCoverageMetric(),
}


class MLP(nnx.Module):
  def __init__(self, hidden: int, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(784, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, 10, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.hidden(x)))


def make_metrics(variant: str) -> nnx.MultiMetric:
  extra = {"kit": KIT, "base": {}}.get(variant, {variant: KIT.get(variant)})
  return nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"),
                         **{name: make() for name, make in extra.items()})


def make_step(donate: bool):
  def eval_step(model, metrics, images, labels):
    logits = model(images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    metrics.update(logits=logits, labels=labels, loss=loss)

  return nnx.jit(eval_step, donate_argnums=1 if donate else ())


def make_data(batch: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  images = jnp.asarray(rng.normal(size=(batch, 784)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 10, batch), jnp.int32)
  return images, labels


def runner(variant: str, batch: int, donate: bool, hidden: int, steps: int):
  """A function of no arguments that runs ``steps`` eval steps of the variant (compiled first)."""
  model = MLP(hidden, nnx.Rngs(0))
  metrics = make_metrics(variant)
  step = make_step(donate)
  images, labels = make_data(batch)
  step(model, metrics, images, labels)
  jax.block_until_ready(nnx.state(metrics))

  def run():
    for _ in range(steps):
      step(model, metrics, images, labels)
    return nnx.state(metrics)

  return run


def interleaved(fns: dict, rounds: int, steps: int) -> dict:
  """Per function, ``(wall, cpu)`` seconds per call of each round (``steps`` calls), the
  functions interleaved and their order rotating every round (as ``_common.interleaved_times``)."""
  names = list(fns)
  out = {name: ([], []) for name in names}
  for r in range(rounds):
    for j in range(len(names)):
      name = names[(r + j) % len(names)]
      wall, cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(fns[name]())
      out[name][0].append((time.perf_counter() - wall) / steps)
      out[name][1].append((time.process_time() - cpu) / steps)
  return out


def first_calls(variant: str, batch: int, donate: bool, hidden: int) -> dict:
  """Seconds of the first and second step and of the first and second ``compute()`` (this
  process: run it fresh, :func:`fresh_first_calls`)."""
  model = MLP(hidden, nnx.Rngs(0))
  metrics = make_metrics(variant)
  step = make_step(donate)
  images, labels = make_data(batch)
  out = {}
  for name in ("first_step_s", "second_step_s"):
    t = time.perf_counter()
    step(model, metrics, images, labels)
    jax.block_until_ready(nnx.state(metrics))
    out[name] = time.perf_counter() - t
  for name in ("first_compute_s", "second_compute_s"):
    t = time.perf_counter()
    jax.block_until_ready(metrics.compute())
    out[name] = time.perf_counter() - t
  return out


def fresh_first_calls(variant: str, batch: int, donate: bool, hidden: int) -> dict:
  cmd = [sys.executable, __file__, "--first-calls", variant, str(batch), str(int(donate)),
         str(hidden)]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  if len(sys.argv) > 1 and sys.argv[1] == "--first-calls":
    variant, batch, donate, hidden = sys.argv[2:6]
    print(json.dumps(first_calls(variant, int(batch), bool(int(donate)), int(hidden))))
    return
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds, no "
                      "per-metric variants, one fresh first-call process per variant")
  parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 1000])
  parser.add_argument("--hidden", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 30)")
  parser.add_argument("--steps", type=int, default=20, help="eval steps timed per round")
  parser.add_argument("--out", default=None, help="also write the JSON here")
  args = parser.parse_args()
  rounds = args.rounds or (3 if args.quick else 30)
  steps = 2 if args.quick else args.steps
  variants = ["base", "kit"] + ([] if args.quick else list(KIT))
  load_before = load_average()

  fns = {}
  for batch in args.batch_sizes:
    for donate in (False, True):
      for variant in variants:
        fns[(variant, batch, donate)] = runner(variant, batch, donate, args.hidden, steps)
  keys = list(fns)
  times = interleaved(fns, rounds, steps)

  results = []
  for key in keys:
    variant, batch, donate = key
    wall, cpu = (np.array(x) for x in times[key])
    base_wall, base_cpu = (np.array(x) for x in times[("base", batch, donate)])
    results.append({"variant": variant, "batch": batch, "donate": donate,
                    **summarize(list(wall)),
                    "ratio_to_base_paired_median": float(np.median(wall / base_wall)),
                    "ratio_to_base_of_min": float(wall.min() / base_wall.min()),
                    "cpu": {**summarize(list(cpu)),
                            "ratio_to_base_paired_median": float(np.median(cpu / base_cpu)),
                            "ratio_to_base_of_min": float(cpu.min() / base_cpu.min())}})

  first = []
  for batch in ([max(args.batch_sizes)] if args.quick else args.batch_sizes):
    for donate in ((True,) if args.quick else (False, True)):
      for variant in ("base", "kit"):
        first.append({"variant": variant, "batch": batch, "donate": donate,
                      **fresh_first_calls(variant, batch, donate, args.hidden)})

  table = [f"eval step, MLP 784-{args.hidden}-10, {rounds} rounds x {steps} steps, "
           f"load {load_before}",
           f"{'variant':8s} {'batch':>5s} {'donate':>6s} {'min ms':>8s} {'median ms':>9s} "
           f"{'ratio (paired)':>14s} {'ratio (min)':>11s} {'cpu ratio (paired)':>18s}"]
  for r in results:
    table.append(f"{r['variant']:8s} {r['batch']:5d} {str(r['donate']):>6s} "
                 f"{1e3 * r['min_s']:8.3f} {1e3 * r['median_s']:9.3f} "
                 f"{r['ratio_to_base_paired_median']:14.3f} {r['ratio_to_base_of_min']:11.3f} "
                 f"{r['cpu']['ratio_to_base_paired_median']:18.3f}")
  table.append(f"{'variant':8s} {'batch':>5s} {'donate':>6s} {'1st step s':>10s} "
               f"{'2nd step s':>10s} {'1st compute s':>13s} {'2nd compute s':>13s}")
  for r in first:
    table.append(f"{r['variant']:8s} {r['batch']:5d} {str(r['donate']):>6s} "
                 f"{r['first_step_s']:10.3f} {r['second_step_s']:10.4f} "
                 f"{r['first_compute_s']:13.3f} {r['second_compute_s']:13.4f}")
  emit("eval_step", {
      "model": f"MLP 784-{args.hidden}-10", "thresholds": len(THRESHOLDS), "ece_bins": 15,
      "rc_mantissa_bits": 8, "rounds": rounds, "steps_per_round": steps, "quick": args.quick,
      "flax": getattr(__import__("flax"), "__version__", None), "optax": optax.__version__,
      "load_average_before": load_before, "load_average_after": load_average(),
      "steps": results, "first_calls": first}, table=table, out=args.out)


if __name__ == "__main__":
  main()
