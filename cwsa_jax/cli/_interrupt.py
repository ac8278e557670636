"""Ctrl-C for the command line: exit status 130 within seconds, no partial output.

Python runs a SIGINT handler only in the main thread and only between two
bytecodes, so a Ctrl-C that arrives during one long call into XLA waits for
the call to return, and one that arrives while a ``__del__`` method, a weakref
callback or a gc callback runs (JAX registers one; matplotlib's figures free
many objects) raises its ``KeyboardInterrupt`` where Python prints and drops it
("Exception ignored in ..."): the run went on and ended with status 0.

:func:`guard` makes both impossible for one command:

- every SIGINT sets a flag; the output code checks it (:func:`committing`)
  before anything becomes visible, so a dropped ``KeyboardInterrupt`` still
  aborts the run (and is not printed);
- a watchdog thread is woken through :func:`signal.set_wakeup_fd` (the C-level
  handler writes to it at once, whatever the main thread is doing); when the
  command has not ended ``GRACE_SECONDS`` after the Ctrl-C (or at once on a
  second Ctrl-C) it runs the registered cleanups (the temporaries of the
  output being written), prints one line and ends the process with status
  130. It waits for a commit in progress, which is a few renames.

The watchdog needs the GIL, which a call into XLA may hold until it returns
(seen on the first run of a freshly compiled computation), so long
computations are split into short calls instead: the bootstrap runs in blocks
(:func:`cwsa_jax._bootstrap.run_blocks`), each well under a second at the
command line's sizes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Iterator

EXIT_INTERRUPTED = 130
GRACE_SECONDS = 2.0

_interrupted = threading.Event()
_lock = threading.RLock()  # held while output is committed and while cleanups run
_cleanups: dict[int, Callable[[], None]] = {}
_deferring = 0


def interrupted() -> bool:
  """Whether a SIGINT arrived during the current command."""
  return _interrupted.is_set()


def check() -> None:
  """Raises ``KeyboardInterrupt`` if a SIGINT arrived (even one whose exception was dropped)."""
  if _interrupted.is_set():
    raise KeyboardInterrupt


def register(cleanup: Callable[[], None]) -> int:
  """Registers ``cleanup`` (removes a temporary) to run if the process is ended by force."""
  with _lock:
    token = id(cleanup)
    _cleanups[token] = cleanup
    return token


def unregister(token: int) -> None:
  with _lock:
    _cleanups.pop(token, None)


@contextlib.contextmanager
def committing() -> Iterator[None]:
  """The block that makes output visible: aborted before it starts if a SIGINT came, and
  not interrupted half-way (a SIGINT inside it is raised when it ends)."""
  global _deferring
  with _lock:
    check()
    _deferring += 1
    try:
      yield
    finally:
      _deferring -= 1
  check()


def exit_now() -> None:
  """Ends the process with status 130 without the interpreter's teardown.

  After a Ctrl-C that interrupted JAX half-way (tracing, compiling or running
  a computation), the teardown can crash (SIGSEGV, seen with the persistent
  compilation cache); the output is already cleaned up by then, so the
  command line ends here instead.
  """
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(EXIT_INTERRUPTED)


def _on_sigint(signum, frame) -> None:  # noqa: ARG001
  first = not _interrupted.is_set()
  _interrupted.set()
  if first and not _deferring:
    raise KeyboardInterrupt


def _force_exit(label: str) -> None:
  with _lock:  # a commit in progress finishes first
    for cleanup in list(_cleanups.values()):
      with contextlib.suppress(BaseException):
        cleanup()
    with contextlib.suppress(Exception):
      sys.stdout.flush()
    with contextlib.suppress(OSError):
      # A progress bar left mid-line (its owner never got to close it) ends first.
      os.write(2, f"{chr(10) if _bar_open() else ''}{label}: interrupted\n".encode())
    os._exit(EXIT_INTERRUPTED)


def _bar_open() -> bool:
  """Whether a tqdm bar is on screen (tqdm is not imported for this)."""
  tqdm = sys.modules.get("tqdm")
  return bool(tqdm is not None and getattr(tqdm.tqdm, "_instances", None))


def _watch(read_fd: int, done: threading.Event, label: str, grace: float) -> None:
  deadline = None
  count = 0
  while True:
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([read_fd], [], [], timeout)
    if ready:
      try:
        data = os.read(read_fd, 256)
      except OSError:
        return
      if not data or 0 in data:  # guard() is done
        return
      count += data.count(signal.SIGINT)
      if count == 1 and deadline is None:
        deadline = time.monotonic() + grace
      if count >= 2:
        break
    elif deadline is not None:
      break
  if not done.is_set():
    _force_exit(label)


@contextlib.contextmanager
def guard(label: str, *, grace: float | None = None) -> Iterator[None]:
  """SIGINT handling for one command (see the module docstring); a no-op outside the main
  thread or where SIGINT is ignored (a background job started with ``nohup``).

  ``grace`` (default ``GRACE_SECONDS``) is how long the watchdog lets the main thread
  clean up and return after a Ctrl-C.
  """
  grace = GRACE_SECONDS if grace is None else grace
  _interrupted.clear()
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
    yield
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  old_handler = signal.signal(signal.SIGINT, _on_sigint)
  old_hook = sys.unraisablehook

  def quiet_hook(unraisable):
    # The KeyboardInterrupt Python drops in a gc or weakref callback: the flag has it.
    if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupted.is_set()):
      old_hook(unraisable)

  sys.unraisablehook = quiet_hook
  done = threading.Event()
  watchdog = threading.Thread(target=_watch, args=(read_fd, done, label, grace), daemon=True,
                              name="cwsa-jax-interrupt")
  watchdog.start()
  try:
    yield
  finally:
    done.set()
    signal.signal(signal.SIGINT, old_handler)
    sys.unraisablehook = old_hook
    signal.set_wakeup_fd(old_fd)
    with contextlib.suppress(OSError):
      os.write(write_fd, b"\0")
    watchdog.join(timeout=5.0)
    os.close(write_fd)
    if not watchdog.is_alive():
      os.close(read_fd)
