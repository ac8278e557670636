"""Tests for cwsa_jax.training.data: local formats, cache, tfds path, preprocessing, batches.

Fixture files of every format are written here with code that shares nothing
with the loaders (struct/gzip/pickle/tarfile/Pillow directly). The real copies
in shared/data are tested only when $CWSA_JAX_DATA_DIR points at them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import pickle
import re
import socket
import struct
import tarfile
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cwsa_jax.training import _formats
from cwsa_jax.training import data
from cwsa_jax.training.data import CIFAR10_CLASSES
from cwsa_jax.training.data import DataError
from cwsa_jax.training.data import DataFileNotFoundError
from cwsa_jax.training.data import load_dataset

MNIST_MD5 = {  # shared/data/README.md, md5 of the uncompressed bytes
    "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}
REAL_DATA_DIR = os.environ.get("CWSA_JAX_DATA_DIR")
needs_real_data = pytest.mark.skipif(
    not REAL_DATA_DIR, reason="CWSA_JAX_DATA_DIR is unset (point it at a folder holding mnist/ "
    "and cifar10/, e.g. ../shared/data, to test the real copies)")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
  """No test may read the real data dir by accident or write to the user's cache."""
  monkeypatch.delenv("CWSA_JAX_DATA_DIR", raising=False)
  monkeypatch.setenv("CWSA_JAX_CACHE", str(tmp_path / "default-cache"))


# --------------------------------------------------------------------------- fixture writers


def idx_bytes(array: np.ndarray, *, magic_type: int = 0x08) -> bytes:
  header = struct.pack(">BBBB", 0, 0, magic_type, array.ndim)
  header += b"".join(struct.pack(">I", d) for d in array.shape)
  return header + array.astype(np.uint8).tobytes()


def make_mnist(directory: pathlib.Path, *, gz: bool, seed: int = 0, n_train: int = 12,
               n_test: int = 5, dotted: bool = False) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  arrays = {
      "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
      "train_labels": rng.integers(0, 10, n_train).astype(np.uint8),
      "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
      "test_labels": rng.integers(0, 10, n_test).astype(np.uint8),
  }
  directory.mkdir(parents=True, exist_ok=True)
  for key, array in arrays.items():
    write_idx(directory / mnist_name(key, gz=gz, dotted=dotted), array, gz=gz)
  return arrays


def mnist_name(key: str, *, gz: bool, dotted: bool = False) -> str:
  split, kind = key.split("_")
  prefix = "train" if split == "train" else "t10k"
  ndim = 3 if kind == "images" else 1
  sep = "." if dotted else "-"
  return f"{prefix}-{kind}{sep}idx{ndim}-ubyte" + (".gz" if gz else "")


def write_idx(path: pathlib.Path, array: np.ndarray, *, gz: bool) -> None:
  raw = idx_bytes(array)
  path.write_bytes(gzip.compress(raw) if gz else raw)


