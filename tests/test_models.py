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


def _custom_vjps(fn, *args) -> int:
  """The custom VJPs in ``fn``'s jaxpr (the conv hook's own conv; the fused block op)."""
  return str(jax.make_jaxpr(fn)(*args)).count("custom_vjp_call[")


def test_conv_hook_falls_back_to_lax_outside_its_case():
  """Strides, more input channels than the limit or other paddings: plain lax (no custom VJP)."""
  x = jnp.ones((1, 8, 8, 4), jnp.float32)
  kernel = jnp.ones((3, 3, 4, 2), jnp.float32)
  dn = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NHWC", "HWIO", "NHWC"))
  for strides, padding in (((2, 2), "SAME"), ((1, 1), "VALID"), ((1, 1), ((1, 1), (1, 1)))):
    hook = lambda a, b: models.conv_general_dilated(  # noqa: E731
        a, b, strides, padding, None, None, dn, 1)  # noqa: B023
    assert _custom_vjps(hook, x, kernel) == 0
    np.testing.assert_array_equal(
        np.asarray(hook(x, kernel)),
        np.asarray(jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=dn)))
  # 4 input channels: the hook's own conv up to the limit, lax above it
  for limit, custom in ((3, 0), (4, 1), (models.MATMUL_FILTER_GRADIENT_MAX_CHANNELS, 1)):
    hook = lambda a, b: models.conv_general_dilated(  # noqa: E731
        a, b, (1, 1), "SAME", None, None, dn, 1, matmul_max_channels=limit)  # noqa: B023
    assert _custom_vjps(hook, x, kernel) == custom, limit
  assert _custom_vjps(lambda a, b: models.conv_general_dilated(
      a, b, (1, 1), "SAME", None, None, dn, 1), x, kernel) == 1  # the default limit


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


def _float64_norm_relu(x, mean, var, scale, bias, eps):
  """relu(batch norm) in float64, from its definition."""
  return np.maximum((x - mean) * (scale / np.sqrt(var + eps)) + bias, 0.0)


def _float64_norm_relu_pool(x, mean, var, scale, bias, eps):
  """max_pool_2x2(relu(batch norm)) in float64."""
  y = _float64_norm_relu(x, mean, var, scale, bias, eps)
  n, h, w, c = y.shape
  return y[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).max((2, 4))


def _float64_norm_relu_pool_input_gradient(x, mean, var, scale, bias, eps, g):
  """d/dx of sum(g * output) by jnp.max's convention: entries tied at a window's maximum share
  its gradient equally (ReLU's gradient is 0 at 0)."""
  mul = scale / np.sqrt(var + eps)
  y = _float64_norm_relu(x, mean, var, scale, bias, eps)
  n, h, w, c = y.shape
  dx = np.zeros_like(y)
  for b, i, j, k in np.ndindex(n, h // 2, w // 2, c):
    window = y[b, 2 * i:2 * i + 2, 2 * j:2 * j + 2, k]
    if window.max() > 0:
      hit = window == window.max()
      dx[b, 2 * i:2 * i + 2, 2 * j:2 * j + 2, k] = hit * g[b, i, j, k] * mul[k] / hit.sum()
  return dx


@pytest.mark.parametrize("shape", [(3, 8, 8, 4), (2, 7, 9, 3)])
def test_fused_norm_relu_pool_matches_float64_reference(shape):
  """Value and gradients of models.norm_relu_max_pool within float32 rounding of float64
  references: the definition, jnp.max's tie rule for x (ties from constant regions, as in the
  background of digits) and central differences for the statistics, scale and bias (negative
  scales pool by the minimum)."""
  rng = np.random.default_rng(sum(shape))
  n, h, w, c = shape
  x = rng.normal(size=shape)
  x[:, :4, :4] = 0.375  # whole windows tied
  x[:, 4:6, 2:4, 0] = x[:, 4:5, 2:3, 0]
  x = x.astype(np.float32).astype(np.float64)
  mean, var = rng.normal(size=c) * 0.3, rng.uniform(0.5, 2.0, size=c)
  scale = rng.normal(size=c)
  scale[0], scale[-1] = abs(scale[0]), -abs(scale[-1])
  bias = rng.normal(size=c) * 0.5
  params = [a.astype(np.float32).astype(np.float64) for a in (mean, var, scale, bias)]
  g = rng.normal(size=(n, h // 2, w // 2, c)).astype(np.float32).astype(np.float64)
  eps = 1e-5
  f32 = [jnp.asarray(a, jnp.float32) for a in (x, *params)]
  out, vjp = jax.vjp(lambda *a: models.norm_relu_max_pool(*a, eps), *f32)
  want = _float64_norm_relu_pool(x, *params, eps)
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  grads = [np.asarray(d, np.float64) for d in vjp(jnp.asarray(g, jnp.float32))]
  want_dx = _float64_norm_relu_pool_input_gradient(x, *params, eps, g)
  assert np.any((want_dx != 0) & (np.abs(want_dx) < np.abs(want_dx).max() / 3))  # split ties
  np.testing.assert_allclose(grads[0], want_dx, rtol=1e-5, atol=1e-6 * np.abs(want_dx).max())
  for i, p in enumerate(params):
    step = 1e-6 * np.maximum(np.abs(p), 1.0)
    fd = np.empty(c)
    for k in range(c):
      up, down = list(params), list(params)
      up[i], down[i] = p.copy(), p.copy()
      up[i][k] += step[k]
      down[i][k] -= step[k]
      fd[k] = np.sum(g * (_float64_norm_relu_pool(x, *up, eps)
                          - _float64_norm_relu_pool(x, *down, eps))) / (2 * step[k])
    np.testing.assert_allclose(grads[i + 1], fd, rtol=1e-4, atol=1e-5 * np.abs(fd).max())


def _fused_ops(model, x) -> int:
  """The blocks' fused ops (custom VJPs of ``norm_relu_max_pool``) in the forward pass."""
  graphdef, state = nnx.split(model)
  return str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(x))(state)).count(
      "name=norm_relu_max_pool")


def test_fused_blocks_equal_the_three_ops(built):
  """Each block's last batch norm, ReLU and pooling fused or as three nnx/jnp ops: the same
  logits, parameter gradients and running statistics up to float rounding, in both modes."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(8, 28, 28, 1)).astype(np.float32)
  x[:, :10] = -0.42  # background: tied windows
  x, y = jnp.asarray(x), jnp.asarray(rng.integers(0, 10, 8))
  calls = []  # the fused ops of each run

  def run(fused):
    # built["mnist"]'s parameters (the same seed), its blocks fused or not
    model = MnistCNN(rngs=nnx.Rngs(0), fused_norm_relu_pool=fused)
    nnx.update(model, nnx.state(built["mnist"]))
    model.dropout.rate = 0.0
    calls.append(_fused_ops(model, x))

    @nnx.jit
    def step(model):
      loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()  # noqa: E731
      return nnx.grad(loss)(model)

    grads = jax.tree.map(np.asarray, nnx.state(step(model), nnx.Param))
    stats = jax.tree.map(np.asarray, nnx.state(model, nnx.BatchStat))
    model.eval()
    return grads, stats, np.asarray(nnx.jit(lambda m: m(x))(model))

  unfused = run(False)
  fused = run(True)
  assert calls == [0, 2]  # unfused: none; fused: both blocks
  for a, b in zip(jax.tree.leaves(unfused), jax.tree.leaves(fused)):
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
