#!/usr/bin/env bash
# Installs what building, running and testing Cove needs, from Debian's packages.
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config clang-format git
  # clang's libFuzzer and sanitizer runtimes, for tests/fuzz (scripts/fuzz.sh)
  clang libclang-rt-14-dev
  libevent-dev libjansson-dev libsqlite3-dev libseccomp-dev libhttp-parser-dev
  libssl-dev libcurl4-openssl-dev libinih-dev
  # templates: tarballs are unpacked (and directories copied) with libarchive
  libarchive-dev
  libzmq3-dev
  # E2B's envd speaks Connect with binary protobuf as well as JSON: protoc-c compiles
  # proto/e2b at build time, libprotobuf-c packs and unpacks (src/lib/connect.c)
  libprotobuf-c-dev protobuf-c-compiler
  python3 python3-pytest python3-ipykernel
  # the e2e and security suites run on several workers at once (scripts/test.sh)
  python3-pytest-xdist
  # tests/e2e/test_cli_aliases.py reads `cove -o yaml` back with a real YAML parser
  python3-yaml
  # `cove completion zsh` is loaded by a test
  zsh
  # sdk/python: the Python SDK runs on httpx (anyio's pytest plugin runs its async tests);
  # a test installs it with pip, offline, with setuptools as the build backend
  python3-httpx python3-anyio python3-pip python3-setuptools python3-wheel
  # What the code-interpreter template's kernel offers (and its tests use). About 390 MB
  # installed: Debian's matplotlib pulls fonttools, which pulls scipy and sympy.
  python3-numpy python3-pandas python3-matplotlib
  # The code interpreter's other languages, on Cove's own kernels (src/kernel/kernels/):
  # Java on JShell, Go's toolchain, TypeScript's compiler for node (JavaScript runs on node,
  # installed below).
  default-jdk-headless golang-go node-typescript
  busybox-static iproute2 procps tar
  # writable layers on disk: mke2fs formats each size's template image (runtime/layer.c);
  # util-linux's losetup is what tests read loop devices with
  e2fsprogs util-linux
  # egress: nftables rules in each sandbox's netns, c-ares for the proxy's own lookups
  libnftables-dev libc-ares-dev
  # egress tests: a DNS server for test names, clients inside sandboxes, a headless browser
  dnsmasq-base curl python3-requests python3-httpx chromium
  # /metrics tests: promtool check metrics (tests/e2e/test_metrics.py)
  prometheus
  # `python` is Python 3 in the templates, which run the host's /usr
  python-is-python3
  # OCI images: tests run Debian's registry (token auth signed with PyJWT), build images with
  # umoci/zstd and push them with skopeo
  docker-registry skopeo umoci zstd python3-jwt python3-cryptography
  # the oci and gvisor runtimes (extensions.runtime)
  crun runc runsc
)
# Benchmarks compare against these, in the same run.
bench_packages=(bubblewrap podman)

missing=()
for p in "${packages[@]}" ${COVE_WITH_BENCH:+"${bench_packages[@]}"}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    exit 1
  fi
  rm -f "$log"
fi

# The OpenSandbox SDK compatibility tests run on Node.js (>= 20) with npm.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "Installing: nodejs npm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm \
    >/dev/null 2>&1 || { echo "cannot install nodejs/npm" >&2; exit 1; }
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "warning: Node.js $node_major found; the OpenSandbox SDK wants >= 20" >&2
fi
