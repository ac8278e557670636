import os
import sys

import jax
import pytest

# Tests import the float64 references as a plain module.
sys.path.insert(0, os.path.dirname(__file__))

# dev.sh test sets JAX_DISABLE_MOST_OPTIMIZATIONS=1: XLA still runs its HLO passes (fusion,
# algebraic simplification) but LLVM generates code at -O0, without its expensive passes. Most
# tests compile far more than they compute (11.7 against 14.9 minutes for the suite on the
# 2-core machine). The last bits of some float results differ from -O2 (a CNN train step's
# parameters by up to 3e-6 relative), as on another CPU: every check against a float64
# reference keeps its tolerance, and bit-for-bit checks compare two programs at the same
# level. Tests marked ``full_optimization`` run the optimized code users run: those that
# compute a lot and the random-data checks of the main kernels against their references
# (tests/test_train_parallel.py sets it for its subprocess).
_SUITE_DISABLES_OPTIMIZATIONS = bool(jax.config.read("jax_disable_most_optimizations"))


@pytest.fixture(autouse=True)
def _optimization_level(request):
  """Full XLA:CPU optimization for tests marked ``full_optimization`` (see above). The flag is
  read when a program compiles and is not part of JAX's in-memory caches, so a change of
  level clears them (programs compiled at the other level are not reused)."""
  disable = _SUITE_DISABLES_OPTIMIZATIONS and request.node.get_closest_marker(
      "full_optimization") is None
  if bool(jax.config.read("jax_disable_most_optimizations")) != disable:
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", disable)
  yield
