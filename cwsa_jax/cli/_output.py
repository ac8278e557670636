"""Where the command line writes, and what it may replace.

The rules (README, "Where outputs go, and what --force may replace"):

- An output folder is written as a hidden sibling ``.NAME.cwsa-tmp-PID-XXXXXXXX``
  and renamed to ``NAME`` only once complete. Its manifest
  ``.cwsa-jax-output.json`` lists every file the kit wrote into it.
- An existing ``NAME`` that holds anything is replaced only with ``--force``,
  and only when it is the kit's own: a manifest, and no entry the manifest
  does not list. Anything else (the input, a note, a folder of another tool)
  is refused in one line naming the first foreign entry: the kit never
  deletes a file it did not write.
- ``--out`` may not be empty, ``.``, a parent of the current folder, ``/``, the
  home folder, a symbolic link, an existing non-folder, or a folder that holds
  an input file.
- The replacement is one atomic exchange (Linux ``renameat2`` with
  ``RENAME_EXCHANGE``) of the complete new folder with the old one, or, where
  that is not available, two renames: the old folder to
  ``.NAME.cwsa-old-PID-XXXXXXXX``, the new one to ``NAME``.
- A temporary is locked (``flock``) by the process writing it for as long as it
  lives; a killed process's locks vanish with it. Every run first removes the
  unlocked temporaries beside its output and puts back an unlocked
  ``.NAME.cwsa-old-*`` whose ``NAME`` is missing (a kill between the two renames).
  So a kill at any moment leaves the previous complete result or the new one,
  and the next run leaves no temporary.
- Files are created with mode ``0o666 & ~umask``, folders ``0o777 & ~umask``.

Every failure to write (a read-only or full disk, a parent that is a file) is a
:class:`UserError`: one line, exit status 2. What can be known before the work
is checked before it: the temporary's name must fit the file system's name limit
(``NAME_MAX``), an existing output must be writable, and a temporary folder is
created and removed where the output goes; those errors name ``--out``, never the
temporary.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator

import cwsa_jax
from cwsa_jax.cli import _interrupt
from cwsa_jax.cli._util import UserError, temp_name, write_json_atomic

MANIFEST = ".cwsa-jax-output.json"
TOOL = "cwsa-jax"
_TEMP = re.compile(r"^\.(?P<name>.+)\.cwsa-(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


# --------------------------------------------------------------------------- checks


def _refuse_special(path: Path, raw: str, flag: str) -> None:
  real = Path(os.path.realpath(raw))
  cwd = Path(os.path.realpath(os.getcwd()))
  home = Path(os.path.realpath(os.path.expanduser("~")))
  what = None
  if real == Path(real.anchor):
    what = "the root folder"
  elif real == cwd:
    what = "the current folder"
  elif real in cwd.parents:
    what = "a parent of the current folder"
  elif real == home:
    what = "your home folder"
  if what:
    raise UserError(f"{flag} {raw} is {what}; name a new sub-folder for the results, "
                    "e.g. --out results")


def _nearest_existing(path: Path) -> Path:
  """``path`` (absolute) or its nearest ancestor that exists."""
  while not os.path.lexists(path) and path != path.parent:
    path = path.parent
  return path


def _check_parent(path: Path, raw: str) -> None:
  """The nearest existing ancestor of ``path`` must be a writable folder."""
  ancestor = _nearest_existing(Path(os.path.abspath(path)).parent)
  if not ancestor.is_dir():
    raise UserError(f"cannot write {raw}: {ancestor} is not a folder")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise UserError(f"cannot write {raw}: {ancestor} is read-only or not writable")


def _name_max(folder: Path) -> int:
  """The longest file name (bytes) the file system of ``folder`` allows; 255 when unknown."""
  try:
    limit = os.pathconf(folder, "PC_NAME_MAX")
  except (OSError, ValueError):
    return 255
  return limit if limit and limit > 0 else 255


def _check_name_lengths(path: Path, raw: str, flag: str) -> Path:
  """Every folder ``path`` still needs, and the hidden temporary written beside it
  (``.NAME.cwsa-tmp-PID-XXXXXXXX``), must fit the file system's name limit.

  Returns the nearest existing ancestor of ``path``'s parent.
  """
  ancestor = _nearest_existing(path.parent)
  limit = _name_max(ancestor)
  for part in path.relative_to(ancestor).parts[:-1]:
    if len(os.fsencode(part)) > limit:
      raise UserError(f"cannot write {raw}: its folder name {part[:40]}... is "
                      f"{len(os.fsencode(part))} bytes, longer than the {limit} this file "
                      "system allows")
  size = len(os.fsencode(path.name))
  extra = len(os.fsencode(temp_name(path.name))) - size
  if size + extra > limit:
    raise UserError(f"{flag} {raw}: its name is {size} bytes, and cwsa-jax first writes it under "
                    f"a hidden temporary name {extra} bytes longer, so at most {limit - extra} "
                    f"bytes fit on this file system: choose a shorter {flag}")
  return ancestor


def _check_writable(out: Path, raw: str, flag: str) -> None:
  """Before any work: the temporary beside ``out`` can be named and created there.

  Checks the name lengths (:func:`_check_name_lengths`), that an existing ``out``
  is writable (an immutable or read-only folder could not be replaced), and
  creates and removes a temporary folder where the first missing part of ``out``
  (or its temporary) will go: a folder nobody may create in (``/proc``, a
  read-only mount, even for root) is refused here, naming ``out``.
  """
  path = Path(os.path.abspath(out))
  ancestor = _check_name_lengths(path, raw, flag)
  mode = os.W_OK | os.X_OK if path.is_dir() else os.W_OK
  if os.path.lexists(path) and not os.access(path, mode):
    what = "folder" if path.is_dir() else "file"
    raise UserError(f"cannot write {raw}: the {what} is read-only or not writable")
  missing = path.relative_to(ancestor).parts
  probe = ancestor / temp_name(missing[0] if len(missing) == 1 else "probe")
  try:
    os.mkdir(probe, 0o700)
  except OSError as e:
    raise UserError(f"cannot write {raw}: cannot create a folder in {ancestor} "
                    f"({e.strerror or e})") from None
  with contextlib.suppress(OSError):
    os.rmdir(probe)


def _refuse_inputs(raw: str, inputs: Iterable[Any], flag: str, what: str) -> None:
  real_out = Path(os.path.realpath(raw))
  for item in inputs:
    if item is None:
      continue
    real = Path(os.path.realpath(os.fspath(item)))
    if real == real_out or real_out in real.parents:
      raise UserError(f"{flag} {raw} {what} the input {os.fspath(item)}; writing the results "
                      "there would replace it: choose another --out")


def _manifest_files(folder: Path) -> set[str] | None:
  """The file names the kit's manifest in ``folder`` lists, or None without a valid one."""
  try:
    data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  files = data.get("files") if isinstance(data, dict) and data.get("tool") == TOOL else None
  if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
    return None
  return set(files)


