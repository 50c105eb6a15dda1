#!/usr/bin/env bash
# Runs the OpenSandbox SDK compatibility tests (node's test runner against a real coved).
# Needs node >= 20 and npm with registry access (first run), root (coved makes cgroups and
# namespaces) and a built tree (ninja -C build; COVE_BUILD_DIR picks another build dir).
# Extra arguments go to node --test (e.g. --test-name-pattern=lifecycle).
set -euo pipefail
# puppeteer-core (console.test.mjs) drives the system's chromium: never a browser download.
export PUPPETEER_SKIP_DOWNLOAD=1
cd "$(dirname "$0")"

if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
else
    npm install --no-audit --no-fund --loglevel=error
fi

reporter="${COVE_COMPAT_REPORTER:-spec}"
status=0
# Every *.test.mjs here (each starts its own coved and keeps its log as coved*.log).
node --test --test-reporter="$reporter" --test-reporter-destination=stdout "$@" ./*.test.mjs || status=$?
if [ "$status" -ne 0 ]; then
    for log in coved*.log; do
        [ -f "$log" ] || continue
        echo "---- last lines of $log (tests/compat/$log) ----"
        tail -n 40 "$log"
    done
fi
exit "$status"
