#!/usr/bin/env bash
# Installs the reference MCP test server (@modelcontextprotocol/server-everything) from
# everything/package-lock.json into a cache OUTSIDE the checkout, keyed by the lock's hash,
# and prints the path of its entry script (dist/index.js) as the last line on stdout.
# It runs on the system Node (>= 18); npm's own output goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/everything" && pwd)"
cache="${TURND_MCP_CACHE:-$HOME/.cache/turnd-mcp}"
hash="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
dir="$cache/$hash"
entry="$dir/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

if [[ -f "$dir/.turnd-installed" ]]; then
  echo "$entry"
  exit 0
fi

mkdir -p "$cache"
# A scratch dir renamed at the end: an interrupted install is never taken for a finished one.
work="$(mktemp -d "$cache/.install-$hash-XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$here/package.json" "$here/package-lock.json" "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=warn 1>&2)
test -f "$work/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
touch "$work/.turnd-installed"
if ! mv -T "$work" "$dir" 2>/dev/null; then
  [[ -f "$dir/.turnd-installed" ]] || { echo "install-everything.sh: could not place $dir" >&2; exit 1; }
fi
trap - EXIT
echo "$entry"
