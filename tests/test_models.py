"""Tests of the Flax NNX CNNs in cwsa_jax.training.models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cwsa_jax.losses import cwsa_regularized_loss
from cwsa_jax.training import models
from cwsa_jax.training.models import Cifar10CNN, MnistCNN, max_pool_2x2

SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


@pytest.fixture(scope="module")
def built():
  # Eager parameter initialisation compiles one small program per parameter
  # shape (seconds on a busy CPU): build each model once, clone per test.
  return {"mnist": MnistCNN(rngs=nnx.Rngs(0)), "cifar10": Cifar10CNN(rngs=nnx.Rngs(0))}


@nnx.jit
def _apply(model, x):
  return model(x)


def _param_count(model):
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_shapes_and_finite_outputs(built, name):
  model = nnx.clone(built[name])
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, *SHAPES[name])), jnp.float32)
  logits = _apply(model, x)
  assert logits.shape == (3, 10) and logits.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(logits)))
  model.eval()
  assert bool(jnp.all(jnp.isfinite(_apply(model, x))))
  cls = type(model)
  abstract = nnx.eval_shape(lambda: cls(rngs=nnx.Rngs(0), num_classes=7))
  assert abstract.head.kernel.shape[-1] == 7


def test_parameter_counts():
  # The sizes documented in training/models.py.
  assert _param_count(nnx.eval_shape(lambda: MnistCNN(rngs=nnx.Rngs(0)))) == 458_730
  small = nnx.eval_shape(lambda: MnistCNN(rngs=nnx.Rngs(0), convs_per_block=(1, 1)))
  assert _param_count(small) == 458_730 - 9 * 64 * 64 - 2 * 64
  assert _param_count(nnx.eval_shape(lambda: Cifar10CNN(rngs=nnx.Rngs(0)))) == 295_978
  wide = nnx.eval_shape(lambda: Cifar10CNN(rngs=nnx.Rngs(0), convs_per_block=(2, 2, 2)))
  assert _param_count(wide) == 295_978 + 9 * 32 * 32 + 2 * 32


def test_same_seed_same_model(built):
  x = jnp.ones((2, 28, 28, 1))
  a, b = nnx.clone(built["mnist"]), MnistCNN(rngs=nnx.Rngs(0))
  a.eval()
  b.eval()
  np.testing.assert_array_equal(_apply(a, x), _apply(b, x))
  c = MnistCNN(rngs=nnx.Rngs(4))
  c.eval()
  assert not np.allclose(_apply(a, x), _apply(c, x))


def test_train_and_eval_modes(built):
  model = nnx.clone(built["mnist"])
  x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 28, 28, 1)), jnp.float32)
  model.eval()
  first, second = _apply(model, x), _apply(model, x)
  np.testing.assert_array_equal(first, second)  # eval: deterministic
  # eval uses the running statistics: a sample's logits do not depend on the batch
  np.testing.assert_allclose(_apply(model, jnp.concatenate([x[:1]] * 8)), first[:1].repeat(8, 0),
                             atol=1e-5)
  model.train()
  third, fourth = _apply(model, x), _apply(model, x)
  assert not np.allclose(third, fourth)  # dropout draws new masks
  # training mode updates the batch-norm running statistics
  mean_before = np.asarray(model.block1.norms[0].mean[...])
  _apply(model, x + 3.0)
  assert not np.allclose(np.asarray(model.block1.norms[0].mean[...]), mean_before)


def test_invalid_configuration():
  with pytest.raises(ValueError, match="two positive"):
    MnistCNN(rngs=nnx.Rngs(0), convs_per_block=(1,))
  with pytest.raises(ValueError, match="3 entries"):
    Cifar10CNN(rngs=nnx.Rngs(0), widths=(8, 16))
  with pytest.raises(ValueError, match="positive"):
    Cifar10CNN(rngs=nnx.Rngs(0), convs_per_block=(1, 0, 1))


def _float64_filter_gradient(x, g, kh, kw):
  """The filter gradient summed in float64 by loops over the kernel offsets (an independent reference)."""
  x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
  n, h, w, ci = x.shape
  p, q = kh // 2, kw // 2
  padded = np.pad(x, ((0, 0), (p, p), (q, q), (0, 0)))
  out = np.zeros((kh, kw, ci, g.shape[-1]))
  for i in range(kh):
    for j in range(kw):
      out[i, j] = np.einsum("nyzc,nyzd->cd", padded[:, i:i + h, j:j + w], g)
  return out


def _float64_conv(x, w):
  """The stride-1 'SAME' conv in float64: sum over taps and input channels."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  n, h, wd, _ = x.shape
  kh, kw = w.shape[:2]
  padded = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  return sum(np.einsum("nyzc,cd->nyzd", padded[:, i:i + h, j:j + wd], w[i, j])
             for i in range(kh) for j in range(kw))


@pytest.mark.parametrize("shape", [(4, 28, 28, 1, 32), (3, 14, 14, 32, 64), (2, 7, 9, 3, 5),
                                   (2, 6, 5, 4, 3, 5, 3), (2, 8, 8, 5, 4)])
