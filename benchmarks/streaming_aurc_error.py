"""Error of the streaming (binned) AURC / AUGRC against the exact step-convention values.

Usage: python benchmarks/streaming_aurc_error.py [--predictions FILE.npz ...]

For mantissa_bits in {4, 6, 8, 10, 12} (2^m bins per octave of c or 1 - c), the
binned estimate of ``cwsa_jax.streaming.RiskCoverageState`` against the exact
``cwsa_jax.aurc`` / ``augrc``: absolute error of the estimate and width of the
guaranteed interval [low, high]. Data: synthetic confidences at n = 1e6
(continuous, so bins hold many distinct values: the hardest case), and any
predictions .npz (``probs`` [n, K], ``labels`` [n], e.g. written by
``cwsa-jax train``). Prints JSON.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import emit  # noqa: E402

from cwsa_jax import augrc, aurc, confidences_from_probs  # noqa: E402
from cwsa_jax.streaming import RiskCoverageState  # noqa: E402

BITS = (4, 6, 8, 10, 12)


def synthetic(n: int, seed: int = 0):
  """A confident classifier: 1 - c log-uniform in [1e-6, 0.5], correct ~ Bernoulli(c)."""
  rng = np.random.default_rng(seed)
  c = (1.0 - np.exp(rng.uniform(np.log(1e-6), np.log(0.5), n))).astype(np.float32)
  return c, rng.uniform(size=n) < c


def measure(name: str, c, k) -> dict:
  exact_aurc, exact_augrc = float(aurc(c, k)), float(augrc(c, k))
  rows = []
  for bits in BITS:
    r = RiskCoverageState.from_batch(c, k, mantissa_bits=bits).compute()
    rows.append({
        "mantissa_bits": bits,
        "aurc_abs_error": abs(float(r.aurc) - exact_aurc),
        "aurc_bound_width": float(r.aurc_high - r.aurc_low),
        "aurc_within_bounds": bool(float(r.aurc_low) - 1e-6 <= exact_aurc <= float(r.aurc_high) + 1e-6),
        "augrc_abs_error": abs(float(r.augrc) - exact_augrc),
        "augrc_bound_width": float(r.augrc_high - r.augrc_low),
        "exact": bool(r.exact),
    })
  return {"data": name, "n": int(len(c)), "aurc": exact_aurc, "augrc": exact_augrc, "rows": rows}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--predictions", nargs="*", default=[])
  parser.add_argument("--n", type=int, default=1_000_000)
  args = parser.parse_args()
  results = [measure(f"synthetic n={args.n}", *synthetic(args.n))]
  for path in args.predictions:
    d = np.load(path)
    p = confidences_from_probs(d["probs"], d["labels"])
    results.append(measure(path, np.asarray(p.confidences), np.asarray(p.correct)))
  table = [f"{res['data'][-40:]:40s} m={row['mantissa_bits']:2d} err={row['aurc_abs_error']:.2e} "
           f"width={row['aurc_bound_width']:.2e} exact={row['exact']}"
           for res in results for row in res["rows"]]
  emit("streaming_aurc_error", {"results": results}, table=table)

if __name__ == "__main__":
  main()
