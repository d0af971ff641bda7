#!/usr/bin/env bash
# Dev: turn patches into an overlay folder for `variants_topk.sh` (whole files, for a machine without git).
#   bash benchmarks/overlay_patch.sh OUT_DIR P1.patch [P2.patch ...]
# Applies the patches to this tree, copies every file they touch into OUT_DIR at the same path, and
# reverts them. The tree must not already hold changes to those files.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1; shift
rm -rf "$dir"; mkdir -p "$dir"
for p in "$@"; do git apply "$p"; done
files=$(for p in "$@"; do git apply --numstat "$p" 2>/dev/null || true; done | awk '{print $3}' | sort -u)
[ -n "$files" ] || files=$(git diff --name-only)
for f in $files; do mkdir -p "$dir/$(dirname "$f")"; cp "$f" "$dir/$f"; done
for ((i = $#; i >= 1; i--)); do git apply -R "${!i}"; done
echo "$dir: $(echo $files | wc -w) files"
