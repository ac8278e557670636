"""The internal forms of the ranking kernels agree: sort against radix select, NumPy's packed
sort against ``lax.sort``, and the rate test's integer search against every integer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cwsa_jax import _ranking
from cwsa_jax._kernels._dispatch import Kernels

TPRS = np.array([1e-9, 2.0**-23, 0.05, 0.5, 0.95, 0.999, 1 - 2.0**-23, 1.0], np.float32)
N_SELECT = _ranking._SELECT_MIN_N + 7  # the radix select's size range


def _keys(kind: str, n: int, rng) -> np.ndarray:
  """int32 keys as ``_ranking._score_keys`` makes them, of a few kinds of scores."""
  if kind == "unit":
    s = rng.uniform(size=n).astype(np.float32)
  elif kind == "ties":
    s = np.round(rng.uniform(size=n), 2).astype(np.float32)
  elif kind == "signed":  # keys over the whole int32 range: the 64-bit words on the host
    s = (rng.standard_cauchy(n) * 1e20).astype(np.float32)
  else:  # -0.0, 0.0 and subnormals of both signs
    s = rng.choice(np.array([-0.0, 0.0, 1e-45, -1e-45, 1e-40, 3.0], np.float32), n)
  return np.asarray(_ranking._score_keys(jnp.asarray(s)))


def _reference(keys: np.ndarray, correct: np.ndarray, tpr: np.ndarray) -> np.ndarray:
  """The definition in NumPy: the smallest wrong count among distinct thresholds that reach
  the target (the rate test in float32, as the kernel writes it)."""
  thresholds = np.unique(keys)
  num_correct = int(correct.sum())
  num_wrong = keys.size - num_correct
  accepted_correct = np.array([np.count_nonzero(correct & (keys >= t)) for t in thresholds])
  accepted_wrong = np.array([np.count_nonzero(~correct & (keys >= t)) for t in thresholds])
  rate = accepted_correct.astype(np.float32) / np.float32(max(num_correct, 1))
  reaches = rate[None] >= tpr[:, None] - np.float32(2.0**-22)
  return np.where(reaches, accepted_wrong[None], num_wrong).min(axis=1)


@pytest.mark.parametrize("kind", ["unit", "ties", "signed", "zeros"])
def test_select_and_sort_agree(kind):
  rng = np.random.default_rng(len(kind))
  keys = _keys(kind, N_SELECT, rng)
  for p in (0.0, 1 / N_SELECT, 0.5, 0.97, 1.0):
    correct = rng.uniform(size=N_SELECT) < p
    need = _ranking._fewest_correct(jnp.sum(correct, dtype=jnp.int32), jnp.asarray(TPRS))
    by_sort = _ranking._fewest_wrong_by_sort(keys, correct, need, Kernels())
    by_select = _ranking._fewest_wrong_by_select(keys, correct, need, Kernels())
    np.testing.assert_array_equal(by_sort, by_select)
    out = _ranking._fpr_at_tpr_impl(keys, correct, jnp.asarray(TPRS), kernels=Kernels())
    accelerator = _ranking._fpr_at_tpr_impl(keys, correct, jnp.asarray(TPRS),
                                            kernels=Kernels(platform="cuda"))
    assert np.asarray(out).tobytes() == np.asarray(accelerator).tobytes()


def test_select_matches_the_definition():
  rng = np.random.default_rng(3)
  keys = _keys("ties", N_SELECT, rng)
  correct = rng.uniform(size=N_SELECT) < 0.8
  need = _ranking._fewest_correct(jnp.sum(correct, dtype=jnp.int32), jnp.asarray(TPRS))
  got = _ranking._fewest_wrong_by_select(keys, correct, need, Kernels())
  np.testing.assert_array_equal(got, _reference(keys, correct, TPRS))


def test_fewest_correct_is_the_least_integer_that_reaches():
  targets = np.array([1e-9, 0.1, 0.3, 1 / 3, 0.5, 0.9, 0.95, 0.999, 1.0, 1.5, np.nan], np.float32)
  for num_correct in (0, 1, 2, 3, 19, 20, 21, 997, 2**20 + 3):
    got = np.asarray(_ranking._fewest_correct(jnp.int32(num_correct), jnp.asarray(targets)))
    grid = np.arange(num_correct + 1, dtype=np.float32) / np.float32(max(num_correct, 1))
    reaches = grid[None] >= targets[:, None] - np.float32(2.0**-22)
    want = np.where(reaches.any(axis=1), reaches.argmax(axis=1), num_correct + 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["unit", "signed", "zeros"])
def test_packed_sort_matches_lax_sort(kind):
  # The host's packed words (32 bits for "unit" and "zeros", 64 for "signed") and lax.sort.
  rng = np.random.default_rng(7)
  keys = _keys(kind, 3000, rng).reshape(3, 1000)
  correct = rng.uniform(size=keys.shape) < 0.6
  for form in (Kernels(platform="cpu"), Kernels(platform="cuda")):
    got = jax.vmap(lambda k, c, f=form: _ranking._sorted_outcomes(k, c, f))(keys, correct)
    order = np.lexsort((correct, keys), axis=-1)
    np.testing.assert_array_equal(got[0], np.take_along_axis(keys, order, -1))
    np.testing.assert_array_equal(got[1], np.take_along_axis(correct, order, -1))
