"""Flax NNX CNNs for MNIST and CIFAR-10.

Both take NHWC float images (already normalised; see the data pipeline) and
return unnormalised logits [batch, num_classes]. Batch norm and dropout
follow the module's mode: call ``model.train()`` before training steps and
``model.eval()`` before evaluation (running batch-norm statistics, no
dropout). Models are built in training mode.

Sizes at the defaults (parameters; forward multiply-adds per image):

* :class:`MnistCNN`: a conv block of 32 channels and one of two 64-channel
  convs (3x3 conv + batch norm + ReLU, 2x2 max pooling), dense 128 + dropout;
  458,730 parameters, 11.5M multiply-adds.
* :class:`Cifar10CNN`: VGG-style, three blocks of 3x3 conv + batch norm
  layers (32, 64, 128 channels; one conv in the first block, two in the
  others), max pooling, global average pooling, dense 128 + dropout;
  295,978 parameters, 29M multiply-adds.

The step time grows with the multiply-adds, so ``convs_per_block`` and
``widths`` trade accuracy for CPU time; the accuracy and time per epoch of
the configurations in :mod:`cwsa_jax.training.configs` are recorded, with
the commands that produced them, in the repository's
``results/training/README.md``.

XLA's CPU convolution *filter* gradients dominate the step time: the convs
pass :func:`conv_general_dilated` to ``nnx.Conv``, which computes them as one
matmul where that is faster (few input channels), and give an odd number
of input channels (CIFAR-10's 3) a channel of zeros, which makes XLA's forward
conv several times faster. ``nnx.max_pool`` is
avoided because its gradient (``select_and_scatter_add``) is much slower on
CPU than the reshape-and-max used here. Each block ends with one op for batch
norm, ReLU and pooling (:func:`norm_relu_max_pool`): it pools first, then
normalizes a quarter of the values, and its gradient is one pass over the
block's conv output.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


class ConvBlock(nnx.Module):
  """``num_convs`` x (3x3 conv, batch norm, ReLU), then 2x2 max pooling.

  With ``fused_norm_relu_pool`` (the default) the last batch norm, ReLU and the
  pooling are one op with its own gradient (:func:`norm_relu_max_pool`); False
  runs them as three ops (the same values up to float rounding).
  """

  def __init__(self, in_features: int, out_features: int, *, num_convs: int = 1,
               fused_norm_relu_pool: bool = True, rngs: nnx.Rngs):
    self.fused_norm_relu_pool = fused_norm_relu_pool
    self.convs = nnx.List()
    self.norms = nnx.List()
    for i in range(num_convs):
      self.convs.append(nnx.Conv(in_features if i == 0 else out_features, out_features, (3, 3),
                                 padding="SAME", use_bias=False, rngs=rngs,
                                 conv_general_dilated=conv_general_dilated))
      self.norms.append(nnx.BatchNorm(out_features, momentum=0.9, rngs=rngs))

  def __call__(self, x: jax.Array) -> jax.Array:
    *inner, (conv, norm) = zip(self.convs, self.norms)
    for c, n in inner:
      x = jax.nn.relu(n(c(x)))
    if not self.fused_norm_relu_pool:
      return max_pool_2x2(jax.nn.relu(norm(conv(x))))
    x = conv(x)
    return norm_relu_max_pool(x, *_batch_statistics(norm, x), norm.scale[...], norm.bias[...],
                              epsilon=norm.epsilon)


def _batch_statistics(norm: nnx.BatchNorm, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The mean and variance ``norm(x)`` normalizes with, updating its running averages as it does.

  In training mode, the batch's per-channel mean and its variance as ``nnx.BatchNorm`` computes
  them by default (``E[x^2] - E[x]^2``, clipped at 0); in evaluation mode
  (``use_running_average``) the running averages.
  """
  if norm.use_running_average:
    return norm.mean[...], norm.var[...]
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axes)
  var = jnp.maximum(0.0, jnp.mean(lax.square(x), axes) - lax.square(mean))
  m = norm.momentum
  norm.mean[...] = lax.stop_gradient(m * norm.mean[...] + (1 - m) * mean)
  norm.var[...] = lax.stop_gradient(m * norm.var[...] + (1 - m) * var)
  return mean, var