def _first_foreign(folder: Path) -> str | None:
  """The first entry of ``folder`` (sorted) the kit did not write; None if all are its own."""
  entries = sorted(os.listdir(folder))
  own = _manifest_files(folder)
  for name in entries:
    if name == MANIFEST and own is not None:
      continue
    if own is None or name not in own or not (folder / name).is_file() or (folder / name).is_symlink():
      return name
  return None


def _refuse_foreign(path: Path, raw: str, force: bool, hint: str) -> None:
  """An existing non-empty folder needs --force, and --force only replaces the kit's own."""
  if not path.is_dir() or not os.listdir(path):
    return
  if not force:
    raise UserError(f"output folder {raw} already exists (use --force to replace it{hint})")
  foreign = _first_foreign(path)
  if foreign is not None:
    reason = ("it has no cwsa-jax manifest" if _manifest_files(path) is None
              else "cwsa-jax did not write it")
    raise UserError(f"--force would delete {os.path.join(raw, foreign)} ({reason}); "
                    "move it away or choose another --out")


def fresh_output_dir(base: str) -> Path:
  """``base`` if it does not exist, else ``base-2``, ``base-3``, ... (the default output folders).

  Stale temporaries of earlier runs in the folder are removed first, and an
  earlier result a killed run had moved aside is put back (:func:`clean_stale`).
  """
  path = Path(base)
  clean_stale(path.parent)
  if not os.path.lexists(path):
    return path
  for i in range(2, 10_000):
    candidate = path.with_name(f"{path.name}-{i}")
    if not os.path.lexists(candidate):
      return candidate
  raise UserError(f"too many earlier outputs named {base}-N; pass --out DIR")


