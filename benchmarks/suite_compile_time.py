"""Where the test suite's CPU time goes: JAX tracing, lowering and XLA compilation.

A pytest plugin and its summary in one file::

  PYTHONPATH=benchmarks CWSA_JAX_COMPILE_STATS=/tmp/stats ./dev.sh test -p suite_compile_time
  python benchmarks/suite_compile_time.py /tmp/stats

Each pytest process (the controller and every xdist worker) writes
``<pid>.json`` into the directory ``CWSA_JAX_COMPILE_STATS`` (created when
missing; a file of that name already there is left alone and nothing is
written): its own CPU seconds, the CPU seconds of the commands it started and
waited for, and, per ``jax.monitoring`` duration event (tracing, lowering,
backend compilation, persistent-cache retrieval), the summed seconds and the
count. The summary prints one JSON object: the sums over the workers and the
share of their CPU time spent compiling, ``(trace + lower + compile) / cpu``.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys

_ENV = "CWSA_JAX_COMPILE_STATS"
_EVENTS: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
# The events that count as compiling (JAX's names).
COMPILING = ("/jax/core/compile/jaxpr_trace_duration",
             "/jax/core/compile/jaxpr_to_mlir_module_duration",
             "/jax/core/compile/backend_compile_duration")


def _listener(event: str, duration: float, **kwargs) -> None:
  _EVENTS[event][0] += duration
  _EVENTS[event][1] += 1


def pytest_configure(config) -> None:
  import jax  # noqa: PLC0415 (only where the plugin is loaded)
  jax.monitoring.register_event_duration_secs_listener(_listener)


def pytest_sessionfinish(session, exitstatus) -> None:
  directory = os.environ.get(_ENV)
  if not directory:
    return
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  record = {
      "worker": os.environ.get("PYTEST_XDIST_WORKER"),
      "cpu_s": own.ru_utime + own.ru_stime,
      "children_cpu_s": children.ru_utime + children.ru_stime,
      "events": {name: {"seconds": s, "count": n} for name, (s, n) in sorted(_EVENTS.items())},
  }
  os.makedirs(directory, exist_ok=True)
  try:
    with open(os.path.join(directory, f"{os.getpid()}.json"), "x") as f:
      json.dump(record, f, indent=1)
  except FileExistsError:
    pass


def summarize(records: list[dict]) -> dict:
  """Sums over the processes that ran tests (the workers, or the one process without xdist)."""
  workers = [r for r in records if r["worker"]] or records
  events: dict[str, dict] = {}
  for r in workers:
    for name, e in r["events"].items():
      total = events.setdefault(name, {"seconds": 0.0, "count": 0})
      total["seconds"] += e["seconds"]
      total["count"] += e["count"]
  cpu = sum(r["cpu_s"] for r in workers)
  compiling = sum(events.get(name, {"seconds": 0.0})["seconds"] for name in COMPILING)
  return {
      "processes": len(workers),
      "cpu_s": round(cpu, 1),
      "commands_cpu_s": round(sum(r["children_cpu_s"] for r in workers), 1),
      "compiling_s": round(compiling, 1),
      "compiling_share": round(compiling / cpu, 3) if cpu else None,
      "events": {name: {"seconds": round(e["seconds"], 1), "count": e["count"]}
                 for name, e in sorted(events.items())},
  }


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print("usage: python benchmarks/suite_compile_time.py DIRECTORY", file=sys.stderr)
    return 2
  paths = sorted(glob.glob(os.path.join(argv[0], "*.json")))
  if not paths:
    print(f"suite_compile_time: no records in {argv[0]}", file=sys.stderr)
    return 2
  records = []
  for path in paths:
    with open(path) as f:
      records.append(json.load(f))
  print(json.dumps(summarize(records), indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