def random_images(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def make_image_folder(root: pathlib.Path, *, per_class=(2, 1), ext: str = "png",
                      seed: int = 0) -> dict[str, np.ndarray]:
  """train/<class>/NNNN.<ext>; returns the expected arrays in (class, file name) order."""
  out = {}
  for s, (split, count) in enumerate(zip(("train", "test"), per_class)):
    images = random_images(10 * count, seed + s)
    labels = np.repeat(np.arange(10), count).astype(np.int32)
    for i, (image, label) in enumerate(zip(images, labels)):
      folder = root / split / CIFAR10_CLASSES[label]
      folder.mkdir(parents=True, exist_ok=True)
      Image.fromarray(image).save(folder / f"{i:04d}.{ext}")
    out[f"{split}_images"], out[f"{split}_labels"] = images, labels
  return out


def tar_directory(source: pathlib.Path, archive: pathlib.Path, *, arcname: str = "") -> None:
  """Archives ``source`` with its members in a random order (as in the real CIFAR tar)."""
  paths = sorted(source.rglob("*"))
  order = np.random.default_rng(len(paths)).permutation(len(paths))
  with tarfile.open(archive, "w:gz") as tar:
    for path in (paths[i] for i in order):
      name = path.relative_to(source).as_posix()
      tar.add(path, arcname=f"{arcname}/{name}" if arcname else name, recursive=False)


def cifar_row(image: np.ndarray) -> np.ndarray:
  """The official row layout, written element by element: index c*1024 + y*32 + x."""
  row = np.empty(3072, np.uint8)
  for c in range(3):
    for y in range(32):
      row[c * 1024 + y * 32: c * 1024 + y * 32 + 32] = image[y, :, c]
  return row


def cifar_batches(seed: int = 0, per_batch: int = 2, n_test: int = 3):
  rng = np.random.default_rng(seed)
  names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
  batches = {}
  for name in names:
    n = n_test if name == "test_batch" else per_batch
    batches[name] = (random_images(n, int(rng.integers(1 << 30))),
                     rng.integers(0, 10, n).astype(np.int64))
  expected = {
      "train_images": np.concatenate([batches[n][0] for n in names[:5]]),
      "train_labels": np.concatenate([batches[n][1] for n in names[:5]]).astype(np.int32),
      "test_images": batches["test_batch"][0],
      "test_labels": batches["test_batch"][1].astype(np.int32),
  }
  return batches, expected


def python_batch_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
  """Like the official Python-2 pickles: bytes keys, protocol 2, numpy.core globals."""
  rows = np.stack([cifar_row(im) for im in images])
  batch = {b"batch_label": b"fixture", b"labels": [int(v) for v in labels], b"data": rows,
           b"filenames": [b"x.png"] * len(labels)}
  raw = pickle.dumps(batch, protocol=2)
  return raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def binary_batch_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
  records = [bytes([int(label)]) + cifar_row(im).tobytes() for im, label in zip(images, labels)]
  return b"".join(records)


def make_cifar_python(directory: pathlib.Path, *, seed: int = 0):
  batches, expected = cifar_batches(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for name, (images, labels) in batches.items():
    (directory / name).write_bytes(python_batch_bytes(images, labels))
  (directory / "batches.meta").write_bytes(pickle.dumps({b"label_names": []}, protocol=2))
  return expected


def make_cifar_binary(directory: pathlib.Path, *, seed: int = 0):
  batches, expected = cifar_batches(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for name, (images, labels) in batches.items():
    (directory / f"{name}.bin").write_bytes(binary_batch_bytes(images, labels))
  return expected


def assert_same(ds: data.Dataset, expected: dict[str, np.ndarray]) -> None:
  for key in ("train_images", "train_labels", "test_images", "test_labels"):
    got, want = getattr(ds, key), np.asarray(expected[key])
    if key.endswith("images") and want.ndim == 3:
      want = want[..., None]
    assert got.shape == want.shape, key
    np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=key)
  assert ds.train_images.dtype == np.uint8 and ds.test_images.dtype == np.uint8
  assert ds.train_labels.dtype == np.int32 and ds.test_labels.dtype == np.int32


# --------------------------------------------------------------------------- MNIST IDX


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx(tmp_path, gz):
  expected = make_mnist(tmp_path / "mnist", gz=gz)
  ds = load_dataset("mnist", data_dir=tmp_path / "mnist", cache=False)
  assert_same(ds, expected)
  assert ds.train_images.shape == (12, 28, 28, 1)
  assert ds.format == ("idx.gz" if gz else "idx")
  assert str(tmp_path / "mnist") in ds.source
  assert ds.class_names == tuple("0123456789") and ds.num_classes == 10
  assert ds.image_shape == (28, 28, 1) and not ds.from_cache


def test_mnist_found_from_parent_and_dotted_names(tmp_path):
  expected = make_mnist(tmp_path / "parent" / "mnist", gz=False, dotted=True)
  ds = load_dataset("MNIST", data_dir=tmp_path / "parent", cache=False)
  assert_same(ds, expected)


def test_mnist_from_environment_variable(tmp_path, monkeypatch):
  expected = make_mnist(tmp_path / "mnist", gz=True)
  monkeypatch.setenv("CWSA_JAX_DATA_DIR", str(tmp_path))
  ds = load_dataset("mnist", cache=False)
  assert_same(ds, expected)


def _corrupt(path: pathlib.Path, transform) -> None:
  path.write_bytes(transform(path.read_bytes()))


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("case", ["magic", "labels_magic", "truncated", "trailing", "size",
                                  "count", "label_range"])
def test_mnist_corrupt_files_name_the_file(tmp_path, gz, case):
  make_mnist(tmp_path, gz=gz)
  images = tmp_path / mnist_name("train_images", gz=gz)
  labels = tmp_path / mnist_name("train_labels", gz=gz)
  rng = np.random.default_rng(1)
  target, pattern = images, None
  if case == "magic":  # an images file with the labels' magic number
    write_idx(images, rng.integers(0, 256, 12 * 28 * 28, dtype=np.uint8), gz=gz)
    pattern = "wrong magic number 0x00000801"
  elif case == "labels_magic":  # the images file where the labels belong
    write_idx(labels, rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), gz=gz)
    target, pattern = labels, "wrong magic number 0x00000803"
  elif case == "truncated":
    raw = idx_bytes(rng.integers(0, 256, (12, 28, 28), dtype=np.uint8))[:-100]
    images.write_bytes(gzip.compress(raw) if gz else raw)
    pattern = "truncated"
  elif case == "trailing":
    raw = idx_bytes(rng.integers(0, 256, (12, 28, 28), dtype=np.uint8)) + b"\0" * 7
    images.write_bytes(gzip.compress(raw) if gz else raw)
    pattern = "7 unexpected bytes"
  elif case == "size":
    write_idx(images, rng.integers(0, 256, (12, 32, 32), dtype=np.uint8), gz=gz)
    pattern = "items are 32x32, expected 28x28"
  elif case == "count":
    write_idx(labels, rng.integers(0, 10, 11).astype(np.uint8), gz=gz)
    target, pattern = labels, "11 labels but"
  elif case == "label_range":
    write_idx(labels, np.full(12, 10, np.uint8), gz=gz)
    target, pattern = labels, r"labels must lie in 0\.\.9"
  with pytest.raises(DataError, match=pattern) as info:
    load_dataset("mnist", data_dir=tmp_path, cache=False)
  assert str(target) in str(info.value)
  assert isinstance(info.value, ValueError)


def test_mnist_truncated_and_fake_gzip(tmp_path):
  make_mnist(tmp_path, gz=True)
  images = tmp_path / mnist_name("test_images", gz=True)
  _corrupt(images, lambda raw: raw[: len(raw) // 2])
  with pytest.raises(DataError, match=re.escape(str(images)) + ".*gzip data is truncated"):
    load_dataset("mnist", data_dir=tmp_path, cache=False)
  images.write_bytes(idx_bytes(np.zeros((5, 28, 28), np.uint8))[:3])  # not gzip, named .gz
  with pytest.raises(DataError, match=re.escape(str(images)) + ".*not gzip data"):
    load_dataset("mnist", data_dir=tmp_path, cache=False)


def test_mnist_tiny_or_empty_file(tmp_path):
  make_mnist(tmp_path, gz=False)
  labels = tmp_path / mnist_name("test_labels", gz=False)
  labels.write_bytes(b"\0\0")
  with pytest.raises(DataError, match=re.escape(str(labels)) + ".*truncated"):
    load_dataset("mnist", data_dir=tmp_path, cache=False)


def test_mnist_missing_file(tmp_path):
  make_mnist(tmp_path, gz=True)
  (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
  with pytest.raises(DataFileNotFoundError, match="t10k-labels-idx1-ubyte") as info:
    load_dataset("mnist", data_dir=tmp_path, cache=False)
  assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


def test_missing_or_empty_data_dir(tmp_path):
  with pytest.raises(DataFileNotFoundError, match="nowhere.*not found"):
    load_dataset("mnist", data_dir=tmp_path / "nowhere")
  with pytest.raises(DataFileNotFoundError, match="no mnist data found.*IDX"):
    load_dataset("mnist", data_dir=tmp_path)
  with pytest.raises(DataFileNotFoundError, match="no cifar10 data found.*python"):
    load_dataset("cifar10", data_dir=tmp_path)


def test_bad_names_and_options(tmp_path):
  with pytest.raises(ValueError, match="unknown dataset 'fashion'; valid names: cifar10, mnist"):
    load_dataset("fashion", data_dir=tmp_path)
  with pytest.raises(ValueError, match="unknown source 'web'; valid sources: auto, local, tfds"):
    load_dataset("mnist", source="web")
  with pytest.raises(ValueError, match="needs data_dir="):
    load_dataset("mnist", source="local")
  with pytest.raises(ValueError, match="with source='tfds' pass tfds_data_dir="):
    load_dataset("mnist", source="tfds", data_dir=tmp_path)
  assert data._canonical_name("CIFAR-10") == "cifar10"


# --------------------------------------------------------------------------- CIFAR-10 formats


@pytest.mark.parametrize("layout", ["dir", "tar", "tar-prefix", "archive-path"])
def test_cifar_image_folder(tmp_path, layout):
  expected = make_image_folder(tmp_path / "images")
  if layout == "dir":
    data_dir, fmt = tmp_path / "images", "image-folder"
  else:
    (tmp_path / "cifar10").mkdir()
    archive = tmp_path / "cifar10" / "cifar10-jpg.tar.gz"
    tar_directory(tmp_path / "images", archive, arcname="cifar10-png" if layout == "tar-prefix"
                  else "")
    data_dir = archive if layout == "archive-path" else tmp_path
    fmt = "image-folder-tar"
  ds = load_dataset("cifar10", data_dir=data_dir, cache=False, num_workers=0)
  assert ds.format == fmt and ds.class_names == CIFAR10_CLASSES
  assert_same(ds, expected)


def test_cifar_jpeg_and_grayscale_png_decode_like_pillow(tmp_path):
  make_image_folder(tmp_path, ext="jpg")
  gray = np.random.default_rng(3).integers(0, 256, (32, 32), dtype=np.uint8)
  Image.fromarray(gray).save(tmp_path / "test" / "truck" / "9999.png")
  ds = load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=0)
  first = np.asarray(Image.open(tmp_path / "train" / "airplane" / "0000.jpg").convert("RGB"))
  np.testing.assert_array_equal(ds.train_images[0], first)
  np.testing.assert_array_equal(ds.test_images[-1], np.repeat(gray[..., None], 3, axis=-1))
  assert ds.test_labels[-1] == 9 and ds.test_images.shape == (11, 32, 32, 3)


def test_cifar_parallel_decode_matches_serial(tmp_path, monkeypatch):
  make_image_folder(tmp_path, per_class=(3, 1))
  serial = load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=0)
  monkeypatch.setattr(_formats, "_PARALLEL_MIN_ITEMS", 1)
  calls = []
  original = _formats._decode_in_subprocess
  monkeypatch.setattr(_formats, "_decode_in_subprocess",
                      lambda items, shape: calls.append(len(items)) or original(items, shape))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no silent fallback to serial decoding
    parallel = load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=2)
  assert sorted(calls) == [20, 20]
  for a, b in zip(serial[:4], parallel[:4]):
    np.testing.assert_array_equal(a, b)
  # An error inside a worker still names the file.
  bad = tmp_path / "train" / "cat" / "0007.png"
  bad.write_bytes(b"not an image")
  with pytest.raises(DataError, match=re.escape(str(bad)) + ".*cannot decode"):
    load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=2)


