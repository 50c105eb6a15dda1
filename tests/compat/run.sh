#!/usr/bin/env bash
# Runs the OpenSandbox SDK compatibility tests (node's test runner against a real coved).
# Needs node >= 20 and npm with registry access (first run), root (coved makes cgroups and
# namespaces) and a built tree (ninja -C build; COVE_BUILD_DIR picks another build dir).
# Extra arguments go to node --test (e.g. --test-name-pattern=lifecycle).
set -euo pipefail
cd "$(dirname "$0")"

if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
else
    npm install --no-audit --no-fund --loglevel=error
fi

reporter="${COVE_COMPAT_REPORTER:-spec}"
status=0
node --test --test-reporter="$reporter" --test-reporter-destination=stdout "$@" sdk.test.mjs || status=$?
if [ "$status" -ne 0 ] && [ -f coved.log ]; then
    echo "---- last lines of coved.log (tests/compat/coved.log) ----"
    tail -n 40 coved.log
fi
exit "$status"
