#!/usr/bin/env bash
# The GPU check of σN-Ens at the bound, in at most 480 s, writing only under $OUT:
#
#   OUT=artifacts/gpu benchmarks/gpu_check.sh          # on a machine with a GPU
#   SMALL=1 OUT=/tmp/gpu benchmarks/gpu_check.sh       # the same parts at a tiny size, on a CPU
#
# On an offline GPU machine that has only torch, first install the wheels that
# benchmarks/gpu_wheels.sh prepares (README, "On a GPU"). Parts, each with its own time budget
# (seconds; they add up to 480, so the worst case is known before the run):
#   eager     55  harness bench --loop real, ResNet-18, B=128, M=4: bound, σN-Ens, FiLM
#   graphed   55  the same with the CUDA-graphed step
#   compiled 150  the same under torch.compile (σN-Ens only; compilation dominates)
#   wrn       80  WRN-28-10, σN-Ens eager then graphed (40 each)
#   kernels   30  kernels per training step, bound and σN-Ens (torch.profiler)
#   cell      40  a real 2-epoch σN-Ens cell: each epoch's step mode (the recapture check)
#   graphs    50  every method: three graphed steps = three eager steps
#   table     20  the one table (benchmarks/gpu_table.py), printed and in $OUT/table.md
# A part cut at its budget keeps what it measured (the bench rewrites its JSON after every row)
# and shows "-" in the table. PARTS="eager cell" runs a subset.
set -uo pipefail
ALL="eager graphed compiled wrn kernels cell graphs"
PARTS=${PARTS:-$ALL}
for p in $PARTS; do  # a misspelt part would be skipped silently: refuse it before anything runs
  [[ " $ALL " == *" $p "* ]] || { echo "gpu_check.sh: unknown part '$p' (parts: $ALL)" >&2; exit 2; }
done
OUT=${OUT:-artifacts/gpu}
if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then
  echo "gpu_check.sh: OUT=$OUT is not a folder" >&2; exit 2
fi
OUT=$(realpath -m "$OUT")  # relative to where it was started, not to the repository
cd "$(dirname "$0")/.."
mkdir -p "$OUT/.cache" || { echo "gpu_check.sh: cannot create $OUT" >&2; exit 2; }
# this run's results only: a table never mixes in an earlier run's parts
rm -rf "$OUT"/resnet18_*.json "$OUT"/wrn28_10_*.json "$OUT/kernels.json" "$OUT/cell" \
  "$OUT/graphs.jsonl" "$OUT/table.md"
# Compiler caches and the cell's data under $OUT too (removed at the end): nothing elsewhere.
export TRITON_CACHE_DIR="$OUT/.cache/triton" TORCHINDUCTOR_CACHE_DIR="$OUT/.cache/inductor"
export HARNESS_DATA_ROOT="$OUT/.cache/data" PYTHONDONTWRITEBYTECODE=1 OUT
if [ "${SMALL:-0}" = 1 ]; then  # the same commands on the CPU: digits CNN, 8×8, a few steps
  r18=(--backbone digits_cnn --image-size 8 --classes 10 --batch 4 --steps 2 --warmup 1)
  wrn=("${r18[@]}")
else
  r18=(--backbone resnet18 --image-size 32 --classes 100 --batch 128 --steps 20 --warmup 5)
  wrn=(--backbone wrn28_10 --image-size 32 --classes 100 --batch 128 --steps 10 --warmup 5)
fi
want() { [[ " $PARTS " == *" $1 "* ]]; }
failed=()
part() {  # part NAME BUDGET COMMAND...: run it under its budget, output tee'd to $OUT/NAME.log
  local name=$1 budget=$2; shift 2
  echo "=== [$SECONDS s] $name (budget ${budget} s): $*"
  timeout "$budget" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ]; then  # cut at its budget: what it measured is kept and shown
    echo "=== $name: cut at its ${budget} s budget"
  elif [ "$rc" != 0 ]; then
    echo "=== $name: failed (exit $rc)"; failed+=("$name")
  fi
  return 0
}
bench=(harness bench --loop real --M 4)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no GPU"
  git rev-parse HEAD 2>/dev/null
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/provenance.txt" 2>&1
cat "$OUT/provenance.txt"
want eager && part resnet18_eager 55 "${bench[@]}" "${r18[@]}" --cuda-graph off \
  --methods sigma_ens film_ensemble -o "$OUT/resnet18_eager.json"
want graphed && part resnet18_graphed 55 "${bench[@]}" "${r18[@]}" --cuda-graph auto \
  --methods sigma_ens film_ensemble -o "$OUT/resnet18_graphed.json"
want compiled && part resnet18_compiled 150 "${bench[@]}" "${r18[@]}" --compile --methods sigma_ens \
  -o "$OUT/resnet18_compiled.json"
if want wrn; then
  part wrn28_10_eager 40 "${bench[@]}" "${wrn[@]}" --cuda-graph off --methods sigma_ens \
    -o "$OUT/wrn28_10_eager.json"
  part wrn28_10_graphed 40 "${bench[@]}" "${wrn[@]}" --cuda-graph auto --methods sigma_ens \
    -o "$OUT/wrn28_10_graphed.json"
fi
want kernels && part kernels 30 python benchmarks/kernels_per_step.py -o "$OUT/kernels.json"
want cell && part cell 40 python benchmarks/gpu_cell.py
want graphs && part graphs 50 sh -c 'python benchmarks/gpu_graphs.py > "$OUT/graphs.jsonl"; cat "$OUT/graphs.jsonl"'
rm -rf "$OUT/.cache"
echo "=== [$SECONDS s] table"
timeout 20 python benchmarks/gpu_table.py "$OUT" | tee "$OUT/table.md"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check.sh: parts failed: ${failed[*]} (their logs are in $OUT)" >&2
  exit 1
fi