@pytest.mark.parametrize("layout", ["dir", "dir-parent", "tar"])
def test_cifar_python_batches(tmp_path, layout):
  folder = tmp_path / "cifar10" / "cifar-10-batches-py"
  expected = make_cifar_python(folder)
  if layout == "tar":
    archive = tmp_path / "cifar-10-python.tar.gz"
    tar_directory(folder.parent, archive)
    data_dir, fmt = archive, "python-tar"
  else:
    data_dir = folder if layout == "dir" else tmp_path
    fmt = "python-batches"
  ds = load_dataset("cifar10", data_dir=data_dir, cache=False)
  assert ds.format == fmt
  assert ds.train_images.shape == (10, 32, 32, 3) and ds.test_images.shape == (3, 32, 32, 3)
  assert_same(ds, expected)


@pytest.mark.parametrize("layout", ["dir", "tar"])
def test_cifar_binary_batches(tmp_path, layout):
  folder = tmp_path / "src" / "cifar-10-batches-bin"
  expected = make_cifar_binary(folder)
  if layout == "tar":
    tar_directory(folder.parent, tmp_path / "cifar-10-binary.tar.gz")
    data_dir, fmt = tmp_path / "cifar-10-binary.tar.gz", "binary-tar"
  else:
    data_dir, fmt = tmp_path / "src", "binary-batches"
  ds = load_dataset("cifar10", data_dir=data_dir, cache=False)
  assert ds.format == fmt
  assert_same(ds, expected)


