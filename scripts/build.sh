#!/usr/bin/env bash
# Builds Cove into build/ (and, with --asan, build-asan/ with ASan+UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."

setup() {
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >/dev/null
  fi
  ninja -C "$dir" >/dev/null
}

setup build --buildtype=debugoptimized
if [ "${1:-}" = "--asan" ]; then
  setup build-asan --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
fi
