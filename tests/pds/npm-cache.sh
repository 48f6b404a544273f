# Sourced by install.sh and install-everything.sh: a locked npm package set installed into
# a cache OUTSIDE the checkout, keyed by the hash of its package.json and package-lock.json.
#
#   cached_install SRC CACHE BUILD
#
# sets $dir to CACHE/<hash>. A finished install there is reused as it is; otherwise BUILD
# (a shell function) runs in a scratch dir beside it holding SRC's two package files, and
# the scratch dir is renamed into place at the end, so an interrupted install is never
# mistaken for a finished one (and two concurrent installs don't mix). $built is 1 when
# this call built it.

cached_install() {
  local src="$1" cache="$2" build="$3" hash
  hash="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)"
  dir="$cache/$hash"
  built=0
  if [[ -f "$dir/.turnd-installed" ]]; then
    return 0
  fi
  mkdir -p "$cache"
  work="$(mktemp -d "$cache/.install-$hash-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  cp "$src/package.json" "$src/package-lock.json" "$work/"
  (cd "$work" && "$build")
  touch "$work/.turnd-installed"
  if ! mv -T "$work" "$dir" 2>/dev/null; then
    # Somebody else finished first; theirs is as good as ours.
    [[ -f "$dir/.turnd-installed" ]] || { echo "$(basename "$0"): could not place $dir" >&2; exit 1; }
  fi
  trap - EXIT
  rm -rf "$work"
  built=1
}
