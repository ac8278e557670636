"""Static code of the dense GPU kernels for an H100 (sm_90), compiled on any machine, no GPU.

Usage: python benchmarks/kernel_code_stats.py [--triton-python PY] [--out FILE]
       python benchmarks/kernel_code_stats.py --ttir-only DIR    (jax only: writes the TTIR)

For each launch in :data:`LAUNCHES` (a form of ``_dense.row_sums``, samples per
step, warps, pipeline stages, at a mask height and a number of live rows), the
kernel is lowered for CUDA on this machine (Pallas' Triton lowering, as on a
GPU) and its Triton IR compiled for sm_90 by the ``triton`` package
(``pip install triton``; ``--triton-python`` names an interpreter that has it,
default this one). From the cubin (the triton wheel's ``cuobjdump``) it
reports registers, local memory (spills), the loop's SASS instructions per
sample (per program, and over the programs that read each sample: "unrolled"
shares more than 32 live rows evenly among programs), the instruction mix, and the global loads per
thread in flight per loop step.

These are static counts, not timings: they say how much work a kernel issues
per sample and how many bytes each thread has in flight, which bound its speed
(an H100 issues about 9e11 warp instructions a second), but the time on a
GPU comes only from ``gpu_choices.py`` there. JSON on stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# (name, form, samples per step, warps, stages, mask rows, live rows)
LAUNCHES = (
    ("sweep_T10", "lanes", 128, 4, 3, 16, 11),
    ("sweep_T10", "unrolled", 128, 4, 2, 16, 11),
    ("sweep_T10", "unrolled", 512, 4, 2, 16, 11),
    ("sweep_T10", "unrolled", 1024, 4, 2, 16, 11),
    ("sweep_T10", "unrolled", 1024, 8, 2, 16, 11),
    ("sweep_T10", "bits", 256, 4, 2, 16, 11),
    ("ece_15_bins", "lanes", 128, 4, 3, 16, 15),
    ("ece_15_bins", "unrolled", 512, 4, 2, 16, 15),
    ("sweep_T20", "unrolled", 512, 4, 2, 32, 21),
    ("sweep_T20", "bits", 256, 4, 2, 32, 21),
    ("sweep_T50", "bits", 256, 4, 2, 64, 51),
    ("sweep_T50", "unrolled", 512, 4, 2, 64, 51),
)
_N = 10 ** 8


def ttir(form: str, block: int, warps: int, stages: int, num_rows: int, live: int) -> str:
  """The Triton IR (text) of ``_dense.row_sums`` for n = 1e8, lowered for CUDA on this machine."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from jax._src.pallas.triton import pallas_call_registration as registration  # noqa: PLC0415

  from cwsa_jax._kernels import _dense  # noqa: PLC0415
  captured = []
  lower = registration.lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = lower(*args, **kwargs)
    captured.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  inner = np.linspace(0.5, 0.95, live - 1)
  rows = jnp.asarray(np.concatenate([[-np.inf], inner, np.full(num_rows - live, np.inf)]),
                     jnp.float32)
  registration.lowering.lower_jaxpr_to_triton_module = capture
  try:
    jax.jit(lambda c, k: _dense.row_sums(c, k, rows, unit=True, form=form, block=block,
                                         num_warps=warps, num_stages=stages, live=live)).trace(
        jax.ShapeDtypeStruct((1, _N), jnp.float32),
        jax.ShapeDtypeStruct((1, _N), jnp.bool_)).lower(lowering_platforms=("cuda",))
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = lower
  return captured[-1]


