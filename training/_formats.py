"""Readers for the on-disk formats of MNIST and CIFAR-10 (NumPy and Pillow only).

Supported layouts (``find_local_source`` detects which one a folder holds):

* MNIST: the four IDX files under their standard names
  (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``), each gzipped
  (``.gz``) or not; the ``train-images.idx3-ubyte`` spelling is accepted too.
* CIFAR-10, "python version": ``data_batch_1`` .. ``data_batch_5`` and
  ``test_batch`` pickles (usually in ``cifar-10-batches-py/``), or the
  ``cifar-10-python.tar.gz`` archive. The pickles are read with an unpickler
  that only admits NumPy arrays, so a hostile file cannot run code.
* CIFAR-10, "binary version": ``data_batch_1.bin`` .. ``test_batch.bin``
  (``cifar-10-batches-bin/``) or ``cifar-10-binary.tar.gz``.
* CIFAR-10 as an image folder: ``train/<class>/<image>`` and
  ``test/<class>/<image>`` with the ten standard class names (label = index in
  ``CIFAR10_CLASSES``), as a directory or a ``.tar``/``.tar.gz``/``.tgz`` of
  one; any format Pillow decodes (JPEG, PNG, ...).

Every problem with the files raises ``DataError`` (a ``ValueError``) or
``DataFileNotFoundError`` (also a ``FileNotFoundError``) whose message names the
file.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import hashlib
import importlib
import io
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import tarfile
import warnings
import zlib
from typing import Any, Callable, Sequence

import numpy as np

MNIST_CLASSES = tuple(str(digit) for digit in range(10))
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
IMAGE_SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}
CLASS_NAMES = {"mnist": MNIST_CLASSES, "cifar10": CIFAR10_CLASSES}

_SPLITS = ("train", "test")
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
# Names that archivers and desktops leave beside real files.
_JUNK_NAMES = {"Thumbs.db", "desktop.ini"}


class DataError(ValueError):
  """A data file is missing, corrupt or in an unsupported layout.

  The message names the offending file (for archive members:
  ``archive.tar.gz:member/path``).
  """


class DataFileNotFoundError(DataError, FileNotFoundError):
  """A data file or folder that the loader needs does not exist."""


def _is_junk(name: str) -> bool:
  base = name.rsplit("/", 1)[-1]
  return not base or base.startswith(".") or base in _JUNK_NAMES


def _read_file(path: pathlib.Path) -> bytes:
  try:
    return path.read_bytes()
  except FileNotFoundError:
    raise DataFileNotFoundError(f"{path}: file not found") from None
  except OSError as e:
    raise DataError(f"{path}: cannot read file ({e})") from None


def _gunzip(raw: bytes, where: str) -> bytes:
  try:
    return gzip.decompress(raw)
  except EOFError:
    raise DataError(f"{where}: gzip data is truncated (the file ends before the end of the "
                    "compressed stream); download it again") from None
  except (OSError, zlib.error) as e:
    raise DataError(f"{where}: corrupt gzip data ({e})") from None


def _read_maybe_gzip(path: pathlib.Path) -> bytes:
  """File contents, decompressed when the file starts with the gzip magic bytes."""
  raw = _read_file(path)
  if raw[:2] == b"\x1f\x8b":
    return _gunzip(raw, str(path))
  if path.name.endswith(".gz"):
    raise DataError(f"{path}: named .gz but is not gzip data (first bytes {raw[:4].hex()})")
  return raw


# --------------------------------------------------------------------------- MNIST (IDX)

_IDX_UBYTE = 0x08
_MNIST_FILES = {  # key -> (stem, ndim)
    "train_images": ("train-images", 3),
    "train_labels": ("train-labels", 1),
    "test_images": ("t10k-images", 3),
    "test_labels": ("t10k-labels", 1),
}


def parse_idx(raw: bytes, *, where: str, ndim: int, item_shape: tuple[int, ...] = ()) -> np.ndarray:
  """Parses an IDX unsigned-byte array of rank ``ndim`` (magic ``0x0000080<ndim>``).

  Checks the magic number, the per-item shape (e.g. 28x28) and that the payload
  has exactly the announced number of bytes (truncated or padded files fail).
  """
  magic = 0x0800 | ndim
  if len(raw) < 4:
    raise DataError(f"{where}: file is truncated ({len(raw)} bytes; an IDX header needs "
                    f"{4 + 4 * ndim})")
  if raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UBYTE or raw[3] != ndim:
    kind = "images" if ndim == 3 else "labels"
    raise DataError(f"{where}: wrong magic number 0x{raw[:4].hex()}, expected 0x{magic:08x} "
                    f"(IDX unsigned-byte {ndim}-d array of {kind}); is this the right file?")
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise DataError(f"{where}: file is truncated inside the IDX header ({len(raw)} bytes)")
  dims = struct.unpack(f">{ndim}I", raw[4:header])
  if tuple(dims[1:]) != tuple(item_shape):
    shape_text = "x".join(map(str, dims[1:]))
    want_text = "x".join(map(str, item_shape))
    raise DataError(f"{where}: items are {shape_text}, expected {want_text}")
  expected = header + int(np.prod(dims, dtype=np.int64))
  if len(raw) < expected:
    raise DataError(f"{where}: file is truncated: the header announces {dims[0]} items "
                    f"({expected} bytes) but the data has {len(raw)} bytes")
  if len(raw) > expected:
    raise DataError(f"{where}: {len(raw) - expected} unexpected bytes after the {dims[0]} "
                    "items the header announces")
  return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _mnist_candidates(stem: str, ndim: int) -> list[str]:
  # Standard name, then the "train-images.idx3-ubyte" spelling some mirrors use.
  names = [f"{stem}-idx{ndim}-ubyte", f"{stem}.idx{ndim}-ubyte"]
  return [n for name in names for n in (name, name + ".gz")]


def find_mnist_files(directory: pathlib.Path) -> dict[str, pathlib.Path] | None:
  """The four MNIST IDX files in ``directory``; None when none is there.

  Raises ``DataFileNotFoundError`` naming the missing files when only some are.
  """
  found: dict[str, pathlib.Path] = {}
  missing = []
  for key, (stem, ndim) in _MNIST_FILES.items():
    for candidate in _mnist_candidates(stem, ndim):
      if (directory / candidate).is_file():
        found[key] = directory / candidate
        break
    else:
      missing.append(f"{stem}-idx{ndim}-ubyte[.gz]")
  if not found:
    return None
  if missing:
    raise DataFileNotFoundError(f"{directory}: incomplete MNIST IDX files, missing "
                                f"{', '.join(missing)}")
  return found


def read_mnist(files: dict[str, pathlib.Path]) -> dict[str, np.ndarray]:
  """Reads the four IDX files into ``[N, 28, 28, 1]`` uint8 images and int32 labels."""
  out: dict[str, np.ndarray] = {}
  for split in _SPLITS:
    images_path, labels_path = files[f"{split}_images"], files[f"{split}_labels"]
    images = parse_idx(_read_maybe_gzip(images_path), where=str(images_path), ndim=3,
                       item_shape=(28, 28))
    labels = parse_idx(_read_maybe_gzip(labels_path), where=str(labels_path), ndim=1)
    if images.shape[0] != labels.shape[0]:
      raise DataError(f"{labels_path}: {labels.shape[0]} labels but {images_path} holds "
                      f"{images.shape[0]} images")
    _check_labels(labels, 10, str(labels_path))
    out[f"{split}_images"] = images[..., None]
    out[f"{split}_labels"] = labels.astype(np.int32)
  return out


def _check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise DataError(f"{where}: labels must lie in 0..{num_classes - 1}, found values in "
                    f"{int(labels.min())}..{int(labels.max())}")


# --------------------------------------------------------------------------- CIFAR-10 batches

_PY_BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
_BIN_BATCHES = {split: [name + ".bin" for name in names] for split, names in _PY_BATCHES.items()}
_CIFAR_RECORD = 1 + 32 * 32 * 3


def _numpy_attr(module: str, name: str) -> Any:
  # Pickles written by NumPy 1 name numpy.core.*, NumPy 2 names numpy._core.*.
  for candidate in (module.replace("numpy.core", "numpy._core"), module):
    try:
      return getattr(importlib.import_module(candidate), name)
    except (ImportError, AttributeError):
      continue
  raise pickle.UnpicklingError(f"cannot find {module}.{name}")


class _ArrayOnlyUnpickler(pickle.Unpickler):
  """Unpickler that admits dicts, lists, bytes and NumPy arrays, nothing callable else."""

  _ALLOWED = {
      ("_codecs", "encode"),
      ("numpy", "ndarray"),
      ("numpy", "dtype"),
      ("numpy.core.multiarray", "_reconstruct"),
      ("numpy._core.multiarray", "_reconstruct"),
      ("numpy.core.multiarray", "scalar"),
      ("numpy._core.multiarray", "scalar"),
      ("numpy.core.numeric", "_frombuffer"),
      ("numpy._core.numeric", "_frombuffer"),
  }

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only NumPy arrays "
                                   "are allowed in a CIFAR-10 batch)")
    if module == "_codecs":
      return super().find_class(module, name)
    return _numpy_attr(module, name)


def parse_cifar_python_batch(raw: bytes, *, where: str) -> tuple[np.ndarray, np.ndarray]:
  """One "python version" batch: ``[N, 32, 32, 3]`` uint8 images, int32 labels."""
  try:
    batch = _ArrayOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
  except EOFError:
    raise DataError(f"{where}: file is truncated (the pickle ends early)") from None
  except Exception as e:  # pickle raises many types on garbage input
    raise DataError(f"{where}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
  if not isinstance(batch, dict):
    raise DataError(f"{where}: not a CIFAR-10 python batch (pickle holds "
                    f"{type(batch).__name__}, expected a dict)")
  batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
  if "data" not in batch or "labels" not in batch:
    raise DataError(f"{where}: not a CIFAR-10 python batch (keys {sorted(map(str, batch))}, "
                    "expected 'data' and 'labels')")
  data = np.asarray(batch["data"])
  labels = np.asarray(batch["labels"])
  if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
    raise DataError(f"{where}: 'data' is {data.dtype} {data.shape}, expected uint8 [N, 3072] "
                    "(32x32 RGB images)")
  if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
    raise DataError(f"{where}: {labels.size} labels for {data.shape[0]} images")
  if not np.issubdtype(labels.dtype, np.integer):
    raise DataError(f"{where}: labels have dtype {labels.dtype}, expected integers")
  _check_labels(labels, 10, where)
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels.astype(np.int32)


def parse_cifar_binary_batch(raw: bytes, *, where: str) -> tuple[np.ndarray, np.ndarray]:
  """One "binary version" batch: records of 1 label byte + 3072 pixel bytes."""
  if len(raw) == 0 or len(raw) % _CIFAR_RECORD:
    raise DataError(f"{where}: {len(raw)} bytes is not a whole number of {_CIFAR_RECORD}-byte "
                    "CIFAR-10 records (truncated or wrong file)")
  records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
  labels = records[:, 0].astype(np.int32)
  _check_labels(labels, 10, where)
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels


def _assemble_batches(batches: dict[str, bytes], names: dict[str, list[str]],
                      parse: Callable[..., tuple[np.ndarray, np.ndarray]],
                      where: Callable[[str], str]) -> dict[str, np.ndarray]:
  out = {}
  for split, split_names in names.items():
    parts = [parse(batches[name], where=where(name)) for name in split_names]
    out[f"{split}_images"] = np.concatenate([p[0] for p in parts])
    out[f"{split}_labels"] = np.concatenate([p[1] for p in parts])
  return out


def _batch_names(binary: bool) -> dict[str, list[str]]:
  return _BIN_BATCHES if binary else _PY_BATCHES


def read_cifar_batches_dir(directory: pathlib.Path, *, binary: bool) -> dict[str, np.ndarray]:
  names = _batch_names(binary)
  batches = {}
  for name in (n for split_names in names.values() for n in split_names):
    batches[name] = _read_file(directory / name)
  parse = parse_cifar_binary_batch if binary else parse_cifar_python_batch
  return _assemble_batches(batches, names, parse, lambda name: str(directory / name))


def read_cifar_batches_tar(archive: pathlib.Path, *, binary: bool) -> dict[str, np.ndarray]:
  names = _batch_names(binary)
  wanted = {n for split_names in names.values() for n in split_names}
  batches: dict[str, bytes] = {}
  for member, data in _iter_tar_files(archive):
    base = member.rsplit("/", 1)[-1]
    if base in wanted and base not in batches:
      batches[base] = data()
  missing = sorted(wanted - set(batches))
  if missing:
    raise DataFileNotFoundError(f"{archive}: archive lacks {', '.join(missing)}")
  parse = parse_cifar_binary_batch if binary else parse_cifar_python_batch
  return _assemble_batches(batches, names, parse, lambda name: f"{archive}:{name}")


# --------------------------------------------------------------------------- tar helpers


def _iter_tar_files(archive: pathlib.Path):
  """Yields ``(member_name, read)`` for regular files, streaming through the archive."""
  if not archive.is_file():
    raise DataFileNotFoundError(f"{archive}: file not found")
  errors = (tarfile.TarError, EOFError, OSError, zlib.error)

  def corrupt(e: Exception, member: str = "") -> DataError:
    where = f"{archive}:{member}" if member else str(archive)
    return DataError(f"{where}: corrupt or truncated archive ({type(e).__name__}: {e})")

  def reader(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], bytes]:
    def read() -> bytes:
      try:
        return tar.extractfile(member).read()
      except errors as e:
        raise corrupt(e, member.name) from None
    return read

  try:
    with tarfile.open(archive, mode="r|*") as tar:
      for member in tar:
        if member.isfile():
          yield member.name, reader(tar, member)
  except errors as e:
    raise corrupt(e) from None


def _sniff_tar(archive: pathlib.Path, max_members: int = 64) -> str | None:
  """Guesses the CIFAR-10 layout inside an archive from its first members."""
  lower = archive.name.lower()
  if lower.startswith("cifar-10-python"):
    return "python-tar"
  if lower.startswith("cifar-10-binary"):
    return "binary-tar"
  for i, (member, _) in enumerate(_iter_tar_files(archive)):
    base = member.rsplit("/", 1)[-1]
    if base in ("data_batch_1", "test_batch"):
      return "python-tar"
    if base in ("data_batch_1.bin", "test_batch.bin"):
      return "binary-tar"
    if _split_member(member) is not None:
      return "image-folder-tar"
    if i >= max_members:
      break
  return None


def _split_member(member: str) -> tuple[str, str, str, str] | None:
  """``(prefix, split, class, file)`` for ``[prefix/]{train,test}/<class>/<file>``."""
  parts = member.strip("/").split("/")
  if len(parts) >= 3 and parts[-3] in _SPLITS and not _is_junk(parts[-1]):
    return "/".join(parts[:-3]), parts[-3], parts[-2], parts[-1]
  return None


# --------------------------------------------------------------------------- image folders


@dataclasses.dataclass(frozen=True)
class _ImageItem:
  where: str          # file name for error messages (path, or archive:member)
  label: int
  path: str | None    # read from disk when data is None
  data: bytes | None = None


def _class_label(class_name: str, classes: Sequence[str], where: str) -> int:
  if class_name not in classes:
    raise DataError(f"{where}: unknown class folder {class_name!r}; expected the CIFAR-10 "
                    f"classes {', '.join(classes)}")
  return classes.index(class_name)


def _check_all_classes(present: dict[str, set[str]], classes: Sequence[str], where: str) -> None:
  for split in _SPLITS:
    missing = [c for c in classes if c not in present.get(split, set())]
    if missing:
      raise DataFileNotFoundError(f"{where}: {split}/ lacks class folder(s) "
                                  f"{', '.join(missing)}")


def list_image_folder(root: pathlib.Path, classes: Sequence[str]) -> dict[str, list[_ImageItem]]:
  """Lists ``root/{train,test}/<class>/*`` in a fixed order (class, then file name)."""
  items: dict[str, list[_ImageItem]] = {split: [] for split in _SPLITS}
  present: dict[str, set[str]] = {split: set() for split in _SPLITS}
  for split in _SPLITS:
    split_dir = root / split
    if not split_dir.is_dir():
      raise DataFileNotFoundError(f"{split_dir}: folder not found (expected "
                                  f"{split}/<class>/<image> under {root})")
    class_dirs = sorted((e for e in os.scandir(split_dir) if e.is_dir() and not _is_junk(e.name)),
                        key=lambda e: e.name)
    for entry in class_dirs:
      label = _class_label(entry.name, classes, entry.path)
      present[split].add(entry.name)
      files = sorted(f.name for f in os.scandir(entry.path) if f.is_file() and not _is_junk(f.name))
      for file_name in files:
        path = os.path.join(entry.path, file_name)
        items[split].append(_ImageItem(path, label, path))
  _check_all_classes(present, classes, str(root))
  items = {split: sorted(v, key=lambda it: (it.label, it.where)) for split, v in items.items()}
  return items


def read_image_folder_tar(archive: pathlib.Path,
                          classes: Sequence[str]) -> dict[str, list[_ImageItem]]:
  """Reads every ``[prefix/]{train,test}/<class>/<image>`` member of an archive."""
  items: dict[str, list[_ImageItem]] = {split: [] for split in _SPLITS}
  present: dict[str, set[str]] = {split: set() for split in _SPLITS}
  prefix_seen: str | None = None
  for member, read in _iter_tar_files(archive):
    parsed = _split_member(member)
    if parsed is None:
      continue
    prefix, split, class_name, _ = parsed
    where = f"{archive}:{member}"
    if prefix_seen is None:
      prefix_seen = prefix
    elif prefix != prefix_seen:
      raise DataError(f"{where}: archive mixes image folders under {prefix_seen or '.'!r} and "
                      f"{prefix or '.'!r}")
    label = _class_label(class_name, classes, where)
    present[split].add(class_name)
    items[split].append(_ImageItem(where, label, None, read()))
  if prefix_seen is None:
    raise DataFileNotFoundError(f"{archive}: no train/<class>/<image> or test/<class>/<image> "
                                "members")
  _check_all_classes(present, classes, str(archive))
  return {split: sorted(v, key=lambda it: (it.label, it.where)) for split, v in items.items()}


def _decode_chunk(items: Sequence[tuple[str, str | None, bytes | None]],
                  shape: tuple[int, int, int]) -> tuple[np.ndarray, str | None]:
  """Decodes ``(where, path, data)`` images with Pillow.

  Returns the ``[n, *shape]`` uint8 array and the first error message (or None).
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  height, width, channels = shape
  mode = "RGB" if channels == 3 else "L"
  out = np.empty((len(items), height, width, channels), np.uint8)
  for i, (where, path, data) in enumerate(items):
    try:
      if data is None:
        data = pathlib.Path(path).read_bytes()
      with Image.open(io.BytesIO(data)) as image:
        if image.size != (width, height):
          return out, (f"{where}: image is {image.size[0]}x{image.size[1]}, expected "
                       f"{width}x{height}")
        image.load()
        converted = image if image.mode == mode else image.convert(mode)
        out[i] = np.asarray(converted).reshape(height, width, channels)
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
      return out, f"{where}: cannot decode image ({type(e).__name__}: {e})"
  return out, None


def _worker_main() -> None:
  """Entry point of a decoding subprocess: pickled job on stdin, pickled result on stdout."""
  items, shape = pickle.loads(sys.stdin.buffer.read())
  sys.stdout.buffer.write(pickle.dumps(_decode_chunk(items, shape), protocol=5))
  sys.stdout.buffer.flush()


# The worker loads this file by path, so that it imports neither the
# ``training`` package (which may pull in Flax) nor the caller's ``__main__``
# (which multiprocessing's "spawn" would re-run, and "fork" is unsafe once JAX
# has started its threads).
_WORKER_COMMAND = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('_cwsa_jax_decode_worker', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); "
    "sys.modules[spec.name] = module; spec.loader.exec_module(module); module._worker_main()"
)


def _decode_in_subprocess(items: list[tuple[str, str | None, bytes | None]],
                          shape: tuple[int, int, int]) -> tuple[np.ndarray, str | None]:
  command = [sys.executable, "-c", _WORKER_COMMAND, os.path.abspath(__file__)]
  job = pickle.dumps((items, shape), protocol=5)
  proc = subprocess.run(command, input=job, capture_output=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(proc.stderr.decode(errors="replace")[-2000:])
  return pickle.loads(proc.stdout)


_PARALLEL_MIN_ITEMS = 4096


def default_num_workers() -> int:
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cpus = os.cpu_count() or 1
  return max(1, min(cpus, 16))


def decode_images(items: Sequence[tuple[str, str | None, bytes | None]],
                  shape: tuple[int, int, int], *, num_workers: int | None = None) -> np.ndarray:
  """Decodes ``(where, path, data)`` items into ``[N, *shape]`` uint8.

  With more than one worker and at least ``_PARALLEL_MIN_ITEMS`` images, the work is split over
  ``num_workers`` Python subprocesses (Pillow decoding is bound by Python
  overhead, so threads do not help). If a subprocess cannot start, decoding
  falls back to this process.
  """
  items = list(items)
  workers = default_num_workers() if num_workers is None else num_workers
  chunks = None
  if workers > 1 and len(items) >= _PARALLEL_MIN_ITEMS:
    step = -(-len(items) // workers)
    pieces = [items[i:i + step] for i in range(0, len(items), step)]
    try:
      with concurrent.futures.ThreadPoolExecutor(len(pieces)) as pool:
        chunks = list(pool.map(_decode_in_subprocess, pieces, [shape] * len(pieces)))
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
      warnings.warn(f"parallel image decoding failed ({type(e).__name__}: {str(e)[-300:]}); "
                    "decoding in this process", stacklevel=2)
      chunks = None
  if chunks is None:
    chunks = [_decode_chunk(items, shape)]
  for _, error in chunks:
    if error is not None:
      raise DataError(error)
  return np.concatenate([c[0] for c in chunks]) if items else np.zeros((0, *shape), np.uint8)


def decode_image_folder(items: dict[str, list[_ImageItem]], shape: tuple[int, int, int], *,
                        num_workers: int | None = None) -> dict[str, np.ndarray]:
  everything = items["train"] + items["test"]
  images = decode_images([(it.where, it.path, it.data) for it in everything], shape,
                         num_workers=num_workers)
  labels = np.array([it.label for it in everything], np.int32)
  n_train = len(items["train"])
  return {"train_images": images[:n_train], "train_labels": labels[:n_train],
          "test_images": images[n_train:], "test_labels": labels[n_train:]}


# --------------------------------------------------------------------------- detection


@dataclasses.dataclass
class LocalSource:
  """A detected local copy of a dataset: its layout and where it lives."""

  name: str
  format: str
  path: pathlib.Path
  files: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)
  _listing: dict[str, list[_ImageItem]] | None = None

  def describe(self) -> str:
    return f"{self.format} at {self.path}"

  def fingerprint(self) -> str:
    """Hash of the source files' paths, sizes and modification times."""
    digest = hashlib.sha256(f"{self.name}|{self.format}|{self.path.resolve()}".encode())
    if self.format == "image-folder":
      self._listing = list_image_folder(self.path, CLASS_NAMES[self.name])
      paths = [it.path for split in _SPLITS for it in self._listing[split]]
    elif self.format in ("python-batches", "binary-batches"):
      names = _batch_names(self.format == "binary-batches").values()
      paths = [str(self.path / name) for split_names in names for name in split_names]
    elif self.files:
      paths = [str(self.files[k]) for k in sorted(self.files)]
    else:  # a single archive
      paths = [str(self.path)]
    for p in paths:
      try:
        stat = os.stat(p)
      except FileNotFoundError:
        raise DataFileNotFoundError(f"{p}: file not found") from None
      digest.update(f"|{p}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()

  def read(self, *, num_workers: int | None = None) -> dict[str, np.ndarray]:
    shape = IMAGE_SHAPES[self.name]
    if self.format in ("idx", "idx.gz"):
      return read_mnist(self.files)
    if self.format == "python-batches":
      return read_cifar_batches_dir(self.path, binary=False)
    if self.format == "binary-batches":
      return read_cifar_batches_dir(self.path, binary=True)
    if self.format == "python-tar":
      return read_cifar_batches_tar(self.path, binary=False)
    if self.format == "binary-tar":
      return read_cifar_batches_tar(self.path, binary=True)
    if self.format == "image-folder":
      listing = self._listing or list_image_folder(self.path, CLASS_NAMES[self.name])
      return decode_image_folder(listing, shape, num_workers=num_workers)
    if self.format == "image-folder-tar":
      listing = read_image_folder_tar(self.path, CLASS_NAMES[self.name])
      return decode_image_folder(listing, shape, num_workers=num_workers)
    raise AssertionError(self.format)


_SUBDIRS = {
    "mnist": ("mnist", "MNIST", "MNIST/raw", "mnist/raw"),
    "cifar10": ("cifar10", "cifar-10", "CIFAR10", "CIFAR-10"),
}

FORMAT_HELP = {
    "mnist": ("the four MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
              "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), gzipped (.gz) or not"),
    "cifar10": ("CIFAR-10 as train/<class>/<image> and test/<class>/<image> folders (or a "
                ".tar.gz of them), the python-version batches (cifar-10-batches-py/ or "
                "cifar-10-python.tar.gz) or the binary-version batches (cifar-10-batches-bin/ "
                "or cifar-10-binary.tar.gz)"),
}


def _detect_cifar_dir(directory: pathlib.Path) -> LocalSource | None:
  for sub, fmt, suffix in (("cifar-10-batches-py", "python-batches", ""),
                           ("cifar-10-batches-bin", "binary-batches", ".bin")):
    for candidate in (directory / sub, directory):
      if any((candidate / (batch + suffix)).is_file() for batch in ("data_batch_1", "test_batch")):
        return LocalSource("cifar10", fmt, candidate)
  if (directory / "train").is_dir() or (directory / "test").is_dir():
    return LocalSource("cifar10", "image-folder", directory)
  archives = sorted(p for p in directory.iterdir()
                    if p.is_file() and p.name.lower().endswith(_ARCHIVE_SUFFIXES))
  for archive in archives:
    fmt = _sniff_tar(archive)
    if fmt is not None:
      return LocalSource("cifar10", fmt, archive)
  return None


def _detect_in(name: str, directory: pathlib.Path) -> LocalSource | None:
  if name == "mnist":
    files = find_mnist_files(directory)
    if files is None:
      return None
    compressed = any(p.name.endswith(".gz") for p in files.values())
    return LocalSource("mnist", "idx.gz" if compressed else "idx", directory, files)
  return _detect_cifar_dir(directory)


def find_local_source(name: str, data_dir: os.PathLike[str] | str) -> LocalSource:
  """Detects the layout of dataset ``name`` in ``data_dir``.

  ``data_dir`` may be the dataset's own folder, a parent holding ``mnist/`` or
  ``cifar10/``, or (CIFAR-10) an archive file.
  """
  root = pathlib.Path(data_dir).expanduser()
  if not root.exists():
    raise DataFileNotFoundError(f"{root}: data directory not found")
  if root.is_file():
    if name != "cifar10" or not root.name.lower().endswith(_ARCHIVE_SUFFIXES):
      raise DataError(f"{root}: expected a directory holding {FORMAT_HELP[name]}")
    fmt = _sniff_tar(root)
    if fmt is None:
      raise DataError(f"{root}: archive holds no CIFAR-10 layout; expected {FORMAT_HELP[name]}")
    return LocalSource(name, fmt, root)
  for directory in [root] + [root / sub for sub in _SUBDIRS[name]]:
    if directory.is_dir():
      found = _detect_in(name, directory)
      if found is not None:
        return found
  raise DataFileNotFoundError(
      f"{root}: no {name} data found here or in {', '.join(_SUBDIRS[name][:2])}/ beneath it; "
      f"expected {FORMAT_HELP[name]}")

