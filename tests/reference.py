"""Slow, obviously-correct float64 NumPy references for the hard CWSA family.

Written straight from the paper's Algorithm 1, one threshold at a time, with
no shared code with the library.
"""

from __future__ import annotations

import numpy as np


def hard_metrics(confidences, correct, tau, normalize="retained"):
  """(coverage, selective_accuracy, cwsa, cwsa_plus) at one threshold, in float64."""
  c = np.asarray(confidences, dtype=np.float64).reshape(-1)
  kappa = np.asarray(correct, dtype=np.float64).reshape(-1)
  tau = float(np.float64(tau))
  n = c.size
  retained = [i for i in range(n) if c[i] >= tau] if n < 2000 else np.flatnonzero(c >= tau)
  retained = np.asarray(retained, dtype=np.int64)
  if retained.size == 0:
    return 0.0, float("nan"), 0.0, 0.0
  phi = (c[retained] - tau) / (1.0 - tau)
  k = kappa[retained]
  denominator = retained.size if normalize == "retained" else n
  return (
      retained.size / n,
      float(np.mean(k)),
      float(np.sum(phi * (2.0 * k - 1.0)) / denominator),
      float(np.sum(phi * k) / retained.size),
  )


def sweep(confidences, correct, thresholds, normalize="retained"):
  """[T, 4] array of hard_metrics at each threshold."""
  return np.array([hard_metrics(confidences, correct, t, normalize) for t in np.asarray(thresholds)])