def check_output_dir(out: str | os.PathLike, *, force: bool, inputs: Iterable[Any] = (),
                     hint: str = "", flag: str = "--out") -> Path:
  """Validates an output folder before any work: every problem is a one-line UserError.

  Args:
    out: the folder the results go to.
    force: whether an existing folder of the kit's may be replaced.
    inputs: the command's input files; ``out`` may not hold any of them.
    hint: appended to the "already exists" message.
    flag: the option's name in messages.
  """
  path = check_folder_path(out, flag=flag)
  raw = os.fspath(out)
  _refuse_inputs(raw, inputs, flag, "holds")
  _refuse_foreign(path, raw, force, hint)
  _check_writable(path, raw, flag)
  return path


def check_folder_path(out: str | os.PathLike, *, flag: str = "--out") -> Path:
  """The checks of :func:`check_output_dir` that do not look inside an existing folder:
  not empty, ``.``, a parent of the current folder, ``/``, the home folder, a symbolic
  link or an existing non-folder, and a writable nearest existing ancestor."""
  raw = os.fspath(out)
  if not raw.strip():
    raise UserError(f"{flag} is empty; name a folder for the results, e.g. --out results")
  path = Path(raw)
  _refuse_special(path, raw, flag)
  if path.is_symlink():
    raise UserError(f"{flag} {raw} is a symbolic link; name the folder itself")
  if os.path.lexists(path) and not path.is_dir():
    raise UserError(f"{flag} {raw} exists and is not a folder")
  _check_parent(path, raw)
  return path


def check_output_file(out: str | os.PathLike, *, force: bool, command: str,
                      inputs: Iterable[Any] = (), flag: str = "--out") -> Path:
  """Validates a single output file (``compare --out FILE.json``), as :func:`check_output_dir`.

  An existing file is replaced only with ``force`` and only when it is a JSON
  result of the same ``command`` (its ``"command"`` field).
  """
  raw = os.fspath(out)
  if not raw.strip():
    raise UserError(f"{flag} is empty; name a file for the results, e.g. --out comparison.json")
  path = Path(raw)
  if path.is_symlink():
    raise UserError(f"{flag} {raw} is a symbolic link; name the file itself")
  if path.is_dir():
    raise UserError(f"{flag} {raw} is a folder; name a file, e.g. "
                    f"{os.path.join(raw, command + '.json')}")
  if os.path.lexists(path) and not path.is_file():
    raise UserError(f"{flag} {raw} exists and is not a regular file")
  _check_parent(path, raw)
  _refuse_inputs(raw, inputs, flag, "is")
  if path.exists():
    if not force:
      raise UserError(f"output file {raw} already exists (use --force to replace it)")
    try:
      data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
      data = None
    if not (isinstance(data, dict) and data.get("command") == command):
      raise UserError(f"--force would replace {raw}, which is not a cwsa-jax {command} result; "
                      "move it away or choose another --out")
  _check_writable(path, raw, flag)
  return path


# --------------------------------------------------------------------------- temporaries


def _temp_path(target: Path, kind: str) -> Path:
  return target.parent / temp_name(target.name, kind)


def _lock(path: Path) -> int | None:
  """An open descriptor of ``path`` holding an exclusive ``flock``; None if another holds it."""
  fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  except OSError:  # no flock on this file system: clean_stale asks whether the pid lives
    pass
  return fd


def _pid_alive(pid: int) -> bool:
  if pid == os.getpid():
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:
    return True
  return True


def clean_stale(parent: str | os.PathLike) -> None:
  """Removes the temporaries in ``parent`` that no live process holds; puts back an old
  result whose name is free (a kill between the two renames of a replacement)."""
  parent = Path(parent)
  try:
    entries = list(os.scandir(parent))
  except OSError:
    return
  for entry in entries:
    match = _TEMP.match(entry.name)
    if match is None or entry.is_symlink():
      continue
    path = Path(entry.path)
    try:
      fd = _lock(path)
    except OSError:
      continue
    if fd is None:
      continue  # its writer is alive
    try:
      if not _flock_works(fd) and _pid_alive(int(match["pid"])):
        continue
      target = parent / match["name"]
      if match["kind"] == "old" and entry.is_dir() and not os.path.lexists(target):
        os.rename(path, target)
      elif entry.is_dir(follow_symlinks=False):
        shutil.rmtree(path, ignore_errors=True)
      else:
        path.unlink()
    except OSError:
      pass
    finally:
      os.close(fd)


def _flock_works(fd: int) -> bool:
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    return e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
  return True


def _remove(path: Path) -> None:
  if path.is_dir() and not path.is_symlink():
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(FileNotFoundError):
      path.unlink()


