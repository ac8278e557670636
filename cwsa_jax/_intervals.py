"""Bootstrap intervals for the CLI: one traceable function of every reported metric.

``evaluate`` reports percentile-bootstrap intervals of each metric
(:func:`cwsa_jax.bootstrap_ci`), ``compare`` the paired differences between
two models on the same test set (:func:`cwsa_jax.paired_bootstrap`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax._bootstrap import bootstrap_ci, paired_bootstrap
from cwsa_jax._calibration import ece
from cwsa_jax._report import Settings
from cwsa_jax._risk_coverage import risk_coverage_summary
from cwsa_jax._sweep import sweep

SCALARS = ("accuracy", "ece", "aurc", "eaurc", "augrc")
SWEEP_FIELDS = ("coverage", "selective_accuracy", "cwsa", "cwsa_plus")


@functools.lru_cache(maxsize=8)  # one function per settings: jit caches stay warm
def metric_fn(settings: Settings) -> Callable[[jax.Array, jax.Array], dict[str, jax.Array]]:
  """``(confidences [n], correct [n]) -> {metric: value}`` for every metric with an interval."""
  thresholds = jnp.asarray(np.asarray(settings.thresholds, np.float32))

  def fn(c, ok):
    result = sweep(c, ok, thresholds, normalize=settings.normalize)
    summary = risk_coverage_summary(c, ok, convention=settings.aurc_convention)
    out = {
        # An exact integer count: identical correctness gives an identical accuracy.
        "accuracy": jnp.sum(ok, dtype=jnp.int32).astype(jnp.float32) / ok.shape[-1],
        "ece": ece(c, ok, num_bins=settings.num_bins, norm=settings.ece_norm,
                   binning=settings.binning),
        "aurc": summary.aurc, "eaurc": summary.eaurc, "augrc": summary.augrc,
    }
    out.update({f: getattr(result, f) for f in SWEEP_FIELDS})
    return out

  return fn


def _as_lists(tree: dict) -> dict:
  return {k: np.asarray(v).tolist() for k, v in tree.items()}


def evaluation_intervals(confidences: Any, correct: Any, settings: Settings, *,
                         num_resamples: int, level: float, seed: int) -> dict[str, Any]:
  """JSON-ready percentile intervals: {"level", "num_resamples", "seed", "low", "high"}."""
  c = jnp.asarray(confidences, jnp.float32)
  ok = jnp.asarray(correct, jnp.bool_)
  r = bootstrap_ci(metric_fn(settings), c, ok, key=jax.random.key(seed),
                   num_resamples=num_resamples, level=level)
  return {"method": "percentile bootstrap", "level": level, "num_resamples": num_resamples,
          "seed": seed, "low": _as_lists(r.low), "high": _as_lists(r.high)}


def comparison(a: tuple[Any, Any], b: tuple[Any, Any], settings: Settings, *,
               num_resamples: int, level: float, seed: int) -> dict[str, Any]:
  """Paired bootstrap of every metric: A, B, A - B, its interval and p-value (JSON-ready)."""
  args = [jnp.asarray(x, dt) for pair in (a, b) for x, dt in zip(pair, (jnp.float32, jnp.bool_))]
  r = paired_bootstrap(metric_fn(settings), *args, key=jax.random.key(seed),
                       num_resamples=num_resamples, level=level)
  return {"method": "paired percentile bootstrap", "level": level,
          "num_resamples": num_resamples, "seed": seed,
          **{name: _as_lists(getattr(r, name))
             for name in ("estimate_a", "estimate_b", "difference", "low", "high", "p_value")}}


def interval_rows(metrics: dict, intervals: dict, settings: Settings) -> list[list[str]]:
  """(metric, value, low, high) rows of the scalar metrics and the sweep at each threshold
  of ``settings`` that is also in the grid (all of them when the grid is short)."""
  rows = [[name, f"{float(metrics[name]):.5f}", f"{intervals['low'][name]:.5f}",
           f"{intervals['high'][name]:.5f}"] for name in SCALARS]
  for j in _shown(settings.thresholds):
    tau = settings.thresholds[j]
    for f in ("cwsa", "cwsa_plus", "coverage"):
      value = float(np.asarray(metrics["sweep"][f])[j])
      rows.append([f"{f}@{tau:g}", f"{value:.5f}", f"{intervals['low'][f][j]:.5f}",
                   f"{intervals['high'][f][j]:.5f}"])
  return rows


def comparison_rows(comp: dict, thresholds: tuple[float, ...]) -> list[list[str]]:
  """(metric, A, B, A - B, low, high, p) rows."""
  def row(label, get):
    vals = [get(comp[k]) for k in ("estimate_a", "estimate_b", "difference", "low", "high")]
    return [label] + [f"{v:+.5f}" if i >= 2 else f"{v:.5f}" for i, v in enumerate(vals)] + [
        f"{get(comp['p_value']):.4f}"]
  rows = [row(name, lambda d, name=name: d[name]) for name in SCALARS]
  for j in _shown(thresholds):
    for f in ("cwsa", "cwsa_plus", "selective_accuracy", "coverage"):
      rows.append(row(f"{f}@{thresholds[j]:g}", lambda d, f=f, j=j: d[f][j]))
  return rows


def _shown(thresholds: tuple[float, ...]) -> list[int]:
  """Indices of the thresholds shown in tables: 0.5 and 0.9 when present, else all (<= 5)."""
  picked = [j for j, t in enumerate(thresholds) if abs(t - 0.5) < 1e-6 or abs(t - 0.9) < 1e-6]
  if picked:
    return picked
  return list(range(len(thresholds)))[:5]
