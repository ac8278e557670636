"""The metrics :func:`~cwsa_jax.bootstrap_ci` buckets once: a sweep at fixed thresholds and the
equal-width ECE, each resample gathering one or two words per draw into the metric's exact
sums (``_FastForm``)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from cwsa_jax import _calibration
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import _percentiles
from cwsa_jax._bootstrap._intervals import _subtract
from cwsa_jax._bootstrap._sampler import _RESAMPLING
from cwsa_jax._bootstrap._sampler import _map_block
from cwsa_jax._bootstrap._sampler import _map_resamples

# --- the sweep's fast path ----------------------------------------------------

def _pack(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """One int32 per sample: the bit pattern of c >= 0, boolean correctness in the sign bit."""
  bits = lax.bitcast_convert_type(confidences.astype(jnp.float32), jnp.int32) & 0x7FFFFFFF
  return bits | (correct.astype(jnp.int32) << 31)


def _unpack(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(confidences, correct) of :func:`_pack`."""
  return lax.bitcast_convert_type(packed & 0x7FFFFFFF, jnp.float32), packed < 0


def _sweep_per_sample(confidences, correct, thresholds):
  """What each resample gathers, found once, and the invalid-input flag. Binary samples
  with at most ``_sweep.PACKED_MAX_BUCKETS`` buckets: one word each, their segment and
  1 - c (:func:`~cwsa_jax._sweep.pack_samples`); more buckets: the bucket and (c, correct)
  packed in one int32; graded: the bucket, c and kappa."""
  invalid = _stats.invalid_inputs(confidences, correct)
  sorted_t = _sweep.sorted_thresholds(thresholds)[1]
  buckets = _sweep.bucket_ids(confidences, sorted_t)
  if correct.dtype != jnp.bool_:
    return (buckets, confidences, correct), invalid
  if sorted_t.shape[0] + 1 <= _sweep.PACKED_MAX_BUCKETS:
    return (_sweep.pack_samples(confidences, correct, buckets),), invalid
  return (buckets, _pack(confidences, correct)), invalid


def _sweep_metrics(thresholds, invalid, normalize: str) -> Callable:
  """The sweep of one (resampled) ``per_sample`` tuple: the sweep's own bucket-and-sum
  pipeline from the known buckets, without the value checks (done once for all data)."""
  order, sorted_t = _sweep.sorted_thresholds(thresholds)

  def metrics(*arrays):
    if len(arrays) == 1:
      hi, lo = _sweep.packed_bucket_sums(arrays[0], sorted_t.shape[0] + 1)
    else:
      buckets, *arrays = arrays
      c, k = _unpack(arrays[0]) if len(arrays) == 1 else arrays
      hi, lo = _sweep.bucket_sums(c, k, sorted_t, buckets=buckets)
    result = _sweep.result_from_bucket_sums(hi, lo, thresholds, order, invalid)
    return _stats.renormalize(result, normalize)  # per resample, before the quantiles

  return metrics


@functools.partial(jax.jit, static_argnames=("num_resamples", "chunk_size", "normalize"))
def _sweep_ci_jit(confidences, correct, thresholds, key, level, num_resamples, chunk_size,
                  normalize):
  per_sample, invalid = _sweep_per_sample(confidences, correct, thresholds)
  metrics = _sweep_metrics(thresholds, invalid, normalize)
  estimate = metrics(*per_sample)
  samples = _map_resamples(metrics, per_sample, key, num_resamples, chunk_size)
  return BootstrapResult(estimate, *_percentiles(samples, level))


@functools.partial(jax.jit, static_argnames=("normalize",))
def _sweep_estimate_jit(confidences, correct, thresholds, normalize):
  per_sample, invalid = _sweep_per_sample(confidences, correct, thresholds)
  metrics = _sweep_metrics(thresholds, invalid, normalize)
  return metrics(*per_sample), per_sample, invalid


_sweep_per_sample_jit = jax.jit(_sweep_per_sample)


def _sweep_options(fn: Callable) -> tuple[jax.Array, str] | None:
  """(thresholds, normalize) when ``fn`` is a keyword-only ``functools.partial`` of
  :func:`~cwsa_jax.sweep` with its thresholds; else None."""
  keywords = _keywords(fn, _sweep.sweep, {"thresholds", "normalize"})
  if keywords is None or "thresholds" not in keywords:
    return None
  # The options are valid here: bootstrap_ci computes the estimate, the sweep itself, first.
  return _validation.as_thresholds(keywords["thresholds"]), keywords.get("normalize", "retained")


# --- bootstrap_ci(ece): bucket once --------------------------------------------------------


def _keywords(fn: Callable, metric: Callable, allowed: set[str]) -> dict | None:
  """The keywords of ``fn`` when it is ``metric`` or a keyword-only ``functools.partial``
  of it with keywords among ``allowed``; else None."""
  keywords = {}
  if isinstance(fn, functools.partial) and not fn.args:
    fn, keywords = fn.func, dict(fn.keywords)
  return keywords if fn is metric and set(keywords) <= allowed else None


