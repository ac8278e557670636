r"""Classwise ECE: the binned calibration error of every class probability, averaged over classes.

Top-label ECE (:func:`~cwsa_jax.ece`) looks only at the predicted class.
Classwise ECE scores each column ``p_{:, k}`` of the probabilities against
the indicator ``1[y = k]`` with the same bins and norms, then averages the
K errors with equal weight (rare classes count as much as frequent ones).

Each class is one batch row of :func:`~cwsa_jax.ece`'s own computation, so a
class's error equals ``ece(probs[:, k], labels == k, ...)`` bit for bit
(exact integer per-bin sums), and the gradient in ``probs`` is ECE's.

Float64 probabilities (concrete) are binned in float64 as :func:`~cwsa_jax.ece`
bins float64 confidences: each class column is replaced by its float32
stand-ins (``_threshold_order``; ``_calibration._float64_bins``), which fall in
the column's float64 bins, before the kit's entry rounds it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _calibration
from cwsa_jax import _confidence
from cwsa_jax import _public
from cwsa_jax import _threshold_order
from cwsa_jax import _validation


def _float64_columns(p64: np.ndarray, arguments: dict) -> np.ndarray | None:
  """float32 stand-ins of float64 ``probs`` [..., n, K] that fall in each class column's
  float64 bins (equal-mass edges per column, as ECE's batch rows), or None to leave them."""
  if p64.ndim < 2:
    return None
  rows = np.moveaxis(p64, -1, -2)  # [..., K, n]: one ECE row per class
  new = _calibration._float64_bins(rows, arguments)
  return None if new is None else np.moveaxis(new, -2, -1)


@_threshold_order.kept(_float64_columns, argument="probs")
@_public.entry
def classwise_ece(probs: Any, labels: Any, *, num_bins: int = 15, norm: str = "l1",
                  binning: str = "width") -> jax.Array:
  r"""Classwise calibration error: the mean over classes of each class probability's ECE.

  .. math::

    \mathrm{cwECE} = \frac{1}{K} \sum_{k=0}^{K-1}
      \mathrm{ECE}\bigl(\{p_{ik}\}_i,\ \{1[y_i = k]\}_i\bigr),\qquad
    \mathrm{ECE} = \sum_b \frac{n_b}{n}\,|\mathrm{conf}_b - \mathrm{acc}_b|

  with the bins, norms and conventions of :func:`~cwsa_jax.ece` (per class
  ``k``, ``conf_b`` is the mean of ``p_{ik}`` and ``acc_b`` the frequency
  of ``y = k`` in bin ``b``; ``"l2"`` and ``"max"`` replace the inner ECE
  by the RMS calibration error and the MCE). Rows of ``probs`` need not sum
  to 1.

  Args:
    probs: [..., n, K] class probabilities in [0, 1]; leading axes are batch
      axes.
    labels: [..., n] integer class labels in [0, K).
    num_bins: number of bins ``B >= 1`` (static). Default 15.
    norm: ``"l1"`` (ECE, default), ``"l2"`` (RMS) or ``"max"`` (MCE).
    binning: ``"width"`` (default) or ``"mass"`` (equal count per class).

  Returns:
    float32 of shape [...] (a scalar for [n, K] inputs), in [0, 1].
    Concrete float64 probabilities are binned by their float64 values (edges
    ``j / B``, or each column's float64 order statistics), as in ``ece``.

  Raises:
    ValueError: on concrete inputs with probabilities NaN/inf or outside
      [0, 1], labels that are not integers or lie outside [0, K), mismatched
      shapes or no samples or classes. Inside a user's ``jit`` / ``vmap``
      such values give NaN.

  Examples:
    >>> from cwsa_jax import classwise_ece
    >>> p = [[0.75, 0.25], [0.25, 0.75], [0.75, 0.25], [0.25, 0.75]]
    >>> print(round(float(classwise_ece(p, [0, 1, 1, 1], num_bins=2)), 4))
    0.25

  References:
    Meelis Kull, Miquel Perello-Nieto, Markus Kängsepp, Telmo Silva Filho,
    Hao Song and Peter Flach, "Beyond temperature scaling: Obtaining
    well-calibrated multiclass probabilities with Dirichlet calibration",
    NeurIPS 2019; Ananya Kumar, Percy Liang and Tengyu Ma, "Verified
    uncertainty calibration", NeurIPS 2019.
  """
  p, y, label_flag = _confidence.check_scores(probs, labels, "probs")
  # Checked here so that an error names probs; ECE checks them again (cheaply) as confidences.
  prob_flag = _validation.check_finite_in_unit_interval(p, "probs", reduce_axes=2)
  if label_flag is not None:
    label_flag = jnp.any(label_flag, axis=-1)
  # One ECE batch row per class: [K, ..., n].
  num_classes = p.shape[-1]
  confidences = jnp.moveaxis(p, -1, 0)
  classes = jnp.arange(num_classes, dtype=y.dtype).reshape((num_classes,) + (1,) * y.ndim)
  errors = _calibration._ece(confidences, y == classes, num_bins=num_bins, norm=norm,
                             binning=binning)
  return _validation.poison(jnp.mean(errors, axis=0),
                            rows=_validation.either(prob_flag, label_flag))
