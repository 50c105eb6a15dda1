#!/usr/bin/env bash
# Installs what Cove needs, builds it and runs the daemon in the foreground with its embedded
# defaults: state in /var/lib/cove (SQLite), template `base`, listening on 127.0.0.1:8080.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "coved needs root (namespaces, cgroups, mounts)" >&2; exit 1; }
scripts/deps.sh
scripts/build.sh
state=${COVE_STATE_DIR:-/var/lib/cove}
mkdir -p "$state"
# coved never serves without an API key: make one on first run, readable by root only.
if [ ! -s "$state/api_key" ]; then
  (umask 077; od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$state/api_key"; echo >> "$state/api_key")
fi
cat <<MSG
Starting coved on ${COVE_LISTEN:-127.0.0.1:8080} (state: $state).
Once it is ready, in another terminal:
  export COVE_STATE_DIR=$state          # the CLI reads the generated API key there
  build/src/cli/cove create             # prints a sandbox id
  build/src/cli/cove exec ID -- uname -a
  build/src/cli/cove kill ID
or over HTTP: curl -H "OPEN-SANDBOX-API-KEY: \$(cat $state/api_key)" http://127.0.0.1:8080/v1/sandboxes
MSG
exec build/src/coved/coved --state-dir "$state" --api-key-file "$state/api_key" "$@"
