#!/usr/bin/env bash
# Installs the reference MCP test server (@modelcontextprotocol/server-everything) from
# everything/package-lock.json into a cache OUTSIDE the checkout, keyed by the lock's hash,
# and prints the path of its entry script (dist/index.js) as the last line on stdout.
# It runs on the system Node (>= 18); npm's own output goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/npm-cache.sh"
main="node_modules/@modelcontextprotocol/server-everything/dist/index.js"

build() {
  npm ci --no-audit --no-fund --loglevel=warn 1>&2
  test -f "$main"
}

cached_install "$here/everything" "${TURND_MCP_CACHE:-$HOME/.cache/turnd-mcp}" build
echo "$dir/$main"