# Input channels up to which a stride-1 'SAME' conv's filter gradient is one matmul of
# shifted copies of the input (:func:`_filter_gradient`) rather than XLA's: faster on XLA:CPU
# with few input channels, slower with many (benchmarks/bench_handwritten.py,
# docs/performance.md).
MATMUL_FILTER_GRADIENT_MAX_CHANNELS = 32
# XLA:CPU's forward conv is much slower with an odd number of input channels than with one
# channel of zeros more (benchmarks/profile_train_step.py).
ODD_CHANNELS_PADDED = True


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         precision=None, *,
                         matmul_max_channels: int = MATMUL_FILTER_GRADIENT_MAX_CHANNELS,
                         **kwargs):
  """``lax.conv_general_dilated`` (``nnx.Conv``'s hook), with a faster filter gradient.

  A float32 NHWC / HWIO 'SAME' convolution with stride 1, no dilation, one
  group and at most ``matmul_max_channels`` input channels (by default
  :data:`MATMUL_FILTER_GRADIENT_MAX_CHANNELS`) gets lax's forward pass and input
  gradient (of the operands with a channel of zeros added when their number is
  odd, see :func:`_conv`), and its filter gradient from :func:`_filter_gradient`
  (equal to XLA's up to float rounding). Anything else is ``lax.conv_general_dilated`` itself.
  """
  ones = (None, 1, (1, 1))
  applies = (
      lhs.ndim == 4 and padding == "SAME" and tuple(window_strides) == (1, 1)
      and lhs_dilation in ones and rhs_dilation in ones and feature_group_count == 1
      and precision is None and not kwargs.get("preferred_element_type")
      and kwargs.get("out_sharding") is None
      and lhs.dtype == rhs.dtype == jnp.float32
      and lhs.shape[-1] <= matmul_max_channels
      and rhs.shape[0] % 2 == 1 and rhs.shape[1] % 2 == 1
      and dimension_numbers == lax.conv_dimension_numbers(lhs.shape, rhs.shape,
                                                          ("NHWC", "HWIO", "NHWC")))
  if applies:
    return _conv_same(lhs, rhs)
  return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                  dimension_numbers, feature_group_count, precision=precision,
                                  **kwargs)


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
  """lax's stride-1 'SAME' NHWC conv. An odd number (> 1) of input channels gets one more,
  of zeros in x and w: the same products, summed in another order (equal up to float
  rounding). XLA's CPU conv was several times slower with odd channel counts
  (:data:`ODD_CHANNELS_PADDED`)."""
  ci = x.shape[-1]
  if ODD_CHANNELS_PADDED and ci > 1 and ci % 2:
    x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, 1)))
    w = jnp.pad(w, ((0, 0), (0, 0), (0, 1), (0, 0)))
  return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


@jax.custom_vjp
def _conv_same(x: jax.Array, w: jax.Array) -> jax.Array:
  return _conv(x, w)


def _conv_same_fwd(x, w):
  return _conv(x, w), (x, w)


def _conv_same_bwd(residuals, g):
  x, w = residuals
  (dx,) = jax.linear_transpose(lambda x: _conv(x, w), x)(g)  # XLA's input gradient
  return dx, _filter_gradient(x, g, w.shape[0], w.shape[1])


_conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)


def _filter_gradient(x: jax.Array, g: jax.Array, kh: int, kw: int) -> jax.Array:
  """d/dw of ``sum(g * conv(x, w))`` for a stride-1 'SAME' conv: [kh, kw, Ci, Co].

  .. math::

    \\frac{\\partial}{\\partial w_{ijcd}} = \\sum_{n,y,z} x_{n,\\,y+i-p,\\,z+j-q,\\,c}\\,g_{nyzd}

  with ``(p, q) = (kh // 2, kw // 2)`` and x zero outside the image: one
  matmul of the kh kw shifted copies of the input, channels first,
  [kh kw Ci, N H W], with the output gradient [N H W, Co].
  """
  n, h, w, ci = x.shape
  p, q = kh // 2, kw // 2
  padded = jnp.pad(jnp.transpose(x, (3, 0, 1, 2)), ((0, 0), (0, 0), (p, p), (q, q)))
  shifted = jnp.stack([padded[:, :, i:i + h, j:j + w] for i in range(kh) for j in range(kw)])
  grad = shifted.reshape(kh * kw * ci, n * h * w) @ g.reshape(n * h * w, -1)
  return grad.reshape(kh, kw, ci, -1)


