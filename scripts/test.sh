#!/usr/bin/env bash
# Installs what the tests need, builds Cove (plain and ASan+UBSan) and runs the whole suite:
# C unit tests on both builds, then the end-to-end and security suites against the real
# daemon, then the end-to-end suite again against the sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "the tests need root (namespaces, cgroups, mounts)" >&2; exit 1; }
scripts/deps.sh
scripts/build.sh --asan

PY=/usr/bin/python3   # Debian's python, with python3-pytest and python3-pytest-xdist

# suite MARKS PYTEST-ARGS...: a run of the end-to-end and security files. They mostly wait (on
# sandboxes, timers, sockets), so what may share the host runs on COVE_TEST_WORKERS processes
# (pytest-xdist; a worker takes a whole file at a time: one module's daemon, one world of
# servers), then what is marked `serial` (load tests, assertions about the whole host) runs
# alone. MARKS is a marker expression both parts are narrowed by ("" for none). Both parts
# run; the suite fails if either does (a part with nothing selected is no failure).
COVE_TEST_WORKERS=${COVE_TEST_WORKERS:-4}
suite() {
  local marks=$1 rc=0 part
  shift
  $PY -m pytest -q -p no:cacheprovider -n "$COVE_TEST_WORKERS" --dist loadfile \
    -m "${marks:+($marks) and }not serial" "$@" || rc=$?
  [ "$rc" = 5 ] && rc=0
  part=0
  $PY -m pytest -q -p no:cacheprovider -m "${marks:+($marks) and }serial" "$@" || part=$?
  [ "$part" = 5 ] && part=0
  [ "$rc" = 0 ] && rc=$part
  return "$rc"
}

# stage TITLE: a stage's heading in the log, with the time since this script began.
stage() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

stage "code style (clang-format, .clang-format)"
git ls-files 'src/*.c' 'src/*.h' 'tests/unit/*.c' 'tests/unit/*.h' 'tests/fuzz/*.c' 'tests/fuzz/*.h' | xargs clang-format --dry-run --Werror

stage "unit tests (plain and ASan+UBSan builds)"
meson test -C build --suite unit --print-errorlogs
meson test -C build-asan --suite unit --print-errorlogs

stage "fuzzing the parsers of hostile input (libFuzzer + ASan/UBSan, fixed seed)"
scripts/fuzz.sh

stage "end-to-end and security tests"
suite "" tests/e2e tests/security "$@"

# The other runtimes (extensions.runtime): COVE_TEST_RUNTIME gives every daemon the tests start
# that --default-runtime. Skipped there, each saying why: what is about the native runtime
# itself (native_only) and the known differences of a runtime (not_under; docs/security.md,
# "Other runtimes").
stage "the whole e2e and security suite under the oci runtime (crun)"
COVE_TEST_RUNTIME=oci suite "" tests/e2e tests/security

stage "the whole e2e and security suite under the gvisor runtime (runsc, ptrace)"
COVE_TEST_RUNTIME=gvisor suite "" tests/e2e tests/security

stage "Python SDK (sdk/python/tests, against a real coved)"
$PY -m pytest -q -p no:cacheprovider sdk/python/tests

stage "OpenSandbox SDK compatibility (@alibaba-group/opensandbox, node --test)"
tests/compat/run.sh

stage "images (pulled, unpacked, run) against coved built with ASan+UBSan, the static agent"
# Image roots have no host libc: the agent in them is the plain static one.
COVE_BUILD_DIR=build-asan COVE_SANITIZED=1 COVE_AGENT="$PWD/build/src/agent/cove-agent" \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87 \
  suite "" tests/e2e/test_images.py tests/e2e/test_images_restart.py \
  tests/security/test_sec_images.py tests/security/test_sec_images_review.py

stage "end-to-end and security tests against coved and cove-agent built with ASan+UBSan"
# The sanitized agent is dynamic: tests whose root has no libc need the static one.
COVE_BUILD_DIR=build-asan COVE_SANITIZED=1 \
  COVE_AGENT="$PWD/build-asan/src/agent/cove-agent-sanitized" \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87 \
  suite "not slow and not static_agent" tests/e2e tests/security "$@"
