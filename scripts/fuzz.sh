#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang, ASan and UBSan (build-fuzz/) and
# runs each from its seed corpus (tests/fuzz/corpus/NAME). A crash, a sanitizer report or a
# leak fails the run and leaves the input in build-fuzz/findings/.
#
#   scripts/fuzz.sh                 a fixed number of runs from a fixed seed: the same inputs
#                                   every time (the test suite runs this)
#   scripts/fuzz.sh --time 300 [NAME...]
#                                   each fuzzer for 300 s from a random seed (to hunt)
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${COVE_FUZZ_RUNS:-400000}
time_limit=""
if [ "${1:-}" = "--time" ]; then
    time_limit=$2
    shift 2
fi
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(http multipart websocket wire values routes events tunnel policy dns sniff vault mitm mcp volumes isolated image_manifest layer_unpack pool_claim
    connect_envelope pbjson observe audit_query)

if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined \
        -Db_lundef=false --buildtype=debug >/dev/null
fi
targets=()
for name in "${names[@]}"; do targets+=("tests/fuzz/fuzz_$name"); done
ninja -C build-fuzz "${targets[@]}" >/dev/null

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p build-fuzz/findings

# fuzz_one NAME: one harness's run, its verdict (and, failed, the end of its log) on stdout.
fuzz_one() {
    local name=$1 work n limits started
    work=$(mktemp -d)
    if [ -n "$time_limit" ]; then
        limits=(-max_total_time="$time_limit")
    else
        # The tunnel and mitm harnesses run an event loop per input, and sniff parses every
        # prefix of its input: fewer runs in the same time.
        case "$name" in
        tunnel | mitm) n=$((runs / 16)) ;;
        sniff) n=$((runs / 4)) ;;
        *) n=$runs ;;
        esac
        limits=(-runs="$n" -seed=1)
    fi
    started=$(date +%s)
    if build-fuzz/tests/fuzz/fuzz_"$name" "${limits[@]}" -max_len=8192 -timeout=10 \
        -artifact_prefix="build-fuzz/findings/$name-" "$work" "tests/fuzz/corpus/$name" \
        >"$work.log" 2>&1; then
        echo "fuzz $name: ok ($(grep -o 'Done [0-9]* runs' "$work.log" || echo done)," \
            "$(( $(date +%s) - started )) s, corpus $(ls "$work" | wc -l) new inputs)"
        rm -rf "$work" "$work.log"
        return 0
    fi
    echo "fuzz $name: FAILED"
    tail -n 60 "$work.log"
    rm -rf "$work" "$work.log"
    return 1
}

# As many at once as there are CPUs (COVE_FUZZ_JOBS): each harness is one CPU-bound process
# with a fixed seed, so running them side by side changes none of the inputs they try.
jobs=${COVE_FUZZ_JOBS:-$(nproc)}
out=$(mktemp -d)
status=0
for i in "${!names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n || true
    done
    { if fuzz_one "${names[$i]}" >"$out/$i"; then echo 0; else echo 1; fi >"$out/$i.rc"; } &
done
wait
for i in "${!names[@]}"; do
    cat "$out/$i"
    [ "$(cat "$out/$i.rc" 2>/dev/null)" = 0 ] || status=1
done
rm -rf "$out"
exit "$status"