def _windows(x: jax.Array) -> jax.Array:
  """[N, H, W, C] -> [N, H // 2, 2, W // 2, 2, C], odd trailing rows and columns dropped."""
  n, h, w, c = x.shape
  return x[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def norm_relu_max_pool(x: jax.Array, mean: jax.Array, var: jax.Array, scale: jax.Array,
                       bias: jax.Array, epsilon: float) -> jax.Array:
  """``max_pool_2x2(relu(batch_norm(x)))`` from pooled inputs, with a one-pass gradient.

  Per channel, batch norm is the affine map :math:`y = (x - \\mu)\\,m + \\beta`,
  :math:`m = \\gamma / \\sqrt{\\sigma^2 + \\epsilon}` (``mean``, ``var``, ``scale``,
  ``bias``, computed as ``nnx.BatchNorm`` does), and ReLU is nondecreasing, so for
  each 2x2 window :math:`w`

  .. math::

    \\max_{i \\in w} \\mathrm{relu}(y_i) = \\mathrm{relu}\\big((\\hat x_w - \\mu)\\,m + \\beta\\big),
    \\qquad \\hat x_w = \\max_{i \\in w} x_i \\text{ if } m \\ge 0, \\text{ else } \\min_{i \\in w} x_i,

  exactly in floating point too (each rounded step is monotone). The normalization
  then runs on a quarter of the values. The gradient of the output ``g`` is, with
  :math:`z_w = (\\hat x_w - \\mu)\\,m + \\beta` and :math:`g'_w = g_w [z_w > 0]`,
  :math:`\\partial x_i = g'_w\\, m\\, [x_i = \\hat x_w] / \\#\\{j \\in w: x_j = \\hat x_w\\}`
  (equal :math:`x_i` share it, as ``jnp.max``'s gradient does; where distinct
  :math:`x_i` round to the same :math:`y_i`, or :math:`m = 0`, ``jnp.max`` would share it
  too and here the extreme :math:`x_i` takes it),
  :math:`\\partial\\beta = \\sum_w g'_w`, :math:`\\partial\\gamma = \\sum_w g'_w (\\hat x_w - \\mu)
  / \\sqrt{\\sigma^2 + \\epsilon}`, :math:`\\partial\\mu = -m \\sum_w g'_w` and
  :math:`\\partial\\sigma^2 = -\\tfrac12 \\gamma (\\sigma^2 + \\epsilon)^{-3/2}
  \\sum_w g'_w (\\hat x_w - \\mu)` (sums over the batch and the pooled positions); the
  statistics' own gradient (through ``mean`` and ``var``) is left to autodiff. Equal to
  the three ops and their autodiff gradient up to float rounding.
  """
  return _norm_relu_max_pool_fwd(x, mean, var, scale, bias, epsilon)[0]


def _norm_relu_max_pool_fwd(x, mean, var, scale, bias, epsilon):
  windows = _windows(x)
  mul = lax.rsqrt(var + epsilon) * scale
  pooled = jnp.where(mul >= 0, jnp.max(windows, axis=(2, 4)), jnp.min(windows, axis=(2, 4)))
  return jax.nn.relu((pooled - mean) * mul + bias), (x, pooled, mean, var, scale, bias)


def _norm_relu_max_pool_bwd(epsilon, residuals, g):
  x, pooled, mean, var, scale, bias = residuals
  inv_std = lax.rsqrt(var + epsilon)
  mul = inv_std * scale
  centred = pooled - mean
  g = jnp.where(centred * mul + bias > 0, g, 0.0)  # ReLU's gradient (0 at 0, as jax.nn.relu's)
  axes = (0, 1, 2)
  g_sum, g_centred = jnp.sum(g, axes), jnp.sum(g * centred, axes)
  windows = _windows(x)
  # The ties per window, counted on its four strided corners (a quarter-size pass; a sum over
  # the window axes made XLA write the full-size comparison out first).
  ties = sum((windows[:, :, i, :, j] == pooled).astype(x.dtype) for i in (0, 1) for j in (0, 1))
  share = g * mul / ties
  dx = jnp.where(windows == pooled[:, :, None, :, None], share[:, :, None, :, None], 0.0).reshape(
      x.shape[0], x.shape[1] // 2 * 2, x.shape[2] // 2 * 2, x.shape[3])
  dx = jnp.pad(dx, ((0, 0), (0, x.shape[1] % 2), (0, x.shape[2] % 2), (0, 0)))
  return (dx, -mul * g_sum, -0.5 * scale * inv_std ** 3 * g_centred, inv_std * g_centred, g_sum)


norm_relu_max_pool.defvjp(_norm_relu_max_pool_fwd, _norm_relu_max_pool_bwd)


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """2x2 max pooling with stride 2 (odd trailing rows/columns are dropped).

  Written as a reshape and a ``max`` rather than ``nnx.max_pool``: on XLA's
  CPU backend the latter's gradient (``select_and_scatter_add``) is much
  slower, enough to make it the most expensive op of the MNIST train step.
  """
  return jnp.max(_windows(x), axis=(2, 4))


class MnistCNN(nnx.Module):
  """Small CNN for 28x28x1 digits: 2 conv blocks (32, 64), dense 128, dropout.

  Args:
    num_classes: number of output logits (10).
    convs_per_block: conv layers in the two blocks (default (1, 2): the
      28x28 block has one conv, the 14x14 block two).
    dropout_rate: dropout before the last layer (active in ``train()`` mode).
    fused_norm_relu_pool: each block ends with one fused op (see
      :class:`ConvBlock`).
    rngs: ``nnx.Rngs`` with ``params`` and ``dropout`` streams (a plain
      ``nnx.Rngs(seed)`` provides both).

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from cwsa_jax.training.models import MnistCNN
    >>> model = MnistCNN(rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 28, 28, 1))).shape
    (2, 10)
  """

  def __init__(self, *, num_classes: int = 10, convs_per_block: Sequence[int] = (1, 2),
               dropout_rate: float = 0.4, fused_norm_relu_pool: bool = True, rngs: nnx.Rngs):
    if len(convs_per_block) != 2 or min(convs_per_block) < 1:
      raise ValueError(
          f"convs_per_block must be two positive integers, got {tuple(convs_per_block)}")
    self.block1 = ConvBlock(1, 32, num_convs=convs_per_block[0],
                            fused_norm_relu_pool=fused_norm_relu_pool, rngs=rngs)
    self.block2 = ConvBlock(32, 64, num_convs=convs_per_block[1],
                            fused_norm_relu_pool=fused_norm_relu_pool, rngs=rngs)
    self.dense = nnx.Linear(7 * 7 * 64, 128, rngs=rngs)
    self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
    self.head = nnx.Linear(128, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, 28, 28, 1] float images -> [batch, num_classes] logits."""
    x = self.block2(self.block1(x))
    x = x.reshape(x.shape[0], -1)
    x = self.dropout(jax.nn.relu(self.dense(x)))
    return self.head(x)


class Cifar10CNN(nnx.Module):
  """Small VGG-style CNN with batch norm for 32x32x3 images.

  Three blocks of ``convs_per_block`` 3x3 conv + batch norm + ReLU layers
  with ``widths`` channels, each followed by 2x2 max pooling, then global
  average pooling, dense 128, dropout and the classifier.

  Args:
    num_classes: number of output logits (10).
    widths: channels of the three blocks (default (32, 64, 128)).
    convs_per_block: conv layers in each block (default (1, 2, 2): the 32x32
      block has one conv, which keeps the CPU cost down).
    dropout_rate: dropout before the last layer.
    fused_norm_relu_pool: each block ends with one fused op (see
      :class:`ConvBlock`).
    rngs: ``nnx.Rngs`` with ``params`` and ``dropout`` streams.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from cwsa_jax.training.models import Cifar10CNN
    >>> model = Cifar10CNN(rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 32, 32, 3))).shape
    (2, 10)
  """

  def __init__(self, *, num_classes: int = 10, widths: Sequence[int] = (32, 64, 128),
               convs_per_block: Sequence[int] = (1, 2, 2), dropout_rate: float = 0.3,
               fused_norm_relu_pool: bool = True, rngs: nnx.Rngs):
    if len(widths) != 3 or len(convs_per_block) != 3:
      raise ValueError(f"widths and convs_per_block must have 3 entries (one per block), got "
                       f"{tuple(widths)} and {tuple(convs_per_block)}")
    if min(convs_per_block) < 1 or min(widths) < 1:
      raise ValueError("widths and convs_per_block must be positive")
    channels = (3, *widths)
    self.blocks = nnx.List([
        ConvBlock(channels[i], channels[i + 1], num_convs=convs_per_block[i],
                  fused_norm_relu_pool=fused_norm_relu_pool, rngs=rngs)
        for i in range(3)])
    self.dense = nnx.Linear(widths[-1], 128, rngs=rngs)
    self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
    self.head = nnx.Linear(128, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, 32, 32, 3] float images -> [batch, num_classes] logits."""
    for block in self.blocks:
      x = block(x)
    x = jnp.mean(x, axis=(1, 2))  # global average pooling
    x = self.dropout(jax.nn.relu(self.dense(x)))
    return self.head(x)
