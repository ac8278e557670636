#!/usr/bin/env bash
# One lease of a GPU machine, in under 10 minutes: the accelerator benchmarks, then as much of the
# training study (python -m cwsa_jax.training.study) as fits, several runs sharing the GPU.
#
#   benchmarks/gpu_session.sh OUT DATA_DIR [WHEELS_DIR] [BUDGET_S]
#
# OUT receives gpu.json (benchmarks/accelerator.py), logs.tar.gz (every log) and one
# runs-DATASET-sSEED.tar.gz per dataset and seed (the finished run folders without their checkpoints).
# DATA_DIR holds mnist/ and cifar10/. The machine's python3 must have jax with a GPU, flax and optax;
# if a 3-step CPU smoke run fails with its flax/optax, the wheels in WHEELS_DIR (the versions this
# repository is tested with) go first on PYTHONPATH. Nothing is installed; cwsa_jax and its training
# package are copied to a temporary folder laid out as the wheel lays them out.
# Tested on a CPU with: JAX_PLATFORMS=cpu QUICK=1 benchmarks/gpu_session.sh /tmp/gpu-out DATA
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; data=$(realpath "$2"); wheels=${3:+$(realpath "$3")}; budget=${4:-575}
mkdir -p "$out"; out=$(realpath "$out")
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
logs=$(mktemp -d)
pkg=$(mktemp -d)
cp -r cwsa_jax "$pkg/" && cp -r training "$pkg/cwsa_jax/training"
export PYTHONPATH="$pkg" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
py=${PYTHON:-python3}
"$py" -c 'import jax, numpy, sys; print("python", sys.version.split()[0], "jax", jax.__version__, jax.devices())' \
  2>&1 | tee "$logs/env.txt"
"$py" -c 'import flax, optax; print("flax", flax.__version__, "optax", optax.__version__)' >>"$logs/env.txt" 2>&1
nvidia-smi >>"$logs/env.txt" 2>&1

# The training runs start in $pkg: a cwsa_jax in the current folder would shadow the copy there.
cli=(-c 'import sys; from cwsa_jax.cli import main; sys.exit(main())')
smoke() {  # a 3-step MNIST run on the CPU: do this flax/optax train?
  cd "$pkg" && JAX_PLATFORMS=cpu timeout 240 "$py" "${cli[@]}" train --dataset mnist --max-steps 3 \
    --data-dir "$data" --out "$(mktemp -d)/smoke" --no-progress
}
# On the CPU, while the GPU benchmarks run: the smoke runs, and CIFAR-10 decoded once into the cache.
(smoke >"$logs/smoke-installed.log" 2>&1; echo "exit $?" >>"$logs/smoke-installed.log") &
smoke_installed=$!
if [ -n "$wheels" ]; then
  site=$(mktemp -d)
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl \
    >"$logs/wheels.log" 2>&1
  (PYTHONPATH="$site:$PYTHONPATH" smoke >"$logs/smoke-wheels.log" 2>&1
   echo "exit $?" >>"$logs/smoke-wheels.log") &
  smoke_wheels=$!
fi
(cd "$pkg" && JAX_PLATFORMS=cpu "$py" -c "from cwsa_jax.training import data; print(data.load_dataset('cifar10', data_dir='$data').source)" \
  >"$logs/cifar-cache.log" 2>&1) &
cache=$!

if [ -n "${QUICK:-}" ]; then bench=(--quick); else bench=(--sizes 1e8,1e7,1e6 --deadline-s 170); fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout 250 "$py" benchmarks/accelerator.py "${bench[@]}" --out "$out/gpu.json" \
    >"$logs/gpu-stdout.json" 2>"$logs/bench.log"
  echo "bench exit $? at $((SECONDS - start)) s" | tee -a "$logs/env.txt"
fi

wait "$smoke_installed" "$cache"
if tail -1 "$logs/smoke-installed.log" | grep -q "exit 0"; then
  echo "training with the machine's flax/optax" | tee -a "$logs/env.txt"
elif [ -n "$wheels" ] && wait "$smoke_wheels" && tail -1 "$logs/smoke-wheels.log" | grep -q "exit 0"; then
  export PYTHONPATH="$site:$PYTHONPATH"
  echo "training with the carried flax/optax wheels" | tee -a "$logs/env.txt"
else
  echo "no flax/optax that trains; no study" | tee -a "$logs/env.txt"
fi

remaining=$(left)
if [ "$remaining" -gt 120 ]; then
  jobs=${JOBS:-9}
  study=(--seeds 0,1,2)
  [ -n "${QUICK:-}" ] && study=(--seeds 0,1 --variants ce,focal --max-steps 5)
  cd "$pkg" && timeout $((remaining - 25)) "$py" -m cwsa_jax.training.study --data-dir "$data" --out "$logs/runs" \
    "${study[@]}" --jobs "$jobs" --deadline-s $((remaining - 170)) --stop-after-s $((remaining - 60)) \
    2>&1 | tee "$logs/study.log"
fi

# Finished runs (with metrics.json), without checkpoints: one archive per dataset and seed.
for metrics in "$logs"/runs/*/metrics.json; do
  [ -e "$metrics" ] || continue
  run=$(basename "$(dirname "$metrics")")
  echo "$run" >>"$logs/runs-$(echo "$run" | sed -E 's/^([a-z0-9]+)-.*-(s[0-9]+)$/\1-\2/').list"
done
for list in "$logs"/runs-*.list; do
  [ -e "$list" ] || continue
  tar czf "$out/$(basename "$list" .list).tar.gz" -C "$logs/runs" --exclude=checkpoint.msgpack \
    $(cat "$list")
done
tar czf "$out/logs.tar.gz" -C "$logs" --exclude=runs --exclude='*.list' . -C "$logs/runs" \
  $(cd "$logs/runs" 2>/dev/null && ls *.log 2>/dev/null)
ls -la "$out"
echo "gpu_session: done in $((SECONDS - start)) s"
