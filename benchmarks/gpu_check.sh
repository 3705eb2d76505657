#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one prepared run: ResNet-18 and WideResNet-28-10
# at B=128, M=4, eager and compiled, and the M scaling of ResNet-18, each row timed both as the
# bare synthetic step and through the real training loop (`--loop real`: train_epoch, the
# recipe's optimizer and schedule, device-resident data with augmentation), so the ratio
# real/synthetic is a column. Writes JSON and logs into $OUT (default artifacts/gpu) and the
# Markdown tables for docs/benchmarks.md into $OUT/benchmarks.md.
#
#   benchmarks/gpu_check.sh            # on a machine with a GPU and the harness installed
#   SMALL=1 benchmarks/gpu_check.sh    # the same commands at a tiny size, to check on a CPU
#   PARTS=eager benchmarks/gpu_check.sh   # a subset: any of eager, compile, scaling (default all)
#   LIMIT=120 benchmarks/gpu_check.sh      # each command's time limit in seconds (default 300)
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
  size=(--batch 128 --image-size 32 --classes 100 --steps 30 --warmup 10); limit=${LIMIT:-300}
  r18=(); wrn=()
fi
run() {  # run NAME ARGS...: one bench, its output tee'd to $OUT/NAME.log
  local name=$1; shift
  echo "=== $name: harness bench $*"
  timeout "$limit" harness bench --loop real "$@" "${size[@]}" -o "$OUT/$name.json" 2>&1 \
    | tee "$OUT/$name.log"
}
PARTS=${PARTS:-eager compile scaling}
want() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
if want eager; then
  run resnet18_M4 --backbone resnet18 --M 4 "${r18[@]}"
  run wrn28_10_M4 --backbone wrn28_10 --M 4 "${wrn[@]}"
fi
if want compile && [ "${SMALL:-0}" != 1 ]; then  # inductor on a CPU takes minutes: GPU only
  run resnet18_M4_compile --backbone resnet18 --M 4 --compile --methods sigma_ens film_ensemble
  run wrn28_10_M4_compile --backbone wrn28_10 --M 4 --compile --methods sigma_ens
fi
want scaling && for m in 2 8 16; do
  if [ "${SMALL:-0}" = 1 ]; then ms=(sigma_ens); else
    ms=(sigma_ens packed_ensemble:alpha=2,gamma=2 batch_ensemble); fi
  run "resnet18_M$m" --backbone resnet18 --M "$m" --methods "${ms[@]}"
done
# The tables for docs/benchmarks.md, from whichever JSON files were written.
shopt -s nullglob
jsons=("$OUT"/resnet18_M4.json "$OUT"/resnet18_M4_compile.json "$OUT"/wrn28_10_M4.json \
  "$OUT"/wrn28_10_M4_compile.json "$OUT"/resnet18_M2.json "$OUT"/resnet18_M8.json \
  "$OUT"/resnet18_M16.json)
present=()
for f in "${jsons[@]}"; do [ -f "$f" ] && present+=("$f"); done
python benchmarks/bench_markdown.py "${present[@]}" > "$OUT/benchmarks.md" \
  && echo "wrote $OUT/benchmarks.md"
ls -l "$OUT"
