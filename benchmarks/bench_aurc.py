"""Exact AURC at n = 1e6 against NumPy's argsort of the same array, and the sort options.

Exact AURC needs a sort, so NumPy's ``argsort`` of the confidences is the floor
to compare with (goal: ``aurc`` within 2x of it). Also timed: the ways of doing
that sort in XLA (a float ``argsort``, a multi-operand ``lax.sort`` carrying
the error flags with float or int32 keys, and one int32 sort of the packed
``confidence bits << 1 | error`` key that ``cwsa_jax`` uses), and the library
entry points (one sort for all of AURC / AUGRC / E-AURC, graded correctness,
and the "published_code" convention, which needs a stable two-operand sort).

Prints one JSON object and a short table. Timings are the best of
``--repeats`` runs after a warm-up (compilation excluded).

  python benchmarks/bench_aurc.py [--n 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax._risk_coverage import aurc, augrc, eaurc, risk_coverage_summary


def best_time(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # warm-up / compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=1_000_000)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()

  rng = np.random.default_rng(0)
  conf_np = rng.random(args.n).astype(np.float32)
  correct_np = rng.random(args.n) < 0.8
  conf = jnp.asarray(conf_np)
  correct = jnp.asarray(correct_np)
  error = jnp.logical_not(correct).astype(jnp.int32)
  bits = lambda x: lax.bitcast_convert_type(x, jnp.int32)

  sort_options = {
      "numpy_argsort": lambda: np.argsort(conf_np),
      "numpy_sort": lambda: np.sort(conf_np),
      "jnp_argsort_float_then_gather": jax.jit(lambda c, e: e[jnp.argsort(-c)]),
      "lax_sort_float_key_plus_values": jax.jit(
          lambda c, e: lax.sort((-c, e), num_keys=1, is_stable=False)),
      "lax_sort_int32_key_plus_values": jax.jit(
          lambda c, e: lax.sort((-bits(c), e), num_keys=1, is_stable=False)),
      "lax_sort_packed_int32_single_operand": jax.jit(
          lambda c, e: lax.sort(-((bits(c) << 1) | e))),
  }
  timings = {}
  for name, fn in sort_options.items():
    if name.startswith("numpy"):
      timings[name] = best_time(fn, args.repeats)
    else:
      timings[name] = best_time(lambda fn=fn: fn(conf, error), args.repeats)

  user_jit_aurc = jax.jit(aurc)
  graded = correct.astype(jnp.float32) * 0.9
  metric_options = {
      "aurc_step": lambda: aurc(conf, correct),
      "aurc_step_inside_user_jit": lambda: user_jit_aurc(conf, correct),
      "aurc_trapezoid": lambda: aurc(conf, correct, convention="trapezoid"),
      "aurc_augrc_eaurc_separately": lambda: (aurc(conf, correct), augrc(conf, correct),
                                              eaurc(conf, correct)),
      "risk_coverage_summary_one_sort": lambda: risk_coverage_summary(conf, correct),
      "aurc_published_code_stable_two_operand_sort": lambda: aurc(
          conf, correct, convention="published_code"),
      "aurc_graded_sort_plus_binary_search": lambda: aurc(conf, graded),
  }
  for name, fn in metric_options.items():
    timings[name] = best_time(fn, 2 if "two_operand" in name else args.repeats)

  baseline = timings["numpy_argsort"]
  ratios = {name: t / baseline for name, t in timings.items()}
  report = {
      "benchmark": "aurc_vs_numpy_argsort",
      "n": args.n,
      "repeats": args.repeats,
      "device": str(jax.devices()[0]),
      "platform": platform.platform(),
      "processor": platform.processor() or platform.machine(),
      "jax": jax.__version__,
      "numpy": np.__version__,
      "baseline": "numpy_argsort",
      "seconds": timings,
      "ratio_to_numpy_argsort": ratios,
      "goal_aurc_within_2x": ratios["aurc_step"] <= 2.0,
  }
  print(json.dumps(report, indent=2))
  print()
  print(f"{'n = ' + str(args.n):<46} {'seconds':>9} {'x argsort':>10}")
  for name, t in timings.items():
    print(f"{name:<46} {t:9.4f} {ratios[name]:10.2f}")


if __name__ == "__main__":
  main()
