"""Multi-device checks, run by tests/test_multidevice.py in a subprocess with 4 CPU devices.

The device count is fixed when JAX starts (XLA_FLAGS=--xla_force_host_platform_device_count=4),
so this must be its own process. Prints one JSON object of named boolean checks.
"""

import json
import sys


def main() -> None:
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from cwsa_jax import ece, sweep
  from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState

  checks = {"devices": len(jax.devices()) == 4}
  # Auto axes: XLA partitions the computation (GSPMD), the classic mode.
  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  shard = NamedSharding(mesh, P("data"))
  rng = np.random.default_rng(0)
  n = 4001  # not divisible by 4: padded with a mask
  c = rng.uniform(0, 1, n).astype(np.float32)
  c[:40] = np.repeat(np.array([0.0, 1.0, 0.5, 0.9], np.float32), 10)
  k = rng.uniform(size=n) < c
  t = np.linspace(0.0, 0.99, 12).astype(np.float32)
  pad = (-n) % 4
  cp, kp = np.concatenate([c, np.zeros(pad, np.float32)]), np.concatenate([k, np.zeros(pad, bool)])
  mask = np.arange(n + pad) < n
  cs, ks, ms = (jax.device_put(x, shard) for x in (cp, kp, mask))
  checks["inputs_sharded"] = len(cs.sharding.device_set) == 4

  one = sweep(c, k, t)
  # sweep on sharded inputs (n divisible by 4): XLA partitions it; the exact sums make it identical.
  cs4, ks4 = (jax.device_put(x[:4000], shard) for x in (c, k))
  sharded = sweep(cs4, ks4, t)
  ref4 = sweep(c[:4000], k[:4000], t)
  checks["sweep_sharded_equals_unsharded"] = all(
      np.array_equal(np.asarray(getattr(sharded, f)), np.asarray(getattr(ref4, f)), equal_nan=True)
      for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"))

  def local(c, k, m):
    return (SweepState.from_batch(c, k, t, mask=m).psum("data"),
            CalibrationState.from_batch(c, k, mask=m).psum("data"),
            RiskCoverageState.from_batch(c, k, mantissa_bits=6, mask=m).psum("data"))

  fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("data"),) * 3, out_specs=P()))
  sweep_state, cal_state, rc_state = fn(cs, ks, ms)
  result = sweep_state.compute()
  checks["sweep_state_psum_equals_one_pass"] = all(
      np.array_equal(np.asarray(getattr(result, f)), np.asarray(getattr(one, f)), equal_nan=True)
      for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"))
  single = SweepState.from_batch(c, k, t)
  checks["sweep_state_psum_sums_identical"] = bool(
      np.array_equal(sweep_state.hi, single.hi) and np.array_equal(sweep_state.lo, single.lo))
  checks["calibration_state_psum_equals_one_pass"] = bool(
      abs(float(cal_state.compute()) - float(ece(c, k))) <= 2e-6
      and np.array_equal(cal_state.hi, CalibrationState.from_batch(c, k).hi))
  rc_one = RiskCoverageState.from_batch(c, k, mantissa_bits=6)
  checks["risk_coverage_state_psum_equals_one_pass"] = bool(
      all(np.array_equal(getattr(rc_state, f), getattr(rc_one, f))
          for f in ("hi", "lo", "key_min", "key_max")))
  # The states also work on a mesh with Explicit axes (jax.make_mesh's default).
  explicit = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  es = [jax.device_put(x, NamedSharding(explicit, P("data"))) for x in (cp, kp, mask)]
  efn = jax.jit(jax.shard_map(lambda c, k, m: SweepState.from_batch(c, k, t, mask=m).psum("data"),
                              mesh=explicit, in_specs=(P("data"),) * 3, out_specs=P()))
  checks["sweep_state_psum_explicit_mesh"] = bool(np.array_equal(efn(*es).hi, single.hi))
  print(json.dumps(checks))


if __name__ == "__main__":
  sys.exit(main())