def test_cifar_unknown_class_folder(tmp_path):
  make_image_folder(tmp_path)
  (tmp_path / "train" / "cats").mkdir()
  Image.fromarray(random_images(1, 9)[0]).save(tmp_path / "train" / "cats" / "0.png")
  with pytest.raises(DataError, match=re.escape(str(tmp_path / "train" / "cats")) +
                     ".*unknown class folder 'cats'.*airplane, automobile"):
    load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=0)
  archive = tmp_path / "x.tar.gz"
  tar_directory(tmp_path, archive)
  with pytest.raises(DataError, match=re.escape(f"{archive}:train/cats/0.png") +
                     ".*unknown class folder 'cats'"):
    load_dataset("cifar10", data_dir=archive, cache=False, num_workers=0)


def test_cifar_missing_class_folder(tmp_path):
  make_image_folder(tmp_path)
  for f in (tmp_path / "test" / "ship").iterdir():
    f.unlink()
  (tmp_path / "test" / "ship").rmdir()
  with pytest.raises(DataFileNotFoundError, match=r"test/ lacks class folder\(s\) ship"):
    load_dataset("cifar10", data_dir=tmp_path, cache=False, num_workers=0)


@pytest.mark.parametrize("case", ["size", "garbage", "truncated"])
@pytest.mark.parametrize("archived", [False, True])
def test_cifar_bad_image_names_the_file(tmp_path, case, archived):
  root = tmp_path / "images"
  make_image_folder(root, ext="jpg")
  bad = root / "train" / "dog" / "0011.jpg"
  if case == "size":
    Image.fromarray(np.zeros((30, 32, 3), np.uint8)).save(bad)
    pattern = "image is 32x30, expected 32x32"
  elif case == "garbage":
    bad.write_bytes(b"this is not a JPEG")
    pattern = "cannot decode image"
  else:
    _corrupt(bad, lambda raw: raw[: len(raw) // 2])
    pattern = "cannot decode image"
  where = str(bad)
  data_dir = root
  if archived:
    data_dir = tmp_path / "c.tgz"
    tar_directory(root, data_dir)
    where = f"{data_dir}:train/dog/0011.jpg"
  with pytest.raises(DataError, match=re.escape(where) + ".*" + pattern):
    load_dataset("cifar10", data_dir=data_dir, cache=False, num_workers=0)


def test_cifar_truncated_archive(tmp_path):
  make_image_folder(tmp_path / "images")
  archive = tmp_path / "c.tar.gz"
  tar_directory(tmp_path / "images", archive)
  _corrupt(archive, lambda raw: raw[: len(raw) - 300])
  with pytest.raises(DataError, match=re.escape(str(archive)) + ".*corrupt or truncated"):
    load_dataset("cifar10", data_dir=archive, cache=False, num_workers=0)


@pytest.mark.parametrize("case", ["truncated", "shape", "missing", "not_a_pickle", "evil"])
def test_cifar_python_bad_batches(tmp_path, case):
  make_cifar_python(tmp_path)
  target = tmp_path / "data_batch_3"
  cls = DataError
  if case == "truncated":
    _corrupt(target, lambda raw: raw[:-500])
    pattern = "truncated"
  elif case == "shape":
    target.write_bytes(pickle.dumps({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]},
                                    protocol=2))
    pattern = r"expected uint8 \[N, 3072\]"
  elif case == "missing":
    target.unlink()
    cls, pattern = DataFileNotFoundError, "file not found"
  elif case == "not_a_pickle":
    target.write_bytes(b"\x00" * 3073)
    pattern = "not a CIFAR-10 python batch"
  else:  # a pickle that would run a shell command if unpickled naively
    target.write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    pattern = "refusing to load os.system"
  with pytest.raises(cls, match=re.escape(str(target)) + ".*" + pattern):
    load_dataset("cifar10", data_dir=tmp_path, cache=False)


def test_cifar_binary_truncated_and_archive_missing_batch(tmp_path):
  folder = tmp_path / "cifar-10-batches-bin"
  make_cifar_binary(folder)
  target = folder / "test_batch.bin"
  _corrupt(target, lambda raw: raw[:-10])
  with pytest.raises(DataError, match=re.escape(str(target)) + ".*not a whole number"):
    load_dataset("cifar10", data_dir=tmp_path, cache=False)
  target.unlink()
  archive = tmp_path / "cifar-10-binary.tar.gz"
  tar_directory(folder, archive, arcname="cifar-10-batches-bin")
  with pytest.raises(DataFileNotFoundError, match=re.escape(str(archive)) + ".*test_batch.bin"):
    load_dataset("cifar10", data_dir=archive, cache=False)


# --------------------------------------------------------------------------- cache


def _npz_files(directory: pathlib.Path) -> list[pathlib.Path]:
  return sorted(directory.glob("*.npz")) if directory.exists() else []


def test_cache_hit_and_invalidation_mnist(tmp_path):
  expected = make_mnist(tmp_path / "data", gz=True)
  before = sorted(p.name for p in (tmp_path / "data").iterdir())
  cache = tmp_path / "cache"
  first = load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache)
  second = load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache)
  assert not first.from_cache and second.from_cache
  assert_same(second, expected)
  assert second.source == first.source and second.format == "idx.gz"
  assert len(_npz_files(cache)) == 1 and not list(cache.glob("*.tmp"))
  assert sorted(p.name for p in (tmp_path / "data").iterdir()) == before  # data dir untouched
  # A changed source file (new contents, new mtime) invalidates the cache.
  changed = make_mnist(tmp_path / "data", gz=True, seed=5)
  future = time.time() + 100
  for p in (tmp_path / "data").iterdir():
    os.utime(p, (future, future))
  third = load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache)
  assert not third.from_cache
  assert_same(third, changed)
  assert len(_npz_files(cache)) == 1  # the stale entry was removed
  assert load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache).from_cache


