"""Data-parallel training: the same steps on one device and on two CPU devices.

The device count is fixed when JAX starts, so the checks run in a subprocess, this file run as a
script with 2 CPU devices (``jax_num_cpu_devices``); it prints one JSON object of named checks.
A tiny CIFAR-10 CNN (batch norm, dropout, crop/flip augmentation, the CWSA loss with an annealed
temperature) takes the same steps on one device and data parallel on two: the same batches, keys
and initialisation, so the losses, parameters, batch-norm statistics and metrics agree up to the
order of float sums; eval-mode logits too, with a last batch the device count does not divide.
"""

import dataclasses
import json
import os
import subprocess
import sys
import pytest

# Starts training runs on several CPU devices: left to CI.
pytestmark = pytest.mark.slow


def test_two_cpu_devices_take_the_steps_of_one():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  checks = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(checks) == 11
  failed = [name for name, ok in checks.items() if not ok]
  assert not failed, f"failed checks: {failed}"


def main() -> None:
  import jax
  jax.config.update("jax_num_cpu_devices", 2)
  import numpy as np
  from flax import nnx

  from cwsa_jax.training import data, train
  from cwsa_jax.training.configs import get_config

  config = dataclasses.replace(get_config("cifar10"), widths=(4, 8, 8), convs_per_block=(1, 1, 1),
                               batch_size=8, epochs=2, loss="cwsa", cwsa_temperature_start=0.5,
                               eval_batch_size=8)
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, (24, 32, 32, 3)).astype(np.uint8)
  labels = rng.integers(0, 10, 24).astype(np.int32)
  steps_per_epoch, total = 3, 6

  def run(devices, use_mesh=True):
    mesh = train.data_mesh(devices, config.batch_size)
    model = train.create_model(config, 10)
    objects = (model, train.create_optimizer(config, model, steps_per_epoch), train.make_train_metrics())
    graphdef, _ = nnx.split(objects)
    step = train.make_train_step(config, graphdef, total, mesh if use_mesh else None)
    on_mesh = train.replicated(mesh)
    x, y = jax.device_put(images, on_mesh), jax.device_put(labels, on_mesh)
    losses = []
    for epoch in range(2):
      state = jax.device_put(nnx.state(objects), on_mesh)
      order = jax.device_put(data.epoch_permutation(24, seed=config.seed, epoch=epoch).astype(np.int32),
                             on_mesh)
      if epoch == 0:
        hlo = step.lower(state, x, y, order, np.int32(0)).compile().as_text()
      for b in range(steps_per_epoch):
        state, loss = step(state, x, y, order, np.int32(b))
        losses.append(float(loss))
      nnx.update(objects, state)
    sharded = len(model.head.kernel[...].sharding.device_set)
    logits = train.predict_logits(model, images[:13], config, mesh)
    return {"mesh": mesh.size, "all_reduce": "all-reduce" in hlo, "losses": np.array(losses), "sharded": sharded, "logits": logits,
            "model": [np.asarray(v) for v in jax.tree.leaves(nnx.state(model))
                      if not jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)],
            "metrics": {k: float(v) for k, v in objects[2].compute().items()}}

  one, two, plain = run(1), run(2), run(1, use_mesh=False)

  def close(a, b):
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))

  checks = {
      "devices": len(jax.devices()) == 2 and (one["mesh"], two["mesh"]) == (1, 2),
      "default_is_all_devices": train.data_mesh(None, 8).size == 2 and train.data_mesh(None, 7).size == 1,
      "state_on_both_devices": two["sharded"] == 2,
      # The batch is split: the partitioned step sums gradients and statistics across devices.
      "step_is_partitioned": two["all_reduce"] and not one["all_reduce"],
      # A one-device mesh takes exactly the steps of the step without one.
      "one_device_mesh_unchanged": list(one["losses"]) == list(plain["losses"]) and all(
          np.array_equal(a, b) for a, b in zip(one["model"], plain["model"])),
      "losses_close": close(one["losses"], two["losses"]),
      "model_close": len(one["model"]) == len(two["model"]) and all(
          close(a, b) for a, b in zip(one["model"], two["model"])),
      "metrics_close": all(close(one["metrics"][k], two["metrics"][k]) for k in one["metrics"]),
      "logits_close": one["logits"].shape == two["logits"].shape == (13, 10)
                      and close(one["logits"], two["logits"]),
      "odd_batch_rejected": _raises(lambda: train.data_mesh(2, 7)),
      "too_many_rejected": _raises(lambda: train.data_mesh(4, 8)),
  }
  print(json.dumps(checks))


def _raises(fn) -> bool:
  try:
    fn()
  except ValueError:
    return True
  return False


if __name__ == "__main__":
  sys.exit(main())
