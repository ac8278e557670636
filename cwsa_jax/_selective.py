"""Hard selective metrics at one threshold: CWSA, CWSA+, coverage, selective accuracy.

Definitions (the paper's Algorithm 1). For confidences c_i in [0, 1],
correctness kappa_i (bool, or graded in [0, 1]) and a threshold tau in [0, 1):

.. math::

  S_\\tau = \\{ i : c_i \\ge \\tau \\}, \\qquad
  \\phi_i = \\frac{c_i - \\tau}{1 - \\tau},

  \\mathrm{CWSA}(\\tau) = \\frac{1}{|S_\\tau|} \\sum_{i \\in S_\\tau} \\phi_i (2\\kappa_i - 1),
  \\qquad
  \\mathrm{CWSA}^+(\\tau) = \\frac{1}{|S_\\tau|} \\sum_{i \\in S_\\tau} \\phi_i \\kappa_i .

Samples exactly at tau are retained with weight phi = 0. When S is empty,
CWSA = CWSA+ = 0 (the paper's convention) and selective accuracy is NaN.
Concrete float64 confidences are compared with tau in float64 (``_threshold_order``);
phi and the sums are float32 as for any input.

Invalid values (NaN, inf or out-of-range confidences, correctness other than
0/1 or outside [0, 1], tau outside [0, 1)) raise ``ValueError`` on concrete
inputs and give NaN inside a user's ``jit`` / ``vmap`` (see ``_validation``).

Gradients. The retained set is locally constant in c and tau, and phi is
linear in c, so CWSA and CWSA+ are differentiable almost everywhere, with

.. math::

  \\frac{\\partial\\,\\mathrm{CWSA}}{\\partial c_i} =
    \\frac{2\\kappa_i - 1}{(1 - \\tau)\\,|S|}, \\qquad
  \\frac{\\partial\\,\\mathrm{CWSA}^+}{\\partial c_i} = \\frac{\\kappa_i}{(1 - \\tau)\\,|S|}
  \\quad (i \\in S; \\text{ else } 0), \\qquad
  \\frac{\\partial \\phi_i}{\\partial \\tau} = \\frac{c_i - 1}{(1 - \\tau)^2}

(``normalize="all"``: n instead of |S|), and linear in graded kappa. These
derivatives are exact (``_stats.exact_sums``: a custom JVP beside the exact
integer sums). Coverage and selective accuracy are piecewise constant in c:
their zero gradient in c is exact almost everywhere (use ``soft_cwsa`` for a
relaxed, informative one); selective accuracy is linear in graded kappa.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _threshold_order
from cwsa_jax import _validation


def _retained_exact(confidences, correct, tau, *, kernels: _dispatch.Kernels):
  """Exact :class:`~cwsa_jax._stats.Sums` [1] of the retained set {c >= tau}.

  The sweep's pipeline with the single threshold tau: bucket 1 is the retained set.
  """
  hi, lo = _sweep.bucket_sums(confidences, correct, tau[None], kernels=kernels)
  return _stats.sums_from_columns(_exact.to_float(hi[1:], lo[1:]), correct.dtype != jnp.bool_)


def _retained_segments(confidences, correct, tau):
  del correct
  return (confidences >= tau).astype(jnp.int32), (2,), 1


@functools.partial(jax.jit, static_argnames=("normalize", "kernels"))
def _metrics_1d(confidences, correct, tau, normalize="retained", kernels=_dispatch.DEFAULT):
  n = confidences.shape[0]
  # Exact sums; their derivative in c (and kappa) is the float sum over S (see _stats).
  sums = _stats.exact_sums(_retained_exact_with(kernels), _retained_segments, confidences,
                           correct, tau)
  metrics = _stats.metrics_from_sums(sums, tau, n)
  return _stats.renormalize(_stats.Metrics(*(m[0] for m in metrics)), normalize)


@functools.lru_cache(maxsize=None)
def _retained_exact_with(kernels: _dispatch.Kernels):
  """:func:`_retained_exact` with these kernels: one function per configuration (a static
  argument of ``exact_sums``)."""
  return functools.partial(_retained_exact, kernels=kernels)


def _metrics(confidences, correct, tau, normalize: str = "retained", *,
             kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> _stats.Metrics:
  """The metrics at one threshold with these ``kernels`` (the internal entry point)."""
  _stats.check_normalize(normalize)
  if not _validation.is_concrete(confidences, correct):
    return _metrics_traced(confidences, correct, tau, normalize=normalize, kernels=kernels)
  return _checked_metrics(confidences, correct, tau, normalize=normalize, kernels=kernels)


def _checked_metrics(confidences, correct, tau, *, normalize: str,
                     kernels: _dispatch.Kernels) -> _stats.Metrics:
  confidences, correct, tau, rows, tau_flag = _validation.prepare_at_threshold(
      confidences, correct, tau, hint="; use sweep() for many thresholds", kernels=kernels)
  fn = functools.partial(_metrics_1d, normalize=normalize, kernels=kernels)
  for _ in range(confidences.ndim - 1):
    fn = jax.vmap(fn, in_axes=(0, 0, None))
  return _validation.poison(fn(confidences, correct, tau), rows=rows, items=tau_flag)


# Traced samples: the value checks become flags, compiled with the kernel (see sweep).
_metrics_traced = jax.jit(_checked_metrics, static_argnames=("normalize", "kernels"))


@_threshold_order.at("tau")
@_public.entry
def cwsa(confidences, correct, tau, *, normalize: str = "retained") -> jax.Array:
  """Confidence-weighted selective accuracy at threshold ``tau``.

  .. math::

    \\mathrm{CWSA}(\\tau) = \\frac{1}{|S_\\tau|} \\sum_{i \\in S_\\tau}
    \\frac{c_i - \\tau}{1 - \\tau} (2\\kappa_i - 1), \\qquad
    S_\\tau = \\{i : c_i \\ge \\tau\\},

  and 0 when S is empty. Range [-1, 1]: confident correct predictions earn up
  to +1, confident mistakes cost up to -1.

  Args:
    confidences: [..., n] confidences in [0, 1] (e.g. max softmax probability).
    correct: [..., n] bool or 0/1, or graded correctness kappa in [0, 1].
    tau: scalar threshold in [0, 1).
    normalize: ``"retained"`` (default) divides by ``|S|`` as the paper defines;
      ``"all"`` divides by n, reproducing the paper's published code (its
      reported CWSA equals coverage x CWSA).

  Returns:
    Scalar array (or [...] for batched inputs).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import cwsa
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.55]); ok = jnp.array([True, False, True, True])
    >>> print(round(float(cwsa(c, ok, 0.5)), 4), round(float(cwsa(c, ok, 0.5, normalize="all")), 4))
    0.325 0.325
  """
  return _metrics(confidences, correct, tau, normalize).cwsa


@_threshold_order.at("tau")
@_public.entry
def cwsa_plus(confidences, correct, tau) -> jax.Array:
  """CWSA+: the reward-only, [0, 1]-valued variant of CWSA at threshold ``tau``.

  .. math::

    \\mathrm{CWSA}^+(\\tau) = \\frac{1}{|S_\\tau|} \\sum_{i \\in S_\\tau}
    \\frac{c_i - \\tau}{1 - \\tau} \\kappa_i ,

  and 0 when S is empty. Arguments as in :func:`cwsa`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import cwsa_plus
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.55]); ok = jnp.array([True, False, True, True])
    >>> print(round(float(cwsa_plus(c, ok, 0.5)), 4))
    0.375
  """
  return _metrics(confidences, correct, tau).cwsa_plus


@_threshold_order.at("tau")
@_public.entry
def coverage(confidences, tau) -> jax.Array:
  """Fraction of samples retained at ``tau``: ``|{i : c_i >= tau}| / n``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import coverage
    >>> print(float(coverage(jnp.array([0.9, 0.6, 0.8, 0.55]), 0.6)))
    0.75
  """
  confidences = _validation.as_float_array(confidences, "confidences")
  return _metrics(confidences, jnp.ones(confidences.shape, jnp.bool_), tau).coverage


@_threshold_order.at("tau")
@_public.entry
def selective_accuracy(confidences, correct, tau) -> jax.Array:
  """Accuracy over the retained set: mean of kappa_i over {i : c_i >= tau}; NaN if empty.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import selective_accuracy
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.55]); ok = jnp.array([True, False, True, True])
    >>> print(float(selective_accuracy(c, ok, 0.6)), float(selective_accuracy(c, ok, 0.95)))
    0.6666666865348816 nan
  """
  return _metrics(confidences, correct, tau).selective_accuracy
