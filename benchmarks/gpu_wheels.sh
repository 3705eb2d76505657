#!/usr/bin/env bash
# Every wheel benchmarks/gpu_check.sh needs on an offline GPU machine that has only torch, in
# one folder to copy there (run here, where the package registries are reachable):
#
#   benchmarks/gpu_wheels.sh .whl/gpu            # the harness + what its GPU path imports
#   # on the GPU machine, from the repository root:
#   pip install --no-index --no-deps .whl/gpu/*.whl && benchmarks/gpu_check.sh
#
# What is in it: the harness itself (a wheel built from this checkout), torch-uncertainty with
# its assets (frost images), lightning and torchmetrics (torch-uncertainty's import needs them),
# kornia, timm, orjson, submitit, PyYAML, tqdm, einops, numpy, and their own dependencies:
# the closure pip resolves for them, less torch, Triton, torchvision's CUDA libraries and the
# nvidia-*/cuda-* wheels a CUDA machine already has, and matplotlib (torch-uncertainty imports
# it). The rest of the reporting stack (pandas, seaborn, scipy, scikit-learn) stays out:
# gpu_check.sh trains on synthetic data and writes JSON, and the leaderboard is made where the
# records are copied back. torchvision is included
# at the version pyproject.toml pins: its wheel must match the machine's torch (check
# `pip show torch` there; the one built here is for torch 2.14).
set -euo pipefail
if [ $# -ne 1 ] || [[ "$1" == -* ]]; then
  echo "usage: benchmarks/gpu_wheels.sh DIR   (the folder to fill with wheels)" >&2; exit 2
fi
DIR=$(realpath -m "$1")  # relative to where it was started, not to the repository
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
NEEDS=(torchvision==0.29.1 "torch-uncertainty>=0.13,<0.14" "torch-uncertainty-assets>=0.5"
  "lightning>=2.4" "rich>=13" "kornia>=0.7" "timm>=1.0" "numpy>=1.26" "orjson>=3.9" "matplotlib>=3.8"
  "seaborn>=0.13" "pandas>=2.1"
  "submitit>=1.5" "PyYAML>=6.0" "tqdm>=4.66" einops)
pip wheel --no-deps --quiet -w "$DIR" .  # the harness, from this checkout
report=$(mktemp)
trap 'rm -f "$report"' EXIT
pip install --dry-run --ignore-installed --quiet --report "$report" "${NEEDS[@]}"
mapfile -t pins < <(python3 - "$report" <<'EOF'
import json, re, sys
# what a CUDA machine with torch already has (torch's own dependencies included), and the
# reporting stack gpu_check.sh never imports (matplotlib stays: torch-uncertainty imports it)
skip = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|setuptools|pip|filelock|typing-extensions|"
                  r"sympy|mpmath|networkx|jinja2|markupsafe|fsspec|scipy|scikit-learn)$")
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    name = meta["name"].lower().replace("_", "-")
    if not skip.match(name):
        print(f"{name}=={meta['version']}")
EOF
)
pip download --no-deps --quiet -d "$DIR" "${pins[@]}"
echo "wrote $(ls "$DIR" | wc -l) wheels, $(du -sh "$DIR" | cut -f1), into $DIR:"
ls "$DIR"
