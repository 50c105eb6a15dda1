#!/usr/bin/env bash
# Installs what the tests need, builds Cove (plain and ASan+UBSan) and runs the whole suite:
# C unit tests on both builds, then the end-to-end and security suites against the real
# daemon, then the end-to-end suite again against the sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "the tests need root (namespaces, cgroups, mounts)" >&2; exit 1; }
scripts/deps.sh
scripts/build.sh --asan

PY=/usr/bin/python3   # Debian's python, with python3-pytest

echo "== code style (clang-format, .clang-format)"
git ls-files 'src/*.c' 'src/*.h' 'tests/unit/*.c' 'tests/unit/*.h' 'tests/fuzz/*.c' 'tests/fuzz/*.h' | xargs clang-format --dry-run --Werror

echo "== unit tests (plain and ASan+UBSan builds)"
meson test -C build --suite unit --print-errorlogs
meson test -C build-asan --suite unit --print-errorlogs

echo "== fuzzing the parsers of hostile input (libFuzzer + ASan/UBSan, fixed seed)"
scripts/fuzz.sh

echo "== end-to-end and security tests"
$PY -m pytest -q -p no:cacheprovider tests/e2e tests/security "$@"

# The other runtimes (extensions.runtime; COVE_TEST_RUNTIME gives every daemon the tests start
# that --default-runtime, and skips what is marked native_only): the files of what a user
# sees of a sandbox and of its walls. Deselected are the known differences (docs/security.md,
# "Other runtimes"): the exit status of an OCI runtime's init is not coved's to read; this
# runsc (2022-12) emulates no /proc/self/ns, refuses statx's AT_NO_AUTOMOUNT (ls of /sys) and
# lets root inside read the agent's /proc entries.
echo "== the oci runtime (crun): sandboxes, files, gateway, egress and the security suite's walls"
COVE_TEST_RUNTIME=oci $PY -m pytest -q -p no:cacheprovider \
  tests/e2e/test_runtimes.py tests/e2e/test_smoke.py tests/e2e/test_files.py \
  tests/e2e/test_gateway.py tests/e2e/test_lifecycle.py tests/e2e/test_egress.py \
  tests/e2e/test_images_restart.py tests/security/test_sec_isolation.py \
  tests/security/test_sec_filesystem.py tests/security/test_sec_privileges.py \
  tests/security/test_sec_resources.py tests/security/test_sec_egress.py \
  tests/security/test_sec_agent_proc.py tests/security/test_sec_pause.py \
  tests/security/test_sec_budgets.py \
  --deselect tests/e2e/test_lifecycle.py::test_agent_crash_marks_sandbox_failed

echo "== the gvisor runtime (runsc, ptrace): sandboxes, gateway, egress and the walls"
COVE_TEST_RUNTIME=gvisor $PY -m pytest -q -p no:cacheprovider \
  tests/e2e/test_runtimes.py tests/e2e/test_gateway.py tests/e2e/test_lifecycle.py \
  tests/e2e/test_cli_lifecycle.py tests/e2e/test_egress.py tests/e2e/test_images_restart.py \
  tests/security/test_sec_egress.py tests/security/test_sec_privileges.py \
  tests/security/test_sec_isolation.py \
  --deselect tests/e2e/test_lifecycle.py::test_agent_crash_marks_sandbox_failed \
  --deselect tests/security/test_sec_privileges.py::test_kernel_and_host_operations_fail \
  --deselect tests/security/test_sec_privileges.py::test_agent_cannot_be_taken_over \
  --deselect tests/security/test_sec_isolation.py::test_only_loopback

echo "== Python SDK (sdk/python/tests, against a real coved)"
$PY -m pytest -q -p no:cacheprovider sdk/python/tests

echo "== OpenSandbox SDK compatibility (@alibaba-group/opensandbox, node --test)"
tests/compat/run.sh

echo "== images (pulled, unpacked, run) against coved built with ASan+UBSan, the static agent"
# Image roots have no host libc: the agent in them is the plain static one.
COVE_BUILD_DIR=build-asan COVE_SANITIZED=1 COVE_AGENT="$PWD/build/src/agent/cove-agent" \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87 \
  $PY -m pytest -q -p no:cacheprovider tests/e2e/test_images.py tests/e2e/test_images_restart.py \
  tests/security/test_sec_images.py tests/security/test_sec_images_review.py

echo "== end-to-end and security tests against coved and cove-agent built with ASan+UBSan"
# The sanitized agent is dynamic: tests whose root has no libc need the static one.
COVE_BUILD_DIR=build-asan COVE_SANITIZED=1 \
  COVE_AGENT="$PWD/build-asan/src/agent/cove-agent-sanitized" \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87 \
  $PY -m pytest -q -p no:cacheprovider -m "not slow and not static_agent" tests/e2e tests/security "$@"