# --------------------------------------------------------------------------- writing


def write_error(out: str | os.PathLike, error: OSError, tmp: Path | None = None) -> UserError:
  """``cannot write PATH: reason`` for an OSError, naming the file under ``out``, not the temporary."""
  name = os.fspath(out)
  filename = error.filename if isinstance(error.filename, str) else None
  if filename and tmp is not None and filename.startswith(os.fspath(tmp)):
    name = os.fspath(out) + filename[len(os.fspath(tmp)):]
  elif filename and tmp is None:
    name = filename
  reason = error.strerror or str(error)
  return UserError(f"cannot write {name}: {reason}")


@functools.lru_cache(maxsize=1)
def _renameat2() -> Any:
  """libc's ``renameat2`` (glibc >= 2.28), or None."""
  try:
    function = ctypes.CDLL(None, use_errno=True).renameat2
  except (OSError, AttributeError):
    return None
  function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
  function.restype = ctypes.c_int
  return function


def _exchange(a: Path, b: Path) -> bool:
  """Atomically swaps the paths ``a`` and ``b`` (Linux renameat2); False if not supported."""
  renameat2 = _renameat2()
  if renameat2 is None:
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
    return False
  raise OSError(code, os.strerror(code), os.fspath(b))


def _write_manifest(tmp: Path, command: str | None) -> None:
  files = sorted(p.name for p in tmp.iterdir() if p.name != MANIFEST)
  write_json_atomic(tmp / MANIFEST, {"tool": TOOL, "version": cwsa_jax.__version__,
                                     "command": command, "files": files})


def _replace(tmp: Path, out: Path) -> None:
  """Puts the complete folder ``tmp`` at ``out``, replacing an existing ``out``."""
  if not os.path.lexists(out):
    os.rename(tmp, out)
    return
  if not os.listdir(out):  # an empty folder: rename replaces it
    os.rename(tmp, out)
    return
  if _exchange(tmp, out):
    shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
    return
  old = _temp_path(out, "old")
  fd = _lock(out)  # the old folder stays locked while it is out of place
  try:
    os.rename(out, old)
    os.rename(tmp, out)
  finally:
    if fd is not None:
      os.close(fd)
  shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike, *, force: bool = False, inputs: Iterable[Any] = (),
                      command: str | None = None, hint: str = "") -> Iterator[Path]:
  """Yields a temporary folder that replaces ``out`` only if the block succeeds.

  ``out`` is checked as in :func:`check_output_dir` (again at the end, in case
  it changed meanwhile). The block writes its files into the yielded folder;
  on success a manifest listing them is added and the folder takes ``out``'s
  place atomically. On any error or Ctrl-C the temporary is removed and
  ``out`` is left as it was. An ``OSError`` becomes a one-line
  ``cannot write ...`` :class:`UserError`.
  """
  inputs = tuple(inputs)
  out = check_output_dir(out, force=force, inputs=inputs, hint=hint)
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out.parent)
    tmp = _temp_path(out, "tmp")
    os.mkdir(tmp, 0o777)
  except OSError as e:
    raise write_error(out, e) from None
  fd = _lock(tmp)
  token = _interrupt.register(lambda: shutil.rmtree(tmp, ignore_errors=True))
  try:
    try:
      yield tmp
      with _interrupt.committing():
        check_output_dir(out, force=force, inputs=inputs, hint=hint)
        _write_manifest(tmp, command)
        _replace(tmp, out)
    except OSError as e:
      raise write_error(out, e, tmp) from None
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    _interrupt.unregister(token)
    if fd is not None:
      os.close(fd)


def write_output_file(out: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``out`` atomically (a locked temporary beside it, then a rename).

  Check ``out`` first with :func:`check_output_file`.
  """
  out = Path(out)
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out.parent)
  except OSError as e:
    raise write_error(out, e) from None
  tmp = _temp_path(out, "tmp")
  token = _interrupt.register(lambda: _remove(tmp))
  fd = None
  try:
    try:
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
      with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      with os.fdopen(os.dup(fd), "w", encoding="utf-8") as f:
        f.write(text)
      with _interrupt.committing():
        os.replace(tmp, out)
    except OSError as e:
      raise write_error(out, e, tmp) from None
  except BaseException:
    _remove(tmp)
    raise
  finally:
    _interrupt.unregister(token)
    if fd is not None:
      os.close(fd)


def json_text(payload: Any) -> str:
  return json.dumps(payload, indent=1, allow_nan=True) + "\n"
