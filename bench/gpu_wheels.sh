#!/usr/bin/env bash
# Prepares what the lent GPU machine lacks (docs/gpu.md): DALI for CUDA 13 and the wheels it needs, for that
# machine's Python (3.12, manylinux x86-64), packed into one tar and split into parts that each fit one device
# call (64 MiB a call, the working tree included), with a SHA-256 list. Run it here, on a development machine.
#
# Usage: bash bench/gpu_wheels.sh [--wheels DIR] [--out DIR] [--part-bytes N]
#   --wheels DIR     pack the wheels already in DIR instead of downloading (what the tests do)
#   --out DIR        where the parts go (default .whl/parts, git-ignored); DIR/SHA256SUMS lists them
#   --part-bytes N   the largest part (default 60 MiB: 62914560)
# Example:
#   bash bench/gpu_wheels.sh            # downloads about 270 MB, writes .whl/parts/part-00 ... and SHA256SUMS
set -euo pipefail
cd "$(dirname "$0")/.."

wheels="" out=".whl/parts" part_bytes=$((60 * 1024 * 1024))
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --part-bytes) part_bytes="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_wheels.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Packages the device image already holds (the device tool's KINDS.md, "Python packages already there"):
# pip's resolver downloads them as DALI's dependencies, and installing a second version beside the image's
# would shadow it, so they are dropped. Names are normalised (lower case, '_' for '-').
IMAGE_HAS="numpy packaging pyyaml six typing_extensions wheel setuptools pillow psutil pyarrow numba llvmlite"

if [ -z "$wheels" ]; then
  wheels=".whl/wheels"
  rm -rf "$wheels" && mkdir -p "$wheels"
  echo "== downloading nvidia-dali-cuda130 and its dependencies for CPython 3.12, manylinux x86-64" >&2
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$wheels" nvidia-dali-cuda130
  for whl in "$wheels"/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
    for have in $IMAGE_HAS; do
      if [ "$name" = "$have" ]; then echo "   dropped $(basename "$whl") (the image has $have)" >&2; rm "$whl"; fi
    done
  done
fi
shopt -s nullglob
found=("$wheels"/*.whl)
if [ ${#found[@]} -eq 0 ]; then
  echo "gpu_wheels.sh: no wheels in $wheels" >&2
  exit 1
fi

rm -rf "$out" && mkdir -p "$out"
bundle="$out/bundle.tar"
names=()
for whl in "${found[@]}"; do names+=("$(basename "$whl")"); done
tar -cf "$bundle" -C "$wheels" "${names[@]}"
split -b "$part_bytes" -d -a 2 "$bundle" "$out/part-"
(cd "$out" && sha256sum part-* > SHA256SUMS && sha256sum bundle.tar >> SHA256SUMS)
rm "$bundle"

parts=("$out"/part-*)
echo "== ${#found[@]} wheels, $(du -cb "${found[@]}" | tail -1 | cut -f1) bytes, in ${#parts[@]} parts under $out:"
for part in "${parts[@]}"; do
  printf '   %s  %d bytes\n' "$(basename "$part")" "$(stat -c %s "$part")"
done
last=$((${#parts[@]} - 1))
echo "== the device calls, back to back (a machine goes back 30 s after a call; see docs/gpu.md):"
for i in "${!parts[@]}"; do
  name="$out/$(basename "${parts[$i]}")"
  if [ "$i" -lt "$last" ]; then
    echo "   run(command=\"ls -l $out\", carry=[\"$name\"], timeout_s=60)"
  else
    echo "   run(command=\"bash bench/gpu_check.sh --parts $out\", carry=[\"$name\", \"$out/SHA256SUMS\"], timeout_s=480)"
  fi
done
