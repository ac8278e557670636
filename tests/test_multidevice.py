"""Sharded evaluation on 4 CPU devices (a subprocess: the device count is fixed when JAX starts)."""

import json
import os
import subprocess
import sys
import pytest

# Starts a process with several CPU devices: left to CI.
pytestmark = pytest.mark.slow

HERE = os.path.dirname(__file__)


def test_sharded_sweep_and_psum_states_equal_one_pass():
  """Sharded inputs and psum-ed states equal one pass; every public metric works per shard
  inside shard_map and on arrays sharded over an Explicit mesh axis (eager and jitted)."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, os.path.join(HERE, "multidevice_check.py")], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  checks = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(checks) == 8 + 2 * 19
  failed = [name for name, ok in checks.items() if not ok]
  assert not failed, f"failed checks: {failed}\n{proc.stderr[-3000:]}"
