#!/usr/bin/env bash
# The one prepared GPU check (DESIGN.md, "Where GPUs are not"; docs/gpu.md), for the lent GPU machine as it is:
# no network, torch but no DALI. It checks and reassembles the parts bench/gpu_wheels.sh made, installs them and
# stallfree into a temporary site folder without a network, then runs each step under its own timeout, printing
# as it goes, and writes every result to one JSON under $OUT (or .whl/out).
#
# Usage: bash bench/gpu_check.sh [--parts DIR] [--site DIR] [--install-only]
#   --parts DIR      the parts and their SHA256SUMS (default .whl/parts)
#   --site DIR       where the wheels are installed (default a new temporary folder)
#   --install-only   stop after the offline install (what the CPU tests run)
# Example (in the last device call, after the calls that carried the other parts):
#   bash bench/gpu_check.sh --parts .whl/parts
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

parts=".whl/parts" site="" install_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --parts) parts="$2"; shift 2 ;;
    --site) site="$2"; shift 2 ;;
    --install-only) install_only=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
site=${site:-$(mktemp -d /tmp/stallfree-site.XXXXXX)}
fresh="this machine is not the one the earlier calls reached (a fresh machine has none of their parts): start the sequence again from the first call (docs/gpu.md)"

# --- 1. the parts: every one present and intact, then the whole bundle ---
sums="$parts/SHA256SUMS"
if [ ! -f "$sums" ]; then
  echo "gpu_check.sh: $sums is missing: carry it with the last part (bench/gpu_wheels.sh prints the calls)" >&2
  exit 3