def _ece_options(fn: Callable) -> tuple[int, str] | None:
  """(num_bins, norm) when ``fn`` is :func:`~cwsa_jax.ece`, or a keyword-only
  ``functools.partial`` of it, with equal-width bins that fit a packed word; else None."""
  keywords = _keywords(fn, _calibration.ece, {"num_bins", "norm", "binning"})
  if keywords is None:
    return None
  # The options are valid here: bootstrap_ci computes the estimate, ece itself, first.
  num_bins, norm = keywords.get("num_bins", 15), keywords.get("norm", "l1")
  if keywords.get("binning", "width") != "width" or num_bins > _sweep.PACKED_MAX_BUCKETS:
    return None
  return int(num_bins), norm


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _ece_words(confidences, correct, num_bins):
  """Each sample's bin and correctness with 1 - c, one int32 word (``_sweep.pack_samples``)."""
  bins = _calibration.bin_index(confidences, _calibration.width_edges(num_bins))
  return _sweep.pack_samples(confidences, correct, bins)


def _ece_of_words(num_bins: int, norm: str) -> Callable:
  """The ECE of a resample's packed words: ``ece``'s exact per-bin sums and formula."""
  def metric(words):
    hi, lo = _sweep.packed_bucket_sums(words, num_bins)  # [B, 2 segments x 3 columns]
    hi, lo = _stats.calibration_canonical(hi.reshape(-1, 3), lo.reshape(-1, 3), graded=False)
    return _calibration.error_from_totals(_stats.calibration_totals(hi, lo), norm)
  return metric


# --- the forms bucketed once, for bootstrap_ci, paired_bootstrap and bootstrap_sweep ---------


@jax.tree_util.register_pytree_node_class
class _FastForm:
  """A metric of samples found once: ``spec`` (static: ``("ece", num_bins, norm)`` or
  ``("sweep", normalize)``), the per-sample ``arrays`` each resample gathers, ``shared``
  operands (the sweep's thresholds) and the ``invalid`` flag of the data."""

  def __init__(self, spec: tuple, arrays: tuple, shared: tuple, invalid: jax.Array):
    self.spec, self.arrays, self.shared, self.invalid = spec, tuple(arrays), tuple(shared), invalid

  def tree_flatten(self):
    return (self.arrays, self.shared, self.invalid), self.spec

  @classmethod
  def tree_unflatten(cls, spec, children):
    return cls(spec, *children)

  def metric(self, invalid: jax.Array | None = None) -> Callable:
    """The metric of one resample's gathered ``arrays`` (``invalid``: another model's flag)."""
    invalid = self.invalid if invalid is None else invalid
    if self.spec[0] == "ece":
      return _ece_of_words(*self.spec[1:])
    return _sweep_metrics(self.shared[0], invalid, self.spec[1])


def _fast_form(fn: Callable, confidences: jax.Array, correct: jax.Array) -> _FastForm | None:
  """``fn``'s per-sample form when it is one :func:`bootstrap_ci` buckets once: ``ece``
  (or a keyword-only partial, equal-width bins, boolean correctness) and a keyword-only
  partial of ``sweep`` with its thresholds; else None."""
  ece_options = _ece_options(fn)
  if ece_options is not None and correct.dtype == jnp.bool_:
    words = _ece_words(confidences, correct, ece_options[0])
    return _FastForm(("ece", *ece_options), (words,), (), jnp.zeros((), jnp.bool_))
  sweep_options = _sweep_options(fn)
  if sweep_options is not None:
    t, normalize = sweep_options
    per_sample, invalid = _sweep_per_sample_jit(confidences.astype(jnp.float32), correct, t)
    return _FastForm(("sweep", normalize), per_sample, (t,), invalid)
  return None


@functools.partial(jax.jit, static_argnames=("size", "num_chunks"), **_RESAMPLING)
def _fast_block_jit(form, key, start, size, num_chunks):
  return _map_block(form.metric(), form.arrays, key, start, size, num_chunks)


@functools.partial(jax.jit, static_argnames=("size", "num_chunks"), **_RESAMPLING)
def _fast_paired_block_jit(form_a, form_b, key, start, size, num_chunks):
  """Differences of the two models' metrics per resample (the same indices for both).

  Forms of one layout are stacked and the metric vmapped over the pair, as
  :func:`_pair_fn` does: identical models give exactly identical values.
  """
  k = len(form_a.arrays)
  same = (jax.tree.structure(form_a) == jax.tree.structure(form_b)
          and all(x.dtype == y.dtype for x, y in zip(form_a.arrays, form_b.arrays)))

  def diff(*arrays):
    a, b = arrays[:k], arrays[k:]
    if same:
      out = jax.vmap(lambda invalid, *xs: form_a.metric(invalid)(*xs))(
          jnp.stack([form_a.invalid, form_b.invalid]),
          *(jnp.stack([x, y]) for x, y in zip(a, b)))
      out_a, out_b = (jax.tree.map(lambda x, i=i: x[i], out) for i in (0, 1))
    else:
      out_a, out_b = form_a.metric()(*a), form_b.metric()(*b)
    return jax.tree.map(_subtract, out_a, out_b)

  return _map_block(diff, (*form_a.arrays, *form_b.arrays), key, start, size, num_chunks)
