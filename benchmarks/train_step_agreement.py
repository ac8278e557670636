"""How far two implementations of the same ``cwsa-jax train`` steps drift apart, next to how far
one and two devices do.

Usage: python benchmarks/train_step_agreement.py [--dataset mnist] [--steps 200] [--out FILE.json]

Float32 training amplifies any change in the order of float operations: two runs that differ only
in rounding leave the same path after a few hundred steps. This script takes the dataset's default
configuration (local data from ``CWSA_JAX_DATA_DIR``) and runs the same first ``--steps`` steps
(the same initialisation, batches and dropout keys) three ways:

- ``unfused_1``: one device, each block's batch norm, ReLU and pooling as three ops;
- ``unfused_2``: the same, data parallel on two CPU devices (the sums in another order);
- ``fused_2``: two devices, the blocks' fused op (``training/models.py``, ``norm_relu_max_pool``).

It prints JSON with, at steps 1, 2, 5, 10, ... the relative L2 distance between the parameters
of ``fused_2`` and ``unfused_2`` (the fused op's own effect) and between ``unfused_1`` and
``unfused_2`` (the order of float sums alone, which the kit already accepts as "the same run"),
and the losses of the three runs. Similar distances mean the fused op changes no more than
rounding does.
"""

from __future__ import annotations

import argparse
import os
import sys

from cwsa_jax.training import data as data_lib
from cwsa_jax.training import train
from cwsa_jax.training.configs import get_config

_CHECKPOINTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--dataset", default="mnist", choices=("mnist", "cifar10"))
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--out")
  args = p.parse_args()
  config = get_config(args.dataset)
  train.request_cpu_devices(2, config.batch_size)
  import jax  # noqa: PLC0415 (after the CPU device count is set)
  import numpy as np  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from _common import emit, train_step_setup  # noqa: PLC0415

  dataset = data_lib.load_dataset(args.dataset)
  checkpoints = [s for s in _CHECKPOINTS if s <= args.steps]

  def run(devices: int, fused: bool):
    setup = train_step_setup(config, dataset, train.data_mesh(devices, config.batch_size),
                             fused_norm_relu_pool=fused)
    state = setup.state
    losses, params = [], {}
    for b in range(args.steps):
      epoch, i = divmod(b, setup.steps_per_epoch)
      if i == 0:
        order = jax.device_put(data_lib.epoch_permutation(
            setup.n, seed=config.seed, epoch=epoch).astype(np.int32), setup.on_mesh)
      state, loss = setup.step(state, setup.images, setup.labels, order, np.int32(i))
      losses.append(float(loss))
      if b + 1 in checkpoints:
        model_state = nnx.state(nnx.merge(setup.graphdef, state)[0], nnx.Param)
        params[b + 1] = np.concatenate([np.ravel(np.asarray(v, np.float64))
                                        for v in jax.tree.leaves(model_state)])
    return losses, params

  runs = {"unfused_1": run(1, False), "unfused_2": run(2, False), "fused_2": run(2, True)}

  def distance(a: str, b: str, s: int) -> float:
    x, y = runs[a][1][s], runs[b][1][s]
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))

  payload = {
      "dataset": args.dataset, "batch_size": config.batch_size, "steps": args.steps,
      "relative_parameter_distance": {
          str(s): {"fused_2_vs_unfused_2": distance("fused_2", "unfused_2", s),
                   "unfused_1_vs_unfused_2": distance("unfused_1", "unfused_2", s)}
          for s in checkpoints},
      "loss": {str(s): {name: runs[name][0][s - 1] for name in runs} for s in checkpoints},
  }
  emit("train_step_agreement", payload, out=args.out)


if __name__ == "__main__":
  main()
