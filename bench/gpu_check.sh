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
step train 60 stallfree train --synthetic 512 --model small_cnn --stages 1 --device cuda --max-steps 20 \
  --out /tmp/stallfree-train --no-progress --json-file "$out/train.json"

# One JSON of everything: each step's rc and time, and the benchmarks' own results where they wrote them.
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
report = {"steps": [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines() if line]}
for name in ("bench_loader", "bench_e2e", "train"):
    path = out / f"{name}.json"
    if path.is_file():
        report[name] = json.loads(path.read_text())
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report["steps"]))
PY
