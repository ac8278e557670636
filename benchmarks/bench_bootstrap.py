"""Bootstrap of a whole sweep: speed against a float64 NumPy loop, where the time goes, memory.

Usage: python benchmarks/bench_bootstrap.py [--quick]

Prints a table (stderr) and JSON (stdout). The headline: ``bootstrap_sweep``
(and the generic ``bootstrap_ci`` of a ``sweep``) of a full 50-threshold sweep
(thresholds 0.50..0.99) with 1000 resamples at n = 1e5, against the obvious NumPy loop in the same process (per resample:
``rng.integers`` indices, gather, the float64 ``numpy_loop`` of
bench_sweep.py; ``--numpy-resamples`` of them are timed and the time scaled to
the resample count, as the JSON says). Then where the JAX time goes: one
``sweep`` call on the original data (the metric's own cost), the resampling
alone (indices and gathers, with a trivial metric), the same loop with
``jax.random.randint`` indices, and a few chunk sizes. Last, memory: XLA's
temporary buffers of the compiled call (1000 and 4000 resamples at chunk size
1; chunk sizes 64 and 1000) and the peak RSS increase of one call in fresh
subprocesses: memory grows with ``chunk_size * n``, not with the number of
resamples.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import best_time, emit  # noqa: E402
from bench_sweep import make_data, numpy_loop  # noqa: E402

from cwsa_jax import sweep  # noqa: E402
from cwsa_jax._bootstrap import bootstrap_ci, bootstrap_sweep  # noqa: E402
from cwsa_jax._bootstrap._api import _ci_jit  # noqa: E402

THRESHOLDS = np.linspace(0.5, 0.99, 50).astype(np.float32)


def numpy_bootstrap(c: np.ndarray, ok: np.ndarray, num_resamples: int, seed: int = 0):
  """The float64 NumPy baseline: [B, T, 4] resampled sweeps and the 95% percentile bounds."""
  rng = np.random.default_rng(seed)
  n = c.shape[0]
  values = np.stack([numpy_loop(c[i], ok[i], THRESHOLDS)
                     for i in (rng.integers(0, n, n) for _ in range(num_resamples))])
  return values, np.nanquantile(values, [0.025, 0.975], axis=0)


def randint_bootstrap(fn, c, ok, key, num_resamples: int):
  """The same loop with jax.random.randint indices (one resample at a time)."""
  n = c.shape[0]

  def one(k):
    idx = jax.random.randint(k, (n,), 0, n)
    return fn(c[idx], ok[idx])

  samples = jax.lax.map(one, jax.random.split(key, num_resamples))
  return jax.tree.map(lambda s: jnp.nanquantile(s, jnp.array([0.025, 0.975]), axis=0), samples)


def memory_probe(n: int, num_resamples: int, chunk_size: int) -> dict:
  """Peak RSS increase of one bootstrap_ci of the sweep (compilation included) in a fresh process.

  The peak is read from /proc/self/status (VmHWM), reset just before the call
  through /proc/self/clear_refs, so the imports and the data do not mask it.
  """
  code = (
      "import re, sys, jax, numpy as np\n"
      f"sys.path.insert(0, {__file__.rsplit('/', 1)[0]!r})\n"
      "from bench_sweep import make_data\n"
      "from cwsa_jax import sweep\n"
      "from cwsa_jax._bootstrap import bootstrap_ci\n"
      "mb = lambda k: int(re.search(k + r':\\s+(\\d+)', open('/proc/self/status').read())[1]) / 1024\n"
      f"c, ok = make_data({n})\n"
      "th = jax.device_put(np.linspace(0.5, 0.99, 50).astype(np.float32))\n"
      "c, ok = jax.device_put(c), jax.device_put(ok)\n"
      "fn = lambda a, b: sweep(a, b, th)\n"
      "before = mb('VmRSS')\n"
      "open('/proc/self/clear_refs', 'w').write('5')\n"
      "jax.block_until_ready(bootstrap_ci(fn, c, ok, key=jax.random.key(0), "
      f"num_resamples={num_resamples}, chunk_size={chunk_size}))\n"
      "print(before, mb('VmHWM'))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  before, peak = map(float, out.stdout.split())
  return {"num_resamples": num_resamples, "chunk_size": chunk_size,
          "resampled_values_per_chunk": chunk_size * n, "rss_before_call_mb": before,
          "peak_rss_mb": peak, "call_increase_mb": peak - before}


def xla_temp_mb(fn, c, ok, num_resamples: int, chunk_size: int) -> float:
  """XLA's temporary buffers (MiB) of the compiled bootstrap: its working memory, not run."""
  compiled = _ci_jit.lower(fn, c, ok, jax.random.key(0), jnp.float32(0.95),
                           num_resamples=num_resamples, chunk_size=chunk_size).compile()
  return compiled.memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="n = 1e4, 100 resamples (a smoke run)")
  parser.add_argument("--numpy-resamples", type=int, default=None,
                      help="NumPy resamples timed (scaled to the resample count); default 50")
  args = parser.parse_args()
  n = 10**4 if args.quick else 10**5
  num_resamples = 100 if args.quick else 1000
  numpy_resamples = args.numpy_resamples or (10 if args.quick else 50)
  repeats = 2 if args.quick else 5

  c_np, ok_np = make_data(n)
  c, ok = jax.device_put(c_np), jax.device_put(ok_np)
  th = jax.device_put(THRESHOLDS)
  key = jax.random.key(0)
  fn = lambda a, b: sweep(a, b, th)  # noqa: E731
  trivial = lambda a, b: (jnp.sum(a), jnp.sum(b))  # noqa: E731

  def ci(metric, chunk_size=None):
    return lambda: bootstrap_ci(metric, c, ok, key=key, num_resamples=num_resamples,
                                chunk_size=chunk_size)

  fast = lambda: bootstrap_sweep(c, ok, th, key=key, num_resamples=num_resamples)  # noqa: E731
  t_fast = best_time(fast, repeats=repeats)
  t_jax = best_time(ci(fn), repeats=repeats)
  t_sweep = best_time(jax.jit(fn), c, ok, repeats=50)
  t_resampling = best_time(ci(trivial), repeats=repeats)
  randint = jax.jit(lambda c, ok, key: randint_bootstrap(fn, c, ok, key, num_resamples))
  t_randint = best_time(randint, c, ok, key, repeats=3)
  chunks = {}
  for chunk_size in [1, 4, 16]:
    chunks[chunk_size] = best_time(ci(fn, chunk_size), repeats=2)

  start = time.perf_counter()
  _, numpy_bounds = numpy_bootstrap(c_np, ok_np, numpy_resamples)
  t_numpy_measured = time.perf_counter() - start
  t_numpy = t_numpy_measured * num_resamples / numpy_resamples
  # Sanity: the two bootstraps estimate the same interval (different random resamples).
  r = ci(fn)()
  jax_bounds = np.stack([np.stack(r.low[1:], -1), np.stack(r.high[1:], -1)])
  bound_gap = float(np.nanmax(np.abs(jax_bounds[:, :, 2] - numpy_bounds[:, :, 2])))

  rf = fast()
  fast_vs_generic = max(float(np.nanmax(np.abs(np.asarray(getattr(rf.low, f)) - np.asarray(getattr(r.low, f)))))
                        for f in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"))
  timings = {
      "bootstrap_sweep_s": t_fast,
      "bootstrap_ci_s": t_jax,
      "per_resample_ms": t_jax / num_resamples * 1e3,
      "one_sweep_on_original_data_ms": t_sweep * 1e3,
      "resampling_only_s": t_resampling,
      "randint_indices_variant_s": t_randint,
      "by_chunk_size_s": chunks,
      "numpy_loop_s": t_numpy,
      "numpy_loop_measured_s": t_numpy_measured,
      "numpy_loop_measured_resamples": numpy_resamples,
      "numpy_loop_note": (f"{numpy_resamples} NumPy resamples timed once and scaled by "
                          f"{num_resamples}/{numpy_resamples}"),
  }
  ratios = {
      "speedup_vs_numpy": t_numpy / t_fast,
      "speedup_goal": 50.0,
      "generic_bootstrap_ci_speedup_vs_numpy": t_numpy / t_jax,
      "randint_variant_over_bootstrap_ci": t_randint / t_jax,
      "bootstrap_ci_over_sweeps_alone": t_jax / (t_sweep * num_resamples),
      # The ceiling of speedup_vs_numpy if resampling cost nothing: B sweeps of the original data.
      "numpy_loop_over_sweeps_alone": t_numpy / (t_sweep * num_resamples),
      "resampling_share": t_resampling / t_jax,
  }
  payload = {"n": n, "num_thresholds": len(THRESHOLDS), "num_resamples": num_resamples,
             "level": 0.95, "timings": timings, "ratios": ratios,
             "max_cwsa_bound_gap_vs_numpy": bound_gap,
             "max_low_bound_gap_bootstrap_sweep_vs_bootstrap_ci": fast_vs_generic}
  table = [
      f"n = {n}, T = {len(THRESHOLDS)}, B = {num_resamples}",
      f"bootstrap_sweep                   {t_fast:8.3f} s  ({t_fast / num_resamples * 1e3:.3f} ms/resample)",
      f"bootstrap_ci of sweep (generic)   {t_jax:8.3f} s  ({t_jax / num_resamples * 1e3:.3f} ms/resample)",
      f"one sweep, original data          {t_sweep * 1e3:8.3f} ms",
      f"resampling only (trivial metric)  {t_resampling:8.3f} s",
      f"jax.random.randint indices        {t_randint:8.3f} s",
      "by chunk size                     " + ", ".join(f"{k}: {v:.3f} s" for k, v in chunks.items()),
      f"NumPy loop (scaled from {numpy_resamples})       {t_numpy:8.2f} s",
      f"speed-up vs NumPy                 {t_numpy / t_fast:8.1f} x (goal 50; generic {t_numpy / t_jax:.1f} x)",
      f"NumPy loop / {num_resamples} plain sweeps        {t_numpy / (t_sweep * num_resamples):8.1f} x (the ceiling)",
  ]
  if not args.quick:
    configs = [(1000, 1), (4000, 1), (1000, 64), (1000, 1000)]
    temp = [{"num_resamples": b, "chunk_size": k, "resampled_values_per_chunk": k * n,
             "xla_temp_mb": xla_temp_mb(fn, c, ok, b, k)} for b, k in configs]
    probes = [memory_probe(n, 1000, 1), memory_probe(n, 4000, 1), memory_probe(n, 1000, 64)]
    payload["memory"] = {
        "xla_temp_buffers": temp,
        "xla_note": "compiled, not run; chunk_size 1000 = the whole bootstrap vmapped at once",
        "rss_probes": probes,
        "rss_note": "peak RSS increase of one call in a fresh process, compilation included",
    }
    table += [f"XLA temp B={t['num_resamples']:>5} chunk={t['chunk_size']:>4}: "
              f"{t['xla_temp_mb']:8.1f} MiB" for t in temp]
    table += [f"RSS  B={p['num_resamples']:>5} chunk={p['chunk_size']:>4}: peak "
              f"{p['peak_rss_mb']:.0f} MB (+{p['call_increase_mb']:.0f} MB in the call, "
              "compilation included)" for p in probes]
  emit("bootstrap", payload, table=table)


if __name__ == "__main__":
  main()
