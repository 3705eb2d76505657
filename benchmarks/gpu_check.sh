#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one prepared run (issue: σN-Ens at the bound):
# ResNet-18 and WideResNet-28-10 at B=128, M=4 with eager steps, CUDA-graphed steps and
# compiled steps; σN-Ens and FiLM on the PyTorch reference path (the kernels' "before"); the M
# scaling of ResNet-18 (eager); every method's graphed-vs-eager check (benchmarks/gpu_graphs.py);
# and, where the shared GPU instruments were copied to .gpu-tools/, the profiler summary and
# torch-uncertainty's anchors with the naive σNorm prototype in the same lease. Each bench row is
# timed as the bare synthetic step and through the real training loop (`--loop real`). Writes
# JSON and logs into $OUT (default artifacts/gpu) and the Markdown tables into
# $OUT/benchmarks.md.
#
#   benchmarks/gpu_check.sh            # on a machine with a GPU and the harness installed
#   SMALL=1 benchmarks/gpu_check.sh    # the same commands at a tiny size, to check on a CPU
#   PARTS="eager graphed" benchmarks/gpu_check.sh   # a subset of: eager reference graphed
#                                      # graphs scaling compile tools (default: all but compile)
#   LIMIT=120 benchmarks/gpu_check.sh  # each command's time limit in seconds (default 150)
#
# Each command has its own time limit so one slow compile cannot lose the other results; the
# eager rows come first, so a run cut short still has them. Every command rewrites its JSON after
# each measured row (atomically; `"complete": false` until the last), so a command killed at its
# limit keeps the rows it measured and the tables are made from them.
set -uo pipefail
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  # tiny inputs and few methods: proves every command and the Markdown step on a CPU in minutes
  size=(--batch 4 --image-size 8 --classes 10 --steps 1 --warmup 1); limit=${LIMIT:-300}
  r18=(--methods sigma_ens deep_ensemble); wrn=(--methods sigma_ens)
else
  size=(--batch 128 --image-size 32 --classes 100 --steps 30 --warmup 10); limit=${LIMIT:-150}
  r18=(); wrn=(--methods sigma_ens film_ensemble packed_ensemble:alpha=2,gamma=2 batch_ensemble
    mc_dropout deep_ensemble)
fi
run() {  # run NAME ARGS...: one bench, its output tee'd to $OUT/NAME.log
  local name=$1; shift
  echo "=== $name: harness bench $*"
  timeout "$limit" harness bench --loop real "$@" "${size[@]}" -o "$OUT/$name.json" 2>&1 \
    | tee "$OUT/$name.log"
}
PARTS=${PARTS:-eager reference graphed graphs scaling tools}
want() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee "$OUT/versions.txt"
if want eager; then
  run resnet18_M4 --backbone resnet18 --M 4 --cuda-graph off "${r18[@]}"
  run wrn28_10_M4 --backbone wrn28_10 --M 4 --cuda-graph off "${wrn[@]}"
fi
if want reference; then  # σNorm on the PyTorch path: what the Triton kernels replace
  HARNESS_SIGMA_KERNELS=reference run resnet18_M4_reference --backbone resnet18 --M 4 \
    --cuda-graph off --methods sigma_ens film_ensemble
fi
if want graphed; then
  run resnet18_M4_graphed --backbone resnet18 --M 4 --cuda-graph auto "${r18[@]}"
  run wrn28_10_M4_graphed --backbone wrn28_10 --M 4 --cuda-graph auto "${wrn[@]}"
fi
if want graphs; then  # three graphed steps = three eager steps, every method
  timeout "$limit" python benchmarks/gpu_graphs.py 2>&1 | tee "$OUT/graphs.jsonl"
fi
want scaling && for m in 2 8 16; do
  if [ "${SMALL:-0}" = 1 ]; then ms=(sigma_ens); else
    ms=(sigma_ens packed_ensemble:alpha=2,gamma=2 batch_ensemble); fi
  run "resnet18_M$m" --backbone resnet18 --M "$m" --cuda-graph off --methods "${ms[@]}"
done
if want compile && [ "${SMALL:-0}" != 1 ]; then  # inductor on a CPU takes minutes: GPU only
  run resnet18_M4_compile --backbone resnet18 --M 4 --compile --methods sigma_ens film_ensemble
  run wrn28_10_M4_compile --backbone wrn28_10 --M 4 --compile --methods sigma_ens
fi
if want tools && [ -d .gpu-tools ] && [ "${SMALL:-0}" != 1 ]; then  # the shared instruments
  timeout "$limit" python .gpu-tools/sigma_profile.py 2>&1 | tee "$OUT/profile.txt"
  timeout "$limit" python .gpu-tools/anchor_gpu_bench.py --archs resnet18 --no-compile 2>&1 \
    | tee "$OUT/anchors.jsonl"
fi
# The tables for docs/benchmarks.md, from whichever JSON files were written.
shopt -s nullglob
jsons=("$OUT"/resnet18_M4.json "$OUT"/resnet18_M4_reference.json "$OUT"/resnet18_M4_graphed.json \
  "$OUT"/resnet18_M4_compile.json "$OUT"/wrn28_10_M4.json "$OUT"/wrn28_10_M4_graphed.json \
  "$OUT"/wrn28_10_M4_compile.json "$OUT"/resnet18_M2.json "$OUT"/resnet18_M8.json \
  "$OUT"/resnet18_M16.json)
present=()
for f in "${jsons[@]}"; do [ -f "$f" ] && present+=("$f"); done
python benchmarks/bench_markdown.py "${present[@]}" > "$OUT/benchmarks.md" \
  && echo "wrote $OUT/benchmarks.md"
ls -l "$OUT"
