"""Where a ``cwsa-jax train`` step spends its time on this machine: CPU per example and per XLA op.

Usage: python benchmarks/profile_train_step.py [--dataset mnist] [--devices N] [--steps 100]
       [--profile-steps 30] [--top 25] [--unfused] [--out FILE.json] [--hlo FILE.txt]

Builds the training step of ``cwsa-jax train`` (the dataset's default configuration, local data
from ``CWSA_JAX_DATA_DIR``), data parallel over ``--devices`` CPU devices (default: one per core,
as the command), and prints JSON with

- ``steps_per_s`` and the process's user and system CPU seconds per step and per example over
  ``--steps`` steps after compilation (the cores the step keeps busy: ``cpu_per_wall``);
- a profile of ``--profile-steps`` steps (``jax.profiler``, Perfetto trace): each XLA op's time
  per step summed over the devices, the ``top`` ops, and the time the devices spend waiting for
  each other at collectives (``Rendezvous``).

A step that keeps every core busy (``cpu_per_wall`` near the core count) and spends the same CPU
per example on one device and on several is bound by its arithmetic: a faster step needs cheaper
ops (the ``top`` list), not more parallelism.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cwsa_jax.training import data as data_lib
from cwsa_jax.training import train
from cwsa_jax.training.configs import get_config

# Trace events that are not XLA ops (host-side wrappers, whole executions, waits).
_WRAPPERS = ("ThunkExecutor", "PjitFunction", "PjRt", "Execute", "Wait", "Rendezvous", "$")


def op_times(trace: dict, steps: int) -> tuple[dict, float]:
  """Milliseconds per step of each named complete event, and of the collective waits."""
  total = collections.Counter()
  for event in trace["traceEvents"]:
    if event.get("ph") == "X":
      total[event["name"]] += event["dur"] / 1000.0 / steps
  waits = total.get("Rendezvous", 0.0)
  ops = {k: v for k, v in total.items() if not any(w in k for w in _WRAPPERS)}
  return ops, waits


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--dataset", default="mnist", choices=("mnist", "cifar10"))
  p.add_argument("--devices", type=int, default=None)
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--profile-steps", type=int, default=30)
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--unfused", action="store_true",
                 help="each block's last batch norm, ReLU and pooling as three ops instead of "
                 "models.norm_relu_max_pool (to time the fused op against them)")
  p.add_argument("--out")
  p.add_argument("--hlo", help="also write the compiled step's HLO text here (to look up the "
                 "fusions the profile names)")
  args = p.parse_args()
  config = get_config(args.dataset)
  train.reuse_host_memory()
  devices = train.request_cpu_devices(args.devices, config.batch_size)
  import jax  # noqa: PLC0415 (after the CPU device count is set)
  import numpy as np  # noqa: PLC0415
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from _common import emit, load_average, train_step_setup  # noqa: PLC0415

  dataset = data_lib.load_dataset(args.dataset)
  mesh = train.data_mesh(devices, config.batch_size)
  setup = train_step_setup(config, dataset, mesh, fused_norm_relu_pool=not args.unfused)
  step, state, images, labels = setup.step, setup.state, setup.images, setup.labels
  order = jax.device_put(data_lib.epoch_permutation(setup.n, seed=0, epoch=0).astype(np.int32),
                         setup.on_mesh)
  steps_per_epoch = setup.steps_per_epoch

  def run(first: int, count: int):
    nonlocal state
    loss = None
    for b in range(first, first + count):
      state, loss = step(state, images, labels, order, np.int32(b % steps_per_epoch))
    jax.block_until_ready(loss)

  run(0, 5)  # compilation
  if args.hlo:
    compiled = step.lower(state, images, labels, order, np.int32(0)).compile()
    Path(args.hlo).write_text(compiled.as_text())
  load = load_average()
  wall, cpu = time.perf_counter(), os.times()
  run(5, args.steps)
  wall, after = time.perf_counter() - wall, os.times()
  user, system = after.user - cpu.user, after.system - cpu.system
  with tempfile.TemporaryDirectory() as folder:
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    run(5 + args.steps, args.profile_steps)
    jax.profiler.stop_trace()
    (path,) = Path(folder).rglob("*.trace.json.gz")
    ops, waits = op_times(json.load(gzip.open(path)), args.profile_steps)
  top = sorted(ops.items(), key=lambda kv: -kv[1])[:args.top]
  payload = {
      "dataset": args.dataset, "fused_norm_relu_pool": not args.unfused,
      "devices": mesh.size, "batch_size": config.batch_size, "steps": args.steps,
      "load_average_before": load,
      "steps_per_s": round(args.steps / wall, 3),
      "cpu_per_wall": round((user + system) / wall, 3),
      "user_ms_per_step": round(1e3 * user / args.steps, 3),
      "system_ms_per_step": round(1e3 * system / args.steps, 3),
      "cpu_ms_per_example": round(1e3 * (user + system) / args.steps / config.batch_size, 4),
      "profile_steps": args.profile_steps,
      "op_ms_per_step_all_devices": round(sum(ops.values()), 3),
      "collective_wait_ms_per_step_all_devices": round(waits, 3),
      "top_ops_ms_per_step_all_devices": {k: round(v, 3) for k, v in top},
      "load_average_after": load_average(),
  }
  emit("profile_train_step", payload, out=args.out)


if __name__ == "__main__":
  main()