def test_conv_hook_same_forward_and_input_gradient_and_filter_gradient(shape):
  """The conv hook: forward and input gradient bit for bit lax's (of the operands with a
  channel of zeros added when their number is odd), forward and filter gradient within float32
  rounding of a float64 reference (odd sizes, a 5 x 3 kernel)."""
  n, h, w, ci, co = shape[:5]
  kh, kw = shape[5:] if len(shape) > 5 else (3, 3)
  rng = np.random.default_rng(sum(shape))
  x = jnp.asarray(rng.normal(size=(n, h, w, ci)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(kh, kw, ci, co)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(n, h, w, co)), jnp.float32)
  dn = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NHWC", "HWIO", "NHWC"))
  args = ((1, 1), "SAME", (1, 1), (1, 1), dn, 1)
  extra = ci % 2 if ci > 1 else 0  # the channel of zeros

  def lax_conv(a, b):
    a = jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra)))
    b = jnp.pad(b, ((0, 0), (0, 0), (0, extra), (0, 0)))
    dn = jax.lax.conv_dimension_numbers(a.shape, b.shape, ("NHWC", "HWIO", "NHWC"))
    return jax.lax.conv_general_dilated(a, b, *args[:4], dn, 1)

  y_lax, vjp_lax = jax.vjp(lax_conv, x, kernel)
  hook = lambda a, b: models.conv_general_dilated(a, b, *args, out_sharding=None)  # noqa: E731
  assert "custom_vjp_call" in str(jax.make_jaxpr(hook)(x, kernel))  # the matmul filter gradient
  y, vjp = jax.vjp(hook, x, kernel)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_lax))
  y64 = _float64_conv(x, kernel)
  assert np.abs(np.asarray(y) - y64).max() <= 2e-6 * np.abs(y64).max()
  (dx_lax, dw_lax), (dx, dw) = vjp_lax(g), vjp(g)
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(dx_lax))
  want = _float64_filter_gradient(x, g, kh, kw)
  scale = np.abs(want).max()
  assert np.abs(np.asarray(dw) - want).max() <= 2e-6 * scale
  assert np.abs(np.asarray(dw_lax) - want).max() <= 2e-6 * scale


def test_conv_hook_falls_back_to_lax_outside_its_case(monkeypatch):
  """Strides, more input channels than the limit or other paddings: plain lax (no custom VJP)."""
  calls = []
  monkeypatch.setattr(models, "_conv_same", lambda *a: calls.append(a))
  x = jnp.ones((1, 8, 8, 4), jnp.float32)
  kernel = jnp.ones((3, 3, 4, 2), jnp.float32)
  dn = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NHWC", "HWIO", "NHWC"))
  for strides, padding in (((2, 2), "SAME"), ((1, 1), "VALID"), ((1, 1), ((1, 1), (1, 1)))):
    y = models.conv_general_dilated(x, kernel, strides, padding, None, None, dn, 1)
    np.testing.assert_array_equal(
        np.asarray(y), np.asarray(jax.lax.conv_general_dilated(x, kernel, strides, padding,
                                                               dimension_numbers=dn)))
  monkeypatch.setattr(models, "MATMUL_FILTER_GRADIENT_MAX_CHANNELS", 3)
  models.conv_general_dilated(x, kernel, (1, 1), "SAME", None, None, dn, 1)
  assert not calls
  monkeypatch.setattr(models, "MATMUL_FILTER_GRADIENT_MAX_CHANNELS", 4)
  models.conv_general_dilated(x, kernel, (1, 1), "SAME", None, None, dn, 1)
  assert len(calls) == 1


def test_max_pool_matches_nnx_max_pool():
  x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 6, 7, 3)), jnp.float32)
  np.testing.assert_array_equal(max_pool_2x2(x), nnx.max_pool(x, (2, 2), (2, 2)))
  # Same gradient where there are no ties (random data).
  g = jax.grad(lambda x: jnp.sum(max_pool_2x2(x) ** 2))(x)
  g_ref = jax.grad(lambda x: jnp.sum(nnx.max_pool(x, (2, 2), (2, 2)) ** 2))(x)
  np.testing.assert_allclose(g, g_ref, atol=1e-6)


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
@pytest.mark.parametrize("loss_name", ["ce", "cwsa"])
def test_jitted_train_step_decreases_loss(built, name, loss_name):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(16, *SHAPES[name])), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, 16), jnp.int32)
  model = nnx.clone(built[name])
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

  def loss_fn(model, x, y):
    logits = model(x)
    if loss_name == "ce":
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    else:
      loss = cwsa_regularized_loss(logits, y)
    return loss, logits

  @nnx.jit
  def train_step(model, optimizer, x, y):
    (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, x, y)
    optimizer.update(model, grads)
    return loss

  model.train()
  losses = [float(train_step(model, optimizer, x, y)) for _ in range(8)]
  assert all(np.isfinite(losses))
  assert losses[-1] < losses[0]
  model.eval()
  assert bool(jnp.all(jnp.isfinite(_apply(model, x))))
