#!/usr/bin/env bash
# The one prepared GPU check (DESIGN.md, "Where GPUs are not"): for a lent GPU machine, under 5 minutes.
# Runs every test marked `gpu`, then the loader benchmark with the graph on the GPU, and prints both.
# Usage (from the repository root): bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python3 -m venv /tmp/stallfree-gpu-venv
# shellcheck disable=SC1091
. /tmp/stallfree-gpu-venv/bin/activate
pip install -q -e '.[test]'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python - <<'PY'
import torch, nvidia.dali
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("dali", nvidia.dali.__version__)
PY
echo "== gpu tests"
timeout 180 pytest -q -m gpu -p no:cacheprovider
echo "== loader benchmark, graph on the GPU"
timeout 120 stallfree bench loader /tmp/stallfree-bench --synthetic 2000 --batches 20 --repeats 3 --device cuda
