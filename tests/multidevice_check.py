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
  checks.update(_per_shard_checks(mesh))
  checks.update(_explicit_checks(explicit))
  print(json.dumps(checks))


def _per_shard_metrics():
  """Public functions called on each shard's samples inside a shard_map: name -> fn(c, k, g, logits, y)."""
  import jax
  import jax.numpy as jnp

  import cwsa_jax as cw
  from cwsa_jax import losses

  t = jnp.linspace(0.0, 0.99, 12)
  leaves = jax.tree.leaves
  return {
      "aurc": lambda c, k, *_: cw.aurc(c, k),
      "aurc_trapezoid": lambda c, k, *_: cw.aurc(c, k, convention="trapezoid"),
      "augrc": lambda c, k, *_: cw.augrc(c, k),
      "eaurc": lambda c, k, *_: cw.eaurc(c, k),
      "eaurc_published_code": lambda c, k, *_: cw.eaurc(c, k, convention="published_code"),
      "summary": lambda c, k, *_: leaves(cw.risk_coverage_summary(c, k)),
      "risk_coverage_curve": lambda c, k, *_: leaves(cw.risk_coverage_curve(c, k)),
      "risk_at_coverage": lambda c, k, *_: cw.risk_at_coverage(c, k, 0.5),
      "ece": lambda c, k, *_: cw.ece(c, k),
      "ece_mass": lambda c, k, *_: cw.ece(c, k, binning="mass"),
      "calibration_bins_mass": lambda c, k, *_: leaves(cw.calibration_bins(c, k, binning="mass")),
      "sweep": lambda c, k, *_: leaves(cw.sweep(c, k, t)),
      "sweep_by_group": lambda c, k, g, *_: leaves(cw.sweep_by_group(c, k, g, t, num_groups=3)),
      "aumcc": lambda c, k, *_: cw.aumcc(c, k, t),
      "soft_cwsa_grad": lambda c, k, *_: jax.grad(lambda x: cw.soft_cwsa(x, k))(c),
      "fit_temperature": lambda c, k, g, logits, y: cw.fit_temperature(logits, y),
      "bootstrap_aurc": lambda c, k, *_: leaves(
          cw.bootstrap_ci(cw.aurc, c, k, key=jax.random.key(0), num_resamples=20)),
      "soft_aurc_loss": lambda c, k, g, logits, y: losses.soft_aurc_loss(logits, y),
      "soft_aurc_loss_grad": lambda c, k, g, logits, y: jax.grad(losses.soft_aurc_loss)(logits, y),
  }


def _sample_arrays():
  """Samples with ties (within and across shards), groups, logits and labels; n divisible by 4."""
  import numpy as np

  rng = np.random.default_rng(1)
  n = 4 * 500
  c = rng.uniform(0, 1, n).astype(np.float32)
  c[::7] = 0.5
  k = rng.uniform(size=n) < c
  g = rng.integers(0, 3, n).astype(np.int32)
  logits = rng.normal(size=(n, 5)).astype(np.float32)
  y = rng.integers(0, 5, n).astype(np.int32)
  return c, k, g, logits, y


def _same(out, ref) -> bool:
  import jax
  import numpy as np

  out, ref = jax.tree.leaves(out), jax.tree.leaves(ref)
  return len(out) == len(ref) and all(
      np.allclose(np.asarray(o), np.asarray(r), rtol=1e-6, atol=1e-7, equal_nan=True)
      for o, r in zip(out, ref))


def _explicit_checks(mesh) -> dict:
  """Each public metric on arrays sharded over an Explicit mesh axis, eager and inside jit.

  Equal to the call on unsharded arrays (XLA partitions the work; results are
  replicated). A failure prints its error to stderr.
  """
  import traceback

  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  args = _sample_arrays()
  sharded = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args]
  checks = {}
  for name, fn in _per_shard_metrics().items():
    try:
      ref = fn(*args)
      if name.endswith("_grad"):  # an eager jax.grad needs the mesh context for its backward pass
        with jax.set_mesh(mesh):
          eager = _same(fn(*sharded), ref)
      else:
        eager = _same(fn(*sharded), ref)
      checks[f"explicit_{name}"] = eager and _same(jax.jit(fn)(*sharded), ref)
    except Exception:  # reported as a failed check
      traceback.print_exc()
      checks[f"explicit_{name}"] = False
  return checks


def _per_shard_checks(mesh) -> dict:
  """Each public metric inside a shard_map on per-shard samples equals the same call on that shard.

  Control flow demands that branches and loop carries vary over the same mesh
  axes as the samples; host callbacks (the CPU sorts) and fresh constants must
  be marked varying again. A failure prints its error to stderr.
  """
  import traceback

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import PartitionSpec as P

  args = _sample_arrays()
  checks = {}
  for name, fn in _per_shard_metrics().items():
    def local(*a, fn=fn):
      return [jnp.asarray(x)[None] for x in jax.tree.leaves(fn(*a))]
    try:
      out = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("data"),) * 5,
                                  out_specs=P("data")))(*args)
      shards = [local(*(a[i * 500:(i + 1) * 500] for a in args)) for i in range(4)]
      checks[f"per_shard_{name}"] = _same(out, [np.concatenate(s) for s in zip(*shards)])
    except Exception:  # reported as a failed check
      traceback.print_exc()
      checks[f"per_shard_{name}"] = False
  return checks


if __name__ == "__main__":
  sys.exit(main())