def compile_stats(path: str, warps: int, stages: int) -> dict:
  """Registers, spills and the loop of the TTIR at ``path`` compiled for sm_90 (needs triton)."""
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default jax's Triton uses
  import triton  # noqa: PLC0415
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))
  cubin = path + ".cubin"
  with open(cubin, "wb") as f:
    f.write(kernel.asm["cubin"])
  usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin],
                         capture_output=True, text=True, check=True).stdout
  sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin],
                        capture_output=True, text=True, check=True).stdout
  code = [(int(m.group(1), 16), m.group(2).strip()) for m in
          (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line) for line in sass.splitlines())
          if m]
  loops = []
  for address, text in code:
    target = re.search(r"\bBRA 0x([0-9a-f]+)", text)
    if target and int(target.group(1), 16) < address:  # a backward branch closes a loop
      body = [t for a, t in code if int(target.group(1), 16) <= a <= address]
      mix: dict[str, int] = {}
      for t in body:
        op = (t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
        mix[op] = mix.get(op, 0) + 1
      loops.append({"instructions": len(body),
                    "global_loads": sum(1 for t in body if "LDG" in t),
                    "mix": dict(sorted(mix.items(), key=lambda x: -x[1])[:10])})
  res = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
  return {"registers": int(res.group(1)), "local_bytes": int(res.group(4)),
          "shared_bytes": int(res.group(3)), "spill_stores": sass.count("STL"),
          "loops": loops, "triton": triton.__version__}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--triton-python", default=sys.executable,
                      help="a Python with the triton package (default: this one)")
  parser.add_argument("--out", default=None)
  parser.add_argument("--ttir-only", metavar="DIR", default=None,
                      help="write each launch's TTIR into DIR and stop (needs jax only)")
  parser.add_argument("--compile", nargs=3, metavar=("TTIR", "WARPS", "STAGES"),
                      help=argparse.SUPPRESS)  # the triton interpreter's half
  args = parser.parse_args(argv)
  if args.compile:
    print(json.dumps(compile_stats(args.compile[0], int(args.compile[1]), int(args.compile[2]))))
    return 0
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from _common import emit  # noqa: PLC0415
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    folder = args.ttir_only or scratch
    os.makedirs(folder, exist_ok=True)
    for name, form, block, warps, stages, num_rows, live in LAUNCHES:
      label = f"{name}_{form}_b{block}_w{warps}_s{stages}"
      path = os.path.join(folder, label + ".ttir")
      with open(path, "w") as f:
        f.write(ttir(form, block, warps, stages, num_rows, live))
      row = {"case": name, "form": form, "block": block, "warps": warps, "stages": stages,
             "mask_rows": num_rows, "live_rows": live}
      if not args.ttir_only:
        done = subprocess.run([args.triton_python, os.path.abspath(__file__), "--compile", path,
                               str(warps), str(stages)], capture_output=True, text=True)
        if done.returncode:
          print(f"{label}: compile failed: {done.stderr.strip()[-400:]}", file=sys.stderr)
          return 1
        stats = json.loads(done.stdout)
        # The loop most programs run: "unrolled" has a second one, with bounds checks, for the
        # program that reads past n.
        loop = min(stats["loops"], key=lambda x: x["instructions"])
        per_thread = block / (32 * warps)  # one pass of the loop: a step over the CTA's threads
        # "unrolled" shares more than 32 live rows evenly among programs over the same samples
        groups = -(-live // 32) if form == "unrolled" else 1
        row.update(stats, loop_instructions_per_sample=loop["instructions"] / per_thread,
                   programs_per_sample=groups,
                   instructions_per_sample_all_programs=groups * loop["instructions"] / per_thread,
                   loads_in_flight_per_thread=loop["global_loads"])
        print(f"{label:<40} {row['instructions_per_sample_all_programs']:7.1f} instr/sample "
              f"{stats['registers']:4d} regs {stats['local_bytes']:3d} B local "
              f"{loop['global_loads']:3d} loads/step", file=sys.stderr)
      rows.append(row)
  if args.ttir_only:
    print(json.dumps({"ttir": folder, "launches": len(rows)}))
    return 0
  emit("kernel_code_stats", {"target": "sm_90 (H100)", "n": _N,
                              "note": "static counts of the compiled code, not timings",
                              "rows": rows}, out=args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