fi
while read -r want name; do
  [ "$name" = "bundle.tar" ] && continue
  if [ ! -f "$parts/$name" ]; then
    echo "gpu_check.sh: $parts/$name is missing: $fresh" >&2
    exit 3
  fi
  got=$(sha256sum "$parts/$name" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "gpu_check.sh: $parts/$name is corrupt (sha256 $got, expected $want): carry it again" >&2
    exit 3
  fi
done < "$sums"
bundle=$(mktemp /tmp/stallfree-bundle.XXXXXX)
cat "$parts"/part-* > "$bundle"
want=$(awk '$2 == "bundle.tar" {print $1}' "$sums")
got=$(sha256sum "$bundle" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "gpu_check.sh: the reassembled bundle's sha256 is $got, expected $want (parts from two runs of gpu_wheels.sh?): $fresh" >&2
  exit 3
fi
echo "== parts: $(grep -vc ' bundle.tar$' "$sums") intact, bundle $(stat -c %s "$bundle") bytes"

# --- 2. the offline install: the wheels, then stallfree itself, into one site folder ---
wheels=$(mktemp -d /tmp/stallfree-wheels.XXXXXX)
tar -xf "$bundle" -C "$wheels"
rm "$bundle"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
installed=("$wheels"/*.whl)
echo "== installed ${#installed[@]} wheels into $site"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if [ "$install_only" = 1 ]; then
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
export PATH="$site/bin:$PATH"

# --- 3. the checks, each under its own timeout; a failing step is recorded and the next one runs ---
out=${OUT:-.whl/out}
mkdir -p "$out"
results="$out/gpu_check.jsonl"
: > "$results"
step() {  # step NAME SECONDS COMMAND...: run, print as it goes, record rc and wall time
  local name="$1" limit="$2" start rc
  shift 2
  echo "== $name (timeout ${limit} s): $*"
  start=$(date +%s.%N)
  set +e
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  printf '{"step": "%s", "rc": %d, "seconds": %.1f}\n' "$name" "$rc" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" >> "$results"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 - <<'PY'
import torch, nvidia.dali
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("dali", nvidia.dali.__version__)
PY
step gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests
step bench_loader 120 stallfree bench loader /tmp/stallfree-bench --synthetic 2000 --batches 20 --repeats 3 \
  --device cuda --threads "$(nproc)" --json-file "$out/bench_loader.json"
if stallfree bench e2e --help > /dev/null 2>&1; then
  step bench_e2e 90 stallfree bench e2e --device cuda --json-file "$out/bench_e2e.json"
else
  echo "== bench_e2e: not in this version of stallfree (skipped)"
fi
# --- the resampler on the GPU (issue 36): the CPU's and the GPU's batches bit for bit, and its time against fn.resize ---
step resample_gpu 100 python3 - "$out/resample_gpu.json" <<'PY'
import json, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

report = {}
# 1. One spec, two devices: PNGs (decoded alike by both), RandomResizedCrop + flip + Normalize, two batches.
root = Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
for i in range(64):
    (root / f"c{i % 2}").mkdir(exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (180 + i, 240 - i, 3), dtype=np.uint8)).save(root / f"c{i % 2}" / f"{i}.png")
spec = [RandomResizedCrop(64), RandomHorizontalFlip(), Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
batches = {}
for device in ("cpu", "cuda"):
    loader = Loader(root, batch_size=32, transform=spec, device=device, seed=5, num_threads=4)
    batches[device] = [images.cpu() for images, _ in loader]
diffs = [float((a - b).abs().max()) for a, b in zip(batches["cpu"], batches["cuda"], strict=True)]
report["batches_equal"] = all(torch.equal(a, b) for a, b in zip(batches["cpu"], batches["cuda"], strict=True))
report["max_abs_diff"] = max(diffs)
print(f"CPU and GPU batches equal to the bit: {report['batches_equal']} (largest difference {max(diffs):.3g})")

# 2. The resampler's kernel against fn.resize + crop_mirror_normalize, in one GPU graph each, 64 images 434x433.
import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

from stallfree.transforms.kernels.resample_node import resize_normalize_node
from stallfree.transforms.spec import size_input

images = [rng.integers(0, 256, (434, 433, 3), dtype=np.uint8) for _ in range(64)]
mean, std = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def timed(ours):
    @pipeline_def(batch_size=64, num_threads=4, device_id=0, exec_dynamic=True)
    def pipe():
        image = fn.external_source(name="images", dtype=types.UINT8, layout="HWC").gpu()
        size = fn.external_source(name="sizes", dtype=types.UINT8)
        if ours:
            return resize_normalize_node(image, size, mean=mean, std=std, chw=True, device="gpu")
        resized = fn.resize(image, size=[224, 224], antialias=True, interp_type=types.INTERP_LINEAR)
        return fn.crop_mirror_normalize(resized, mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW")

    p = pipe()
    p.build()
    times = []
    for _ in range(12):
        p.feed_input("images", images)
        p.feed_input("sizes", [size_input((224, 224))] * 64)
        start = time.perf_counter()
        (out,) = p.run()
        out.as_cpu()  # waits for the GPU (and copies the batch back: the same for both)
        times.append(time.perf_counter() - start)
    return float(np.median(times[2:]))


report["resampler_ms"], report["fn_resize_ms"] = timed(True) * 1e3, timed(False) * 1e3
print(f"64 x 434x433 -> 224x224 + normalize: resampler kernel {report['resampler_ms']:.2f} ms, "
      f"fn.resize + crop_mirror_normalize {report['fn_resize_ms']:.2f} ms per batch, copy back included (median of 10)")
Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
sys.exit(0 if report["batches_equal"] else 1)
PY
step train 60 stallfree train --synthetic 512 --model small_cnn --stages 1 --device cuda --max-steps 20 \
  --out /tmp/stallfree-train --no-progress --json-file "$out/train.json"

# One JSON of everything: each step's rc and time, and the benchmarks' own results where they wrote them.
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
report = {"steps": [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines() if line]}
for name in ("bench_loader", "bench_e2e", "train", "resample_gpu"):
    path = out / f"{name}.json"
    if path.is_file():
        report[name] = json.loads(path.read_text())
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report["steps"]))
PY
