"""MNIST and CIFAR-10 for training: loading, caching, normalisation, augmentation, batches.

One entry point, :func:`load_dataset`, returns uint8 images ``[N, H, W, C]`` and
int32 labels for the train and test splits, from either

* **local files** (``data_dir=`` or ``$CWSA_JAX_DATA_DIR``): MNIST IDX files
  (gzipped or not); CIFAR-10 as ``train/<class>/<image>`` folders (a directory
  or a ``.tar.gz`` of one), the official "python version" pickles or the
  "binary version" batches (folders or their ``.tar.gz``). ``data_dir`` may be
  the dataset folder itself or a parent holding ``mnist/`` and ``cifar10/``.
  Decoded arrays are cached as ``.npz`` (see :func:`default_cache_dir`), keyed
  by the source files' paths, sizes and modification times, so the second
  load takes a fraction of a second and an edited source is re-read.
* **tensorflow-datasets** (no ``data_dir``): ``tfds`` downloads and prepares
  the dataset (this needs network access and TensorFlow, which the ``mnist``
  and ``cifar10`` builders use to read the raw files) and the arrays are read
  through ``tfds``'s random-access data source, which does not need
  TensorFlow. Before downloading, a TCP connection to the download host is
  tried with a short timeout: offline, the loader fails within seconds
  (instead of the ~3 minutes of ``tfds``'s own retries) with a message saying
  how to point it at local files.

Problems with the files raise :class:`DataError` (a ``ValueError``; the
subclass :class:`DataFileNotFoundError` is also a ``FileNotFoundError``) whose
message names the file.

Preprocessing: :func:`normalize` (per-dataset mean/std), :func:`augment`
(seeded random crop with zero padding and horizontal flip, jit-able, one key
per image), :func:`iterate_batches` (seeded shuffling, resumable) and
:func:`gather_batch` (the same batches, gathered inside a jitted step from a
split kept on the device).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import socket
import tempfile
import threading
import urllib.parse
import urllib.request
import warnings
import zipfile
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _formats
from ._formats import CIFAR10_CLASSES
from ._formats import DataError
from ._formats import DataFileNotFoundError
from ._formats import MNIST_CLASSES

DATASETS = ("cifar10", "mnist")
SOURCES = ("auto", "local", "tfds")
DATA_DIR_ENV = "CWSA_JAX_DATA_DIR"
CACHE_ENV = "CWSA_JAX_CACHE"

# Per-channel mean and std of pixel/255 on the training split. MNIST: the
# usual constants. CIFAR-10: the original binary release (the common JPEG
# re-encoding differs in the third decimal: 0.4913/0.4821/0.4465 and
# 0.2452/0.2428/0.2606).
NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}

# Where tensorflow-datasets downloads each dataset from (checked before
# calling tfds so that an offline machine fails fast).
DOWNLOAD_HOSTS = {
    "mnist": ("storage.googleapis.com", 443),
    "cifar10": ("www.cs.toronto.edu", 443),
}

_ARRAY_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
_CACHE_VERSION = 1

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "DataError",
    "DataFileNotFoundError",
    "Dataset",
    "MNIST_CLASSES",
    "NORMALIZATION",
    "augment",
    "default_cache_dir",
    "epoch_permutation",
    "gather_batch",
    "iterate_batches",
    "load_dataset",
    "normalize",
    "num_batches",
]


class Dataset(NamedTuple):
  """Train and test splits of one dataset as NumPy arrays.

  Attributes:
    train_images: ``[N_train, H, W, C]`` uint8 (MNIST ``[.., 28, 28, 1]``,
      CIFAR-10 ``[.., 32, 32, 3]``).
    train_labels: ``[N_train]`` int32 class indices.
    test_images: ``[N_test, H, W, C]`` uint8.
    test_labels: ``[N_test]`` int32.
    name: ``"mnist"`` or ``"cifar10"``.
    class_names: the class names in label order.
    format: how the data was stored: ``"tfds"``, ``"idx"``, ``"idx.gz"``,
      ``"image-folder"``, ``"image-folder-tar"``, ``"python-batches"``,
      ``"python-tar"``, ``"binary-batches"`` or ``"binary-tar"``.
    source: human-readable origin (``"tfds:mnist/3.0.1 in DIR"`` or
      ``"<format> at <path>"``), suitable for a results file.
    from_cache: whether the arrays came from the ``.npz`` cache.
  """

  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  name: str
  class_names: tuple[str, ...]
  format: str
  source: str
  from_cache: bool = False

  @property
  def num_classes(self) -> int:
    return len(self.class_names)

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.train_images.shape[1:])


# --------------------------------------------------------------------------- loading


def _canonical_name(name: Any) -> str:
  if isinstance(name, str):
    key = name.lower().replace("-", "").replace("_", "")
    if key in DATASETS:
      return key
  raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")


def default_cache_dir() -> pathlib.Path:
  """``$CWSA_JAX_CACHE``, else ``$XDG_CACHE_HOME/cwsa_jax``, else ``~/.cache/cwsa_jax``."""
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV]).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "cwsa_jax"


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    source: str = "auto",
    cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    tfds_data_dir: str | os.PathLike[str] | None = None,
    num_workers: int | None = None,
    network_timeout: float = 5.0,
) -> Dataset:
  """Loads MNIST or CIFAR-10 as uint8 images and int32 labels.

  Usage::

    ds = load_dataset("mnist", data_dir="data")               # data/mnist/*.gz IDX files
    ds = load_dataset("cifar10", data_dir="cifar10-jpg.tar.gz")
    ds = load_dataset("cifar10")                               # tensorflow-datasets

  Args:
    name: ``"mnist"`` or ``"cifar10"`` (case, ``-`` and ``_`` ignored).
    data_dir: a folder with local files (the dataset's own folder, or a parent
      holding ``mnist/`` / ``cifar10/``), or a CIFAR-10 archive. Defaults to
      ``$CWSA_JAX_DATA_DIR`` when ``source="auto"``.
    source: ``"auto"`` (local files when a data dir is given or set in the
      environment, else tensorflow-datasets), ``"local"`` or ``"tfds"``.
    cache: read and write the decoded-array cache for local files.
    cache_dir: cache folder; defaults to :func:`default_cache_dir`. It is never
      the (possibly read-only) data folder; if it cannot be written the load
      still succeeds, with a warning.
    tfds_data_dir: ``data_dir`` for tensorflow-datasets (its default:
      ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``).
    num_workers: processes for decoding image folders (default: the CPUs
      available, up to 16; ``0`` or ``1`` decodes in this process).
    network_timeout: seconds to wait for the tfds download host.

  Returns:
    A :class:`Dataset`. MNIST images have shape ``[N, 28, 28, 1]``, CIFAR-10
    ``[N, 32, 32, 3]``; labels index ``class_names``.

  Raises:
    ValueError: unknown ``name`` or ``source`` (the message lists the valid ones).
    DataError: missing, corrupt or unrecognised files (the message names the
      file), or tensorflow-datasets unable to download (offline, or TensorFlow
      missing); :class:`DataFileNotFoundError` when a file or folder is absent.
  """
  name = _canonical_name(name)
  if source not in SOURCES:
    raise ValueError(f"unknown source {source!r}; valid sources: {', '.join(SOURCES)}")
  if source == "tfds" and data_dir is not None:
    raise ValueError("data_dir= names local files; with source='tfds' pass tfds_data_dir= "
                     "(or use source='auto' or 'local' for the files)")
  if data_dir is None and source in ("auto", "local"):
    data_dir = os.environ.get(DATA_DIR_ENV) or None
  if source == "auto":
    source = "tfds" if data_dir is None else "local"
  if source == "tfds":
    return _load_tfds(name, tfds_data_dir=tfds_data_dir, network_timeout=network_timeout)
  if data_dir is None:
    raise ValueError(f"source='local' needs data_dir= (or ${DATA_DIR_ENV}) pointing at "
                     f"{_formats.FORMAT_HELP[name]}")
  return _load_local(name, data_dir, cache=cache, cache_dir=cache_dir, num_workers=num_workers)


def _check_arrays(name: str, arrays: dict[str, np.ndarray], where: str) -> None:
  shape = _formats.IMAGE_SHAPES[name]
  for split in ("train", "test"):
    images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    if images.dtype != np.uint8 or images.shape[1:] != shape:
      raise DataError(f"{where}: {split} images are {images.dtype} {images.shape}, expected "
                      f"uint8 [N, {', '.join(map(str, shape))}]")
    if labels.shape != images.shape[:1]:
      raise DataError(f"{where}: {labels.shape[0]} {split} labels for {images.shape[0]} images")
    if images.shape[0] == 0:
      raise DataError(f"{where}: the {split} split is empty")


def _load_local(name: str, data_dir: Any, *, cache: bool, cache_dir: Any,
                num_workers: int | None) -> Dataset:
  found = _formats.find_local_source(name, data_dir)
  where = str(found.path)
  cache_path = None
  key = None
  if cache:
    key = found.fingerprint()
    path_id = hashlib.sha256(str(found.path.resolve()).encode()).hexdigest()[:12]
    directory = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir).expanduser()
    cache_path = directory / f"{name}-{found.format}-{path_id}-{key[:16]}.npz"
    arrays = _read_cache(cache_path, key)
    if arrays is not None:
      try:
        _check_arrays(name, arrays, str(cache_path))
      except DataError as e:
        warnings.warn(f"ignoring inconsistent cache file ({e})", stacklevel=2)
      else:
        return _make_dataset(name, arrays, found.format, found.describe(), from_cache=True)
  arrays = found.read(num_workers=num_workers)
  _check_arrays(name, arrays, where)
  if cache_path is not None:
    _write_cache(cache_path, arrays, {"key": key, "name": name, "format": found.format,
                                      "source": found.describe(), "version": _CACHE_VERSION})
  return _make_dataset(name, arrays, found.format, found.describe(), from_cache=False)


def _make_dataset(name: str, arrays: dict[str, np.ndarray], fmt: str, source: str, *,
                  from_cache: bool) -> Dataset:
  return Dataset(arrays["train_images"], arrays["train_labels"].astype(np.int32, copy=False),
                 arrays["test_images"], arrays["test_labels"].astype(np.int32, copy=False),
                 name=name, class_names=_formats.CLASS_NAMES[name], format=fmt, source=source,
                 from_cache=from_cache)


def _read_cache(path: pathlib.Path, key: str) -> dict[str, np.ndarray] | None:
  if not path.is_file():
    return None
  try:
    with np.load(path, allow_pickle=False) as archive:
      meta = json.loads(str(archive["meta"]))
      if meta.get("key") != key or meta.get("version") != _CACHE_VERSION:
        return None
      return {k: archive[k] for k in _ARRAY_KEYS}
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    warnings.warn(f"ignoring unreadable cache file {path} ({type(e).__name__}: {e})",
                  stacklevel=3)
    return None


def _write_cache(path: pathlib.Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
  """Writes ``path`` atomically (temporary file + ``os.replace``); drops stale versions."""
  tmp = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **{k: arrays[k] for k in _ARRAY_KEYS}, meta=np.array(json.dumps(meta)))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    tmp = None
    # Same dataset, format and source path, older contents: no longer reachable.
    stem = path.name.rsplit("-", 1)[0]
    for stale in path.parent.glob(f"{stem}-*.npz"):
      if stale != path:
        stale.unlink(missing_ok=True)
  except OSError as e:
    warnings.warn(f"could not write the dataset cache {path} ({e}); the next load will decode "
                  "the files again. Set cache_dir= or $CWSA_JAX_CACHE to a writable folder.",
                  stacklevel=3)
  finally:
    if tmp is not None:
      try:
        os.unlink(tmp)
      except OSError:
        pass


# --------------------------------------------------------------------------- tensorflow-datasets


def _local_hint(name: str) -> str:
  return (f"Point the loader at local files instead: load_dataset({name!r}, data_dir=PATH), "
          f"`cwsa-jax train --data-dir PATH`, or set {DATA_DIR_ENV}=PATH, where PATH holds "
          f"{_formats.FORMAT_HELP[name]}.")


def _probe(host: str, port: int, timeout: float) -> str | None:
  """None when a TCP connection to ``host:port`` opens within ``timeout`` s, else why not.

  Runs in a daemon thread so that a hanging DNS lookup cannot stall the caller.
  """
  outcome: list[str | None] = []

  def attempt() -> None:
    try:
      with socket.create_connection((host, port), timeout=timeout):
        outcome.append(None)
    except OSError as e:
      outcome.append(f"{type(e).__name__}: {e}")

  thread = threading.Thread(target=attempt, daemon=True)
  thread.start()
  thread.join(timeout)
  if not outcome:
    return f"no answer within {timeout:g} s"
  return outcome[0]


def _download_endpoint(name: str) -> tuple[str, int]:
  """The download host, or the HTTPS proxy in front of it when one is configured."""
  host, port = DOWNLOAD_HOSTS[name]
  proxy = urllib.request.getproxies().get("https")
  if proxy and not urllib.request.proxy_bypass(host):
    parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parsed.hostname:
      return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
  return host, port


def _check_tfds_can_prepare(name: str, timeout: float) -> None:
  """Fails fast, before tfds starts retrying downloads, when preparing cannot work."""
  host, port = _download_endpoint(name)
  reason = _probe(host, port, timeout)
  if reason is not None:
    raise DataError(f"tensorflow-datasets cannot download {name}: {host}:{port} is unreachable "
                    f"({reason}); this machine looks offline. " + _local_hint(name))
  if importlib.util.find_spec("tensorflow") is None:
    raise DataError(f"tensorflow-datasets needs TensorFlow to download and prepare {name} (its "
                    "builder reads the raw files with tf.io.gfile), and TensorFlow is not "
                    "installed: `pip install tensorflow`. " + _local_hint(name))


def _data_source_arrays(data_source: Any, shape: tuple[int, ...],
                        where: str) -> tuple[np.ndarray, np.ndarray]:
  count = len(data_source)
  images = np.empty((count, *shape), np.uint8)
  labels = np.empty((count,), np.int32)
  for i in range(count):
    example = data_source[i]
    image = np.asarray(example["image"])
    if image.shape != shape:
      raise DataError(f"{where}: example {i} has image shape {image.shape}, expected {shape}")
    images[i] = image
    labels[i] = int(example["label"])
  return images, labels


def _load_tfds(name: str, *, tfds_data_dir: Any, network_timeout: float) -> Dataset:
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DataError("tensorflow-datasets is not installed (pip install tensorflow-datasets). "
                    + _local_hint(name)) from None
  builder = tfds.builder(name, data_dir=tfds_data_dir)
  where = f"tfds:{builder.info.full_name} in {builder.data_dir}"
  if not builder.is_prepared():
    _check_tfds_can_prepare(name, network_timeout)
    try:
      builder.download_and_prepare(file_format="array_record")
    except Exception as e:
      raise DataError(f"{where}: tensorflow-datasets failed to download or prepare {name} "
                      f"({type(e).__name__}: {e}). " + _local_hint(name)) from e
  tfds_names = tuple(builder.info.features["label"].names)
  # Without prepared metadata (tfds's mock data) the names are "0".."9".
  if tfds_names not in (_formats.CLASS_NAMES[name], MNIST_CLASSES):
    raise DataError(f"{where}: label names {tfds_names} differ from the expected "
                    f"{_formats.CLASS_NAMES[name]}")
  shape = _formats.IMAGE_SHAPES[name]
  arrays: dict[str, np.ndarray] = {}
  for split in ("train", "test"):
    try:
      data_source = builder.as_data_source(split=split)
    except (NotImplementedError, ValueError) as e:
      # Prepared earlier by tfds.load in a format without random access.
      if importlib.util.find_spec("tensorflow") is None:
        raise DataError(f"{where}: cannot read the prepared {split} split without TensorFlow "
                        f"({e}). " + _local_hint(name)) from e
      images, labels = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1,
                                                        as_supervised=True))
      images, labels = np.asarray(images, np.uint8), np.asarray(labels, np.int32)
    else:
      images, labels = _data_source_arrays(data_source, shape, f"{where} ({split})")
    arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
  _check_arrays(name, arrays, where)
  return _make_dataset(name, arrays, "tfds", where, from_cache=False)


# --------------------------------------------------------------------------- preprocessing


def normalize(images: Any, *, dataset: str | None = None, mean: Any = None,
              std: Any = None) -> jax.Array:
  r"""Scales pixels to ``[0, 1]`` and standardises each channel.

  .. math::
    x'_{\ldots c} = \frac{x_{\ldots c} / 255 - \mu_c}{\sigma_c}

  Args:
    images: ``[..., C]`` pixel values in ``[0, 255]`` (uint8 or float).
    dataset: ``"mnist"`` or ``"cifar10"``: use :data:`NORMALIZATION`.
    mean: per-channel means ``[C]`` of pixel/255 (instead of ``dataset``).
    std: per-channel standard deviations ``[C]``, positive.

  Returns:
    float32 array of the shape of ``images``. Works under ``jax.jit`` (with
    ``dataset``/``mean``/``std`` static).

  Examples:
    >>> import numpy as np
    >>> x = np.array([0, 255], np.uint8).reshape(1, 2, 1, 1)
    >>> print(np.round(np.asarray(normalize(x, dataset="mnist")).ravel(), 4))
    [-0.4242  2.8215]
  """
  if dataset is not None:
    if mean is not None or std is not None:
      raise ValueError("pass either dataset= or mean= and std=, not both")
    mean, std = NORMALIZATION[_canonical_name(dataset)]
  elif mean is None or std is None:
    raise ValueError("normalize needs dataset= ('mnist' or 'cifar10') or both mean= and std=")
  mean = np.asarray(mean, np.float32).reshape(-1)
  std = np.asarray(std, np.float32).reshape(-1)
  if mean.shape != std.shape or not np.all(std > 0) or not np.all(np.isfinite(mean)):
    raise ValueError(f"mean and std must be finite per-channel vectors of one length with "
                     f"std > 0, got mean={mean.tolist()} std={std.tolist()}")
  images = jnp.asarray(images)
  if images.ndim < 1 or images.shape[-1] != mean.shape[0]:
    raise ValueError(f"images must end in a channel axis of size {mean.shape[0]}, "
                     f"got shape {images.shape}")
  scaled = images.astype(jnp.float32) / jnp.float32(255.0)
  return (scaled - mean) / std


def _augment_image(key: jax.Array, image: jax.Array, *, padding: int,
                   flip: bool) -> jax.Array:
  height, width, channels = image.shape
  crop_key, flip_key = jax.random.split(key)
  padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  offsets = jax.random.randint(crop_key, (2,), 0, 2 * padding + 1)
  out = jax.lax.dynamic_slice(padded, (offsets[0], offsets[1], 0), (height, width, channels))
  if flip:
    out = jnp.where(jax.random.bernoulli(flip_key), out[:, ::-1, :], out)
  return out


@functools.partial(jax.jit, static_argnames=("padding", "flip"))
def augment(key: jax.Array, images: jax.Array, *, padding: int = 4,
            flip: bool = True) -> jax.Array:
  r"""Random crop with zero padding and random horizontal flip, one key per image.

  Each image is padded with ``padding`` zero pixels on every side, a window of
  the original size is cut at a uniformly random offset in
  :math:`\{0, \ldots, 2p\}^2`, and with probability 1/2 it is mirrored left to
  right (the standard CIFAR-10 augmentation for ``padding=4``). Apply it to
  uint8 images before :func:`normalize` so that the padding is black. The
  per-image function is vmapped over ``jax.random.split(key, N)``, so the
  result depends only on ``key`` and the batch.

  Args:
    key: a PRNG key.
    images: ``[N, H, W, C]`` images, any dtype.
    padding: pixels of zero padding on each side (static).
    flip: whether to flip horizontally with probability 1/2 (static).

  Returns:
    ``[N, H, W, C]`` augmented images, same dtype as ``images``.

  Examples:
    >>> import jax, numpy as np
    >>> x = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    >>> y = augment(jax.random.key(0), x, padding=1)
    >>> print(y.shape, y.dtype)
    (2, 4, 4, 3) uint8
  """
  if images.ndim != 4:
    raise ValueError(f"images must have shape [N, H, W, C], got {images.shape}")
  if padding < 0:
    raise ValueError(f"padding must be >= 0, got {padding}")
  keys = jax.random.split(key, images.shape[0])
  one = functools.partial(_augment_image, padding=padding, flip=flip)
  return jax.vmap(one)(keys, images)


# --------------------------------------------------------------------------- batching


def num_batches(num_examples: int, *, batch_size: int, drop_remainder: bool = False) -> int:
  """Number of batches :func:`iterate_batches` yields per epoch.

  Examples:
    >>> num_batches(10, batch_size=4), num_batches(10, batch_size=4, drop_remainder=True)
    (3, 2)
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if drop_remainder:
    return num_examples // batch_size
  return -(-num_examples // batch_size)


def epoch_permutation(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
  """The order of examples in epoch ``epoch``: a permutation seeded by ``(seed, epoch)``.

  Independent of earlier epochs, so a resumed run reproduces it exactly.

  Examples:
    >>> p = epoch_permutation(5, seed=0, epoch=0)
    >>> sorted(p.tolist()), p.tolist() == epoch_permutation(5, seed=0, epoch=0).tolist()
    ([0, 1, 2, 3, 4], True)
  """
  if seed < 0 or epoch < 0:
    raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def iterate_batches(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_remainder: bool = False,
    start_batch: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields ``(images, labels)`` batches of one epoch in a seeded order.

  The order is :func:`epoch_permutation` ``(N, seed=seed, epoch=epoch)`` (or
  the stored order when ``shuffle=False``). ``start_batch=k`` skips the first
  ``k`` batches without touching them, for resuming mid-epoch.

  Args:
    images: ``[N, ...]`` array.
    labels: ``[N]`` array.
    batch_size: examples per batch.
    seed: shuffling seed.
    epoch: epoch index (each epoch has its own order).
    shuffle: shuffle, or keep the stored order.
    drop_remainder: drop the last, smaller batch.
    start_batch: index of the first batch to yield.

  Returns:
    An iterator over ``(images[idx], labels[idx])`` NumPy batches.

  Examples:
    >>> import numpy as np
    >>> x, y = np.zeros((10, 2, 2, 1), np.uint8), np.arange(10)
    >>> [b[0].shape[0] for b in iterate_batches(x, y, batch_size=4, seed=1)]
    [4, 4, 2]
  """
  count = len(images)
  if len(labels) != count:
    raise ValueError(f"images and labels differ in length: {count} and {len(labels)}")
  total = num_batches(count, batch_size=batch_size, drop_remainder=drop_remainder)
  if start_batch < 0:
    raise ValueError(f"start_batch must be >= 0, got {start_batch}")
  order = epoch_permutation(count, seed=seed, epoch=epoch) if shuffle else np.arange(count)

  def generate() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for b in range(start_batch, total):
      idx = order[b * batch_size:(b + 1) * batch_size]
      yield images[idx], labels[idx]

  return generate()


def gather_batch(images: jax.Array, labels: jax.Array, order: jax.Array, batch: jax.Array, *,
                 batch_size: int, sharding: Any = None) -> tuple[jax.Array, jax.Array]:
  """Batch ``batch`` of an epoch, gathered where the data lives (inside ``jit``).

  The same examples as the ``batch``-th item of :func:`iterate_batches`
  ``(images, labels, batch_size=batch_size, drop_remainder=True)`` in the
  order ``order``: ``images[order[batch * batch_size:(batch + 1) * batch_size]]``.
  With the split kept on the device, a training step's only host input is
  the batch index: no host batch arrays and no copies per step.

  Args:
    images: ``[N, ...]`` array (on the device).
    labels: ``[N]`` array.
    order: ``[N]`` int32 permutation of the epoch (:func:`epoch_permutation`).
    batch: scalar int32 index of the batch in the epoch (may be traced), in
      ``[0, N // batch_size)``.
    batch_size: examples per batch (static).
    sharding: optional sharding of the batch (a ``NamedSharding`` splitting
      its leading axis over devices): the indices are laid out so, and each
      device gathers its part of the batch from its copy of the data.

  Returns:
    ``(images[idx], labels[idx])`` of leading size ``batch_size``.

  Examples:
    >>> import numpy as np
    >>> x, y = np.arange(10).reshape(10, 1), np.arange(10)
    >>> order = epoch_permutation(10, seed=1, epoch=0)
    >>> _, host = list(iterate_batches(x, y, batch_size=4, seed=1, drop_remainder=True))[1]
    >>> _, device = gather_batch(x, y, order.astype(np.int32), 1, batch_size=4)
    >>> bool((np.asarray(device) == host).all())
    True
  """
  idx = jax.lax.dynamic_slice_in_dim(jnp.asarray(order), jnp.asarray(batch) * batch_size,
                                     batch_size)
  if sharding is not None:
    idx = jax.lax.with_sharding_constraint(idx, sharding)
  return (jnp.take(jnp.asarray(images), idx, axis=0, mode="clip"),
          jnp.take(jnp.asarray(labels), idx, axis=0, mode="clip"))