def test_cache_invalidation_image_folder(tmp_path):
  make_image_folder(tmp_path / "data")
  cache = tmp_path / "cache"
  load_dataset("cifar10", data_dir=tmp_path / "data", cache_dir=cache, num_workers=0)
  assert load_dataset("cifar10", data_dir=tmp_path / "data", cache_dir=cache).from_cache
  target = tmp_path / "data" / "test" / "frog" / "0006.png"
  Image.fromarray(np.full((32, 32, 3), 7, np.uint8)).save(target)
  os.utime(target, (time.time() + 100,) * 2)
  ds = load_dataset("cifar10", data_dir=tmp_path / "data", cache_dir=cache, num_workers=0)
  assert not ds.from_cache
  assert np.all(ds.test_images[6] == 7) and ds.test_labels[6] == 6


def test_cache_invalidation_python_batches(tmp_path):
  folder = tmp_path / "cifar-10-batches-py"
  make_cifar_python(folder)
  cache = tmp_path / "cache"
  load_dataset("cifar10", data_dir=tmp_path, cache_dir=cache)
  assert load_dataset("cifar10", data_dir=tmp_path, cache_dir=cache).from_cache
  changed = make_cifar_python(folder, seed=9)  # rewritten in place: the folder's mtime may not move
  for p in folder.iterdir():
    os.utime(p, (time.time() + 100,) * 2)
  ds = load_dataset("cifar10", data_dir=tmp_path, cache_dir=cache)
  assert not ds.from_cache
  assert_same(ds, changed)


def test_cache_default_location_and_disabled(tmp_path, monkeypatch):
  make_mnist(tmp_path / "data", gz=False)
  load_dataset("mnist", data_dir=tmp_path / "data")
  assert len(_npz_files(tmp_path / "default-cache")) == 1  # $CWSA_JAX_CACHE (autouse fixture)
  monkeypatch.setenv("CWSA_JAX_CACHE", str(tmp_path / "other"))
  assert data.default_cache_dir() == tmp_path / "other"
  load_dataset("mnist", data_dir=tmp_path / "data", cache=False)
  assert not (tmp_path / "other").exists()


def test_corrupt_cache_is_rebuilt(tmp_path):
  expected = make_mnist(tmp_path / "data", gz=False)
  cache = tmp_path / "cache"
  load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache)
  (entry,) = _npz_files(cache)
  entry.write_bytes(b"PK\x03\x04 garbage")
  with pytest.warns(UserWarning, match="ignoring unreadable cache file"):
    ds = load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache)
  assert not ds.from_cache
  assert_same(ds, expected)
  assert load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=cache).from_cache


def test_unwritable_cache_warns_and_still_loads(tmp_path):
  expected = make_mnist(tmp_path / "data", gz=False)
  blocker = tmp_path / "a-file"
  blocker.write_text("not a directory")
  with pytest.warns(UserWarning, match="could not write the dataset cache"):
    ds = load_dataset("mnist", data_dir=tmp_path / "data", cache_dir=blocker / "cache")
  assert_same(ds, expected)


# --------------------------------------------------------------------------- tensorflow-datasets


@pytest.fixture
def no_proxy_env(monkeypatch):
  for key in list(os.environ):
    if key.lower().endswith("_proxy"):
      monkeypatch.delenv(key)


