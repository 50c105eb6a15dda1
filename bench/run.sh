#!/bin/sh
# Cove start-up, memory and exec benchmark: Cove vs bwrap, crun and podman (runc).
# Usage: bench/run.sh [--iterations N] [--concurrency N] [--tools cove,host,bwrap,crun,podman]
#                     [--only startup,memory,exec,code] [--exec-iterations N]
#                     [--memory-sandboxes N] [--json FILE]    (bench/run.sh --help for all)
# Needs root, a built tree (ninja -C build), and bwrap, crun, runc, podman, busybox-static.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${COVE_BUILD_DIR:-$root/build}
export COVE_BUILD_DIR="$build"

if [ "$(id -u)" != 0 ]; then
    echo "bench/run.sh: must run as root (namespaces, cgroups, mounts)" >&2
    exit 2
fi
if [ ! -x "$build/src/coved/coved" ] || [ ! -x "$build/src/agent/cove-agent" ]; then
    echo "bench/run.sh: building Cove in $build" >&2
    ninja -C "$build" >&2
fi
missing=""
for tool in bwrap crun runc podman unshare tar; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -x /usr/bin/busybox ] || missing="$missing busybox(-static)"
if [ -n "$missing" ]; then
    echo "bench/run.sh: missing:$missing (apt-get install bubblewrap crun runc podman busybox-static)" >&2
    exit 2
fi
exec /usr/bin/python3 "$here/bench.py" "$@"
