#!/usr/bin/env bash
# The size of fnrt's install with each extra: a fresh virtualenv per row, pip's own
# files subtracted, the Makefile's constraints. Prints "extra MB seconds" lines.
#   bench/install_sizes.sh [EXTRA ...]      (default: every extra)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
extras=("${@:-base torch onnx gpu s3 redis plot edge all}")
for extra in ${extras[*]}; do
  venv="$work/$extra"
  python3 -m venv "$venv"
  site="$venv/lib/python3.11/site-packages"
  before=$(du -sk "$site" | cut -f1)
  spec="$root"
  [ "$extra" != base ] && spec="$root[$extra]"
  start=$(date +%s)
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" "$spec" >"$work/$extra.log" 2>&1
  after=$(du -sk "$site" | cut -f1)
  echo "$extra $(( (after - before) / 1024 )) MB $(( $(date +%s) - start )) s"
  rm -rf "$venv"
done