@pytest.mark.parametrize("name,shape", [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
def test_tfds_path_with_mock_data(tmp_path, monkeypatch, name, shape):
  tfds = pytest.importorskip("tensorflow_datasets")
  checked = []
  # The mock replaces download_and_prepare; the pre-download checks (network,
  # TensorFlow) are exercised by the tests below.
  monkeypatch.setattr(data, "_check_tfds_can_prepare", lambda n, timeout: checked.append(n))
  with tfds.testing.mock_data(num_examples=7):
    ds = load_dataset(name, source="tfds", tfds_data_dir=tmp_path)
  assert checked == [name]
  assert ds.format == "tfds" and ds.source.startswith(f"tfds:{name}/")
  assert ds.class_names == _formats.CLASS_NAMES[name]
  for images, labels in ((ds.train_images, ds.train_labels), (ds.test_images, ds.test_labels)):
    assert images.shape == (7, *shape) and images.dtype == np.uint8
    assert labels.shape == (7,) and labels.dtype == np.int32
    assert labels.min() >= 0 and labels.max() < 10
  assert ds.train_images.std() > 0  # random mock pixels, not a zero-filled buffer


@pytest.mark.parametrize("host", ["192.0.2.1", "cwsa-jax-test.invalid"])
def test_tfds_unreachable_host_fails_fast_with_hint(tmp_path, monkeypatch, no_proxy_env, host):
  pytest.importorskip("tensorflow_datasets")
  # 192.0.2.1 (TEST-NET-1) never answers; .invalid never resolves: the outcome
  # is the same with or without network access.
  monkeypatch.setitem(data.DOWNLOAD_HOSTS, "mnist", (host, 443))
  start = time.monotonic()
  with pytest.raises(DataError) as info:
    load_dataset("mnist", source="tfds", tfds_data_dir=tmp_path, network_timeout=2.0)
  elapsed = time.monotonic() - start
  message = str(info.value)
  assert elapsed < 20, elapsed
  assert f"{host}:443 is unreachable" in message
  assert "data_dir=" in message and "--data-dir" in message and "CWSA_JAX_DATA_DIR" in message
  assert not any((tmp_path / "downloads").glob("*"))


def test_tfds_real_hosts_fail_fast_offline(tmp_path, no_proxy_env):
  """The unpatched path in an offline sandbox: seconds, not tfds's ~3 minutes of retries."""
  pytest.importorskip("tensorflow_datasets")
  import importlib.util  # pylint: disable=import-outside-toplevel
  online = data._probe(*data.DOWNLOAD_HOSTS["cifar10"], 3.0) is None
  if online and importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("network and TensorFlow available: tfds would really download CIFAR-10")
  start = time.monotonic()
  with pytest.raises(DataError, match="unreachable|TensorFlow is not installed") as info:
    load_dataset("cifar10", tfds_data_dir=tmp_path, network_timeout=3.0)  # auto -> tfds
  assert time.monotonic() - start < 20
  assert "data_dir=PATH" in str(info.value)


def test_probe_bounds_a_hanging_lookup(monkeypatch):
  release = threading.Event()

  def hang(*args, **kwargs):
    release.wait(30)
    raise OSError("released by the test")

  monkeypatch.setattr(socket, "create_connection", hang)
  start = time.monotonic()
  try:
    assert data._probe("example.org", 443, 0.3) == "no answer within 0.3 s"
    assert time.monotonic() - start < 5
  finally:
    release.set()


def test_probe_goes_through_https_proxy(monkeypatch, no_proxy_env):
  monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
  assert data._download_endpoint("mnist") == ("proxy.internal", 3128)
  monkeypatch.delenv("https_proxy")
  assert data._download_endpoint("mnist") == data.DOWNLOAD_HOSTS["mnist"]


def test_tfds_missing_tensorflow_is_reported(tmp_path, monkeypatch):
  monkeypatch.setattr(data, "_probe", lambda host, port, timeout: None)  # pretend online
  real_find_spec = data.importlib.util.find_spec
  monkeypatch.setattr(data.importlib.util, "find_spec",
                      lambda n, *a: None if n == "tensorflow" else real_find_spec(n, *a))
  with pytest.raises(DataError, match="needs TensorFlow.*pip install tensorflow.*data_dir="):
    data._check_tfds_can_prepare("mnist", 1.0)


# --------------------------------------------------------------------------- real shared copies


def _pixel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std of pixel/255, exactly, from 256-bin histograms."""
  values = np.arange(256) / 255.0
  means, stds = [], []
  for c in range(images.shape[-1]):
    counts = np.bincount(images[..., c].ravel(), minlength=256) / images[..., c].size
    mean = counts @ values
    means.append(mean)
    stds.append(np.sqrt(counts @ (values - mean) ** 2))
  return np.array(means), np.array(stds)


@needs_real_data
def test_real_mnist_matches_readme():
  directory = pathlib.Path(REAL_DATA_DIR) / "mnist"
  raw = {}
  for file_name, md5 in MNIST_MD5.items():
    raw[file_name] = gzip.decompress((directory / file_name).read_bytes())
    assert hashlib.md5(raw[file_name]).hexdigest() == md5, file_name
  ds = load_dataset("mnist", data_dir=REAL_DATA_DIR, cache=False)
  assert ds.train_images.shape == (60000, 28, 28, 1) and ds.test_images.shape == (10000, 28, 28, 1)
  assert ds.train_images.tobytes() == raw["train-images-idx3-ubyte.gz"][16:]
  assert ds.test_images.tobytes() == raw["t10k-images-idx3-ubyte.gz"][16:]
  assert ds.train_labels.astype(np.uint8).tobytes() == raw["train-labels-idx1-ubyte.gz"][8:]
  assert ds.test_labels.astype(np.uint8).tobytes() == raw["t10k-labels-idx1-ubyte.gz"][8:]
  train_counts = np.bincount(ds.train_labels, minlength=10)
  test_counts = np.bincount(ds.test_labels, minlength=10)
  assert train_counts.min() > 5000 and train_counts.max() < 7000, train_counts
  assert test_counts.min() > 800 and test_counts.max() < 1200, test_counts
  mean, std = _pixel_stats(ds.train_images)
  assert abs(mean[0] - 0.1307) < 5e-4 and abs(std[0] - 0.3081) < 5e-4


@needs_real_data
def test_real_cifar10_folders_and_a_few_images():
  archive = pathlib.Path(REAL_DATA_DIR) / "cifar10" / "cifar10-jpg.tar.gz"
  counts: dict[tuple[str, str], int] = {}
  samples = []
  with tarfile.open(archive, "r|gz") as tar:
    for member in tar:
      parts = member.name.split("/")
      if member.isfile() and len(parts) == 3:
        counts[parts[0], parts[1]] = counts.get((parts[0], parts[1]), 0) + 1
        if len(samples) < 12:
          samples.append((parts[1], tar.extractfile(member).read()))
  assert {split for split, _ in counts} == {"train", "test"}
  for split, per_class in (("train", 5000), ("test", 1000)):
    assert sorted(c for s, c in counts if s == split) == sorted(CIFAR10_CLASSES)
    assert all(counts[split, c] == per_class for c in CIFAR10_CLASSES)
  decoded, error = _formats._decode_chunk([(f"sample{i}", None, blob)
                                           for i, (_, blob) in enumerate(samples)], (32, 32, 3))
  assert error is None and decoded.shape == (12, 32, 32, 3)
  for (_, blob), image in zip(samples, decoded):
    np.testing.assert_array_equal(image, np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")))
  assert decoded.std() > 20  # real pictures, not blank


@needs_real_data
@pytest.mark.slow
def test_real_cifar10_full_load_and_cache(tmp_path):
  """Decodes all 60,000 JPEGs once (15-40 s), then loads again from the cache."""
  cache = tmp_path / "cache"
  ds = load_dataset("cifar10", data_dir=REAL_DATA_DIR, cache_dir=cache)
  assert ds.format == "image-folder-tar" and "cifar10-jpg.tar.gz" in ds.source
  assert ds.train_images.shape == (50000, 32, 32, 3) and ds.test_images.shape == (10000, 32, 32, 3)
  assert np.all(np.bincount(ds.train_labels, minlength=10) == 5000)
  assert np.all(np.bincount(ds.test_labels, minlength=10) == 1000)
  mean, std = _pixel_stats(ds.train_images)  # the README's values for the JPEG copy
  np.testing.assert_allclose(mean, [0.4913, 0.4821, 0.4465], atol=2e-4)
  np.testing.assert_allclose(std, [0.2452, 0.2428, 0.2606], atol=2e-4)
  start = time.monotonic()
  again = load_dataset("cifar10", data_dir=REAL_DATA_DIR, cache_dir=cache)
  assert again.from_cache and time.monotonic() - start < 10
  np.testing.assert_array_equal(again.test_images, ds.test_images)


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_normalize_matches_float64_reference(name):
  channels = 1 if name == "mnist" else 3
  images = np.random.default_rng(0).integers(0, 256, (4, 5, 5, channels), dtype=np.uint8)
  mean, std = data.NORMALIZATION[name]
  reference = (images.astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)
  got = data.normalize(images, dataset=name)
  assert got.dtype == jnp.float32 and got.shape == images.shape
  np.testing.assert_allclose(np.asarray(got), reference, atol=2e-6, rtol=0)
  jitted = jax.jit(lambda x: data.normalize(x, dataset=name))(images)
  np.testing.assert_allclose(np.asarray(jitted), reference, atol=2e-6, rtol=0)


def test_normalize_constants_and_bad_input():
  assert data.NORMALIZATION["mnist"] == ((0.1307,), (0.3081,))
  x = np.zeros((2, 4, 4, 3), np.uint8)
  custom = data.normalize(x, mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 1.0])
  np.testing.assert_allclose(np.asarray(custom[0, 0, 0]), [-2.0, -1.0, -0.5])
  with pytest.raises(ValueError, match="channel axis of size 1"):
    data.normalize(x, dataset="mnist")
  with pytest.raises(ValueError, match="std > 0"):
    data.normalize(x, mean=[0, 0, 0], std=[1, 0, 1])
  with pytest.raises(ValueError, match="either dataset= or mean="):
    data.normalize(x, dataset="cifar10", mean=[0, 0, 0], std=[1, 1, 1])
  with pytest.raises(ValueError, match="needs dataset="):
    data.normalize(x)
  with pytest.raises(ValueError, match="unknown dataset"):
    data.normalize(x, dataset="svhn")


# --------------------------------------------------------------------------- augmentation


def _find_crop(out: np.ndarray, image: np.ndarray, padding: int) -> set[tuple[int, int, bool]]:
  """Every (dy, dx, flipped) whose crop of the zero-padded image equals ``out``."""
  h, w, _ = image.shape
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  matches = set()
  for dy in range(2 * padding + 1):
    for dx in range(2 * padding + 1):
      crop = padded[dy:dy + h, dx:dx + w]
      for flipped, candidate in ((False, crop), (True, crop[:, ::-1])):
        if np.array_equal(candidate, out):
          matches.add((dy, dx, flipped))
  return matches


# One batch shape and few (padding, flip) settings: each combination costs a
# compilation of a second or more on CPU.
AUGMENT_IMAGES = np.random.default_rng(0).integers(1, 256, (400, 6, 6, 3), dtype=np.uint8)


def test_augment_is_a_padded_crop_and_flip():
  out = np.asarray(data.augment(jax.random.key(0), AUGMENT_IMAGES, padding=2))
  assert out.shape == AUGMENT_IMAGES.shape and out.dtype == np.uint8
  found = []
  for o, image in zip(out, AUGMENT_IMAGES):
    matches = _find_crop(o, image, 2)
    assert len(matches) == 1, matches  # random pixels: the crop is identified uniquely
    found.append(matches.pop())
  offsets = {(dy, dx) for dy, dx, _ in found}
  assert offsets == {(dy, dx) for dy in range(5) for dx in range(5)}  # all 25, 400 draws
  flips = sum(f for _, _, f in found)
  assert 150 < flips < 250  # about half are mirrored
  assert sum(not np.array_equal(o, im) for o, im in zip(out, AUGMENT_IMAGES)) > 350


def test_augment_deterministic_per_key_and_jit_consistent():
  key = jax.random.key(42)
  a = np.asarray(data.augment(key, AUGMENT_IMAGES, padding=2))
  b = np.asarray(data.augment(key, AUGMENT_IMAGES, padding=2))
  c = np.asarray(data.augment(jax.random.key(43), AUGMENT_IMAGES, padding=2))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  inside = jax.jit(lambda k, x: data.augment(k, x, padding=2))(key, AUGMENT_IMAGES)
  np.testing.assert_array_equal(a, np.asarray(inside))


def test_augment_options_and_bad_input():
  flipped_only = np.asarray(data.augment(jax.random.key(0), AUGMENT_IMAGES, padding=0))
  is_flip = [np.array_equal(o, im[:, ::-1]) for o, im in zip(flipped_only, AUGMENT_IMAGES)]
  is_same = [np.array_equal(o, im) for o, im in zip(flipped_only, AUGMENT_IMAGES)]
  assert all(f != s for f, s in zip(is_flip, is_same))  # exactly one of the two
  assert 150 < sum(is_flip) < 250
  shifted = np.asarray(data.augment(jax.random.key(0), AUGMENT_IMAGES, padding=2, flip=False))
  for o, image in zip(shifted, AUGMENT_IMAGES):
    ((_, _, flipped),) = _find_crop(o, image, 2)
    assert not flipped
  with pytest.raises(ValueError, match=r"\[N, H, W, C\]"):
    data.augment(jax.random.key(0), AUGMENT_IMAGES[0])
  with pytest.raises(ValueError, match="padding must be >= 0"):
    data.augment(jax.random.key(0), AUGMENT_IMAGES, padding=-1)


# --------------------------------------------------------------------------- batches


def test_iterate_batches_cover_each_example_once():
  x = np.arange(23)[:, None] * np.ones((1, 3), np.int64)
  y = np.arange(23)
  batches = list(data.iterate_batches(x, y, batch_size=5, seed=3, epoch=1))
  assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
  seen = np.concatenate([b[1] for b in batches])
  assert sorted(seen.tolist()) == list(range(23))
  assert not np.array_equal(seen, np.arange(23))  # shuffled
  for bx, by in batches:
    np.testing.assert_array_equal(bx[:, 0], by)  # images and labels stay paired
  np.testing.assert_array_equal(seen, data.epoch_permutation(23, seed=3, epoch=1))


def test_iterate_batches_seeded_drop_remainder_and_resume():
  x, y = np.zeros((23, 2)), np.arange(23)

  def order(**kw):
    return [b[1].tolist() for b in data.iterate_batches(x, y, batch_size=5, **kw)]

  assert order(seed=0, epoch=0) == order(seed=0, epoch=0)
  assert order(seed=0, epoch=0) != order(seed=0, epoch=1)
  assert order(seed=0, epoch=0) != order(seed=1, epoch=0)
  dropped = order(seed=0, epoch=2, drop_remainder=True)
  assert [len(b) for b in dropped] == [5, 5, 5, 5]
  assert dropped == order(seed=0, epoch=2)[:4]
  assert order(seed=0, epoch=2, start_batch=3) == order(seed=0, epoch=2)[3:]
  assert order(shuffle=False) == [list(range(i, min(i + 5, 23))) for i in range(0, 23, 5)]
  assert data.num_batches(23, batch_size=5) == 5
  assert data.num_batches(23, batch_size=5, drop_remainder=True) == 4


def test_iterate_batches_bad_input():
  x, y = np.zeros((4, 2)), np.arange(4)
  with pytest.raises(ValueError, match="batch_size must be >= 1"):
    data.iterate_batches(x, y, batch_size=0)
  with pytest.raises(ValueError, match="differ in length: 4 and 3"):
    data.iterate_batches(x, y[:3], batch_size=2)
  with pytest.raises(ValueError, match="start_batch"):
    data.iterate_batches(x, y, batch_size=2, start_batch=-1)
  with pytest.raises(ValueError, match="seed and epoch must be >= 0"):
    data.iterate_batches(x, y, batch_size=2, seed=-1)
