"""Per-sample contributions to CWSA and CWSA+.

CWSA is a mean over the retained set, so it decomposes into one term per
sample. With S = {i : c_i >= tau} and phi_i = (c_i - tau)/(1 - tau):

.. math::

  t_i = \\begin{cases} \\phi_i (2\\kappa_i - 1) & i \\in S \\text{ (CWSA)} \\\\
                       \\phi_i \\kappa_i        & i \\in S \\text{ (CWSA+)} \\\\
                       0                        & i \\notin S, \\end{cases}
  \\qquad
  \\mathrm{CWSA}(\\tau) = \\frac{1}{|S|} \\sum_{i \\in S} t_i .

The most negative CWSA terms are the most damaging samples: confident and
wrong.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _threshold_order
from cwsa_jax import _validation

METRICS = ("cwsa", "cwsa_plus")


class Contributions(NamedTuple):
  """Per-sample terms and the retained mask; both [..., n]."""
  terms: jax.Array
  retained: jax.Array


@jax.jit
def _contributions(confidences, correct, tau, plus):
  kappa = correct.astype(jnp.float32)
  retained = confidences >= tau
  phi = (confidences - tau) / (1.0 - tau)
  weight = jnp.where(plus, kappa, 2.0 * kappa - 1.0)
  terms = jnp.where(retained, phi * weight, 0.0)
  return Contributions(terms, retained)


@_threshold_order.at("tau")
@_public.entry
def contributions(confidences, correct, tau, *, metric: str = "cwsa") -> Contributions:
  """Per-sample terms of CWSA (or CWSA+) at threshold ``tau``.

  .. math::

    t_i = [c_i \\ge \\tau] \\, \\frac{c_i - \\tau}{1 - \\tau} (2\\kappa_i - 1)
    \\quad (\\text{CWSA}), \\qquad
    t_i = [c_i \\ge \\tau] \\, \\frac{c_i - \\tau}{1 - \\tau} \\kappa_i
    \\quad (\\text{CWSA+}).

  ``terms.sum(-1) / retained.sum(-1)`` is ``cwsa(confidences, correct, tau)``
  (and 0 when nothing is retained, as ``cwsa`` returns); ``terms.mean(-1)`` is
  ``cwsa(..., normalize="all")``. The terms are computed elementwise in
  float32; their float32 mean agrees with the library's exact-sum metric to
  about 1e-6. Concrete float64 confidences are compared with tau in float64
  (``_threshold_order``), so ``retained`` is the float64 retained set.

  Args:
    confidences: [..., n] confidences in [0, 1].
    correct: [..., n] bool or 0/1, or graded correctness kappa in [0, 1].
    tau: scalar threshold in [0, 1).
    metric: ``"cwsa"`` (default) or ``"cwsa_plus"``.

  Returns:
    :class:`Contributions` with ``terms`` [..., n] float32 (0 for abstained
    samples) and ``retained`` [..., n] bool.

  Raises:
    ValueError: on concrete inputs with NaN, values outside [0, 1], tau
      outside [0, 1), mismatched shapes, no samples or an unknown metric.
      Inside a user's ``jit`` / ``vmap`` invalid values give NaN terms (for
      the invalid row).

  The terms are differentiable almost everywhere in the confidences, graded
  correctness and tau (autodiff through the elementwise formula is exact).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import contributions
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.55]); ok = jnp.array([True, False, True, True])
    >>> r = contributions(c, ok, 0.5)
    >>> print([round(float(t), 2) for t in r.terms], round(float(r.terms.sum() / r.retained.sum()), 4))
    [0.8, -0.2, 0.6, 0.1] 0.325
  """
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
  confidences, correct, tau, rows, tau_flag = _validation.prepare_at_threshold(
      confidences, correct, tau)
  result = _contributions(confidences, correct, tau, metric == "cwsa_plus")
  return result._replace(terms=_validation.poison(result.terms, rows=rows, items=tau_flag))


@_public.entry
def most_damaging(result: Contributions, *, k: int = 10) -> jax.Array:
  """Indices of the (at most) ``k`` retained samples with the most negative terms.

  Sorted from the most damaging; ties keep the lower index first. Only
  retained samples with a negative term are listed (for CWSA+ no term is
  negative, so the list is empty). For 1-D contributions.

  Returns:
    int array [m], m <= k.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import contributions, most_damaging
    >>> r = contributions(jnp.array([0.9, 0.95, 0.8, 0.7]), jnp.array([True, False, False, True]), 0.5)
    >>> print(most_damaging(r, k=5).tolist())
    [1, 2]
  """
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ValueError(f"k must be a non-negative int, got {k!r}")
  terms = jnp.asarray(result.terms)
  if terms.ndim != 1:
    raise ValueError(f"most_damaging expects 1-D terms [n], got shape {terms.shape}")
  if not _validation.is_concrete(terms):
    raise TypeError("most_damaging returns a data-dependent number of indices: call it outside "
                    "jit/vmap/grad, on concrete contributions")
  if bool(jnp.any(jnp.isnan(terms))):
    raise ValueError("terms contain NaN: the contributions were computed from invalid inputs")
  order = jnp.argsort(terms, stable=True)
  order = order[:k]
  keep = (terms[order] < 0) & jnp.asarray(result.retained)[order]
  return order[keep]
