#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one prepared run (about 8 minutes on an H200):
# ResNet-18 and WideResNet-28-10 at B=128, M=4, eager and compiled, and the M scaling of
# ResNet-18. Writes JSON files into $OUT (default artifacts/gpu).
#
#   benchmarks/gpu_check.sh            # on a machine with a GPU and the harness installed
#   SMALL=1 benchmarks/gpu_check.sh    # the same commands at a tiny size, to check on a CPU
#
# Each command has its own time limit so one slow compile cannot lose the other results.
set -uo pipefail
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  size=(--batch 16 --image-size 8 --classes 10 --steps 1 --warmup 1); limit=300
else
  size=(--batch 128 --image-size 32 --classes 100 --steps 30 --warmup 10); limit=240
fi
run() {  # run NAME ARGS...: one bench, its output tee'd to $OUT/NAME.log
  local name=$1; shift
  echo "=== $name: harness bench $*"
  timeout "$limit" harness bench "$@" "${size[@]}" -o "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
run resnet18_M4 --backbone resnet18 --M 4
run wrn28_10_M4 --backbone wrn28_10 --M 4
if [ "${SMALL:-0}" != 1 ]; then  # inductor on a CPU takes minutes per model: GPU only
  run resnet18_M4_compile --backbone resnet18 --M 4 --compile --methods sigma_ens film_ensemble
  run wrn28_10_M4_compile --backbone wrn28_10 --M 4 --compile --methods sigma_ens
fi
for m in 2 8 16; do
  run "resnet18_M$m" --backbone resnet18 --M "$m" \
    --methods sigma_ens packed_ensemble:alpha=2,gamma=2 batch_ensemble
done
ls -l "$OUT"
