#!/usr/bin/env bash
# `make fresh-check`: the README's two commands run as a new machine runs them, before an issue is resolved.
#
# A fresh clone of this checkout's HEAD in a folder of its own, in a new mount namespace where the mounts a booted
# host has and `make setup` makes (bpffs, tracefs: profiling/hoststate.py) are absent, with podman's storage and
# the pip, npm and Go caches of its own (nothing built or cached by an earlier run is seen). Then `make demo` and
# `make test`, each timed, and what setup had to make. What it cannot take away: the Debian packages already
# installed on this machine (apt installs system-wide; a new machine's first `make setup` adds ~1-2 min for them).
# As root (the mount namespace). The folder is removed when both commands pass, else kept and named.
# FRESH_CHECK_TARGETS="test" runs only the suite (e.g. after a change that cannot touch the demo).
set -uo pipefail
src=$(git rev-parse --show-toplevel)
[ "$(id -u)" = 0 ] || { echo "fresh-check: needs root (a mount namespace without bpffs)" >&2; exit 64; }
command -v unshare >/dev/null || { echo "fresh-check: needs unshare (util-linux)" >&2; exit 64; }
[ -z "$(git -C "$src" status --porcelain --untracked-files=no)" ] \
  || echo "fresh-check: note: uncommitted changes are not in the clone; it checks HEAD $(git -C "$src" rev-parse --short HEAD)"
work=$(mktemp -d /var/tmp/iobatch-fresh.XXXXXX)
log="$work/fresh-check.log"
git clone -q "$src" "$work/iobatch" || exit 1
mkdir -p "$work/containers" "$work/cache"
cat > "$work/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$work/containers/storage"
runroot = "$work/containers/run"
CONF
echo "fresh-check: a clone of $(git -C "$src" rev-parse --short HEAD) in $work/iobatch (log: $log)"

# The namespace's own view: private mounts, then the host state a new machine lacks taken away.
unshare --mount --propagation private -- env \
  CONTAINERS_STORAGE_CONF="$work/storage.conf" XDG_CACHE_HOME="$work/cache" PIP_CACHE_DIR="$work/cache/pip" \
  npm_config_cache="$work/cache/npm" GOMODCACHE="$work/cache/go-mod" GOCACHE="$work/cache/go-build" \
  bash -c '
    cd "$1/iobatch" || exit 1
    for m in /sys/fs/bpf /sys/kernel/tracing; do while mountpoint -q "$m"; do umount -l "$m" || break; done; done
    echo "fresh-check: mounts here before setup: $(mount | grep -cE " type (bpf|tracefs) ") of bpffs and tracefs"
    rc=0
    for target in $2; do
      start=$(date +%s)
      make "$target" > "$1/$target.log" 2>&1; code=$?
      end=$(date +%s)
      echo "fresh-check: make $target: exit $code in $((end - start)) s"
      [ "$code" = 0 ] || rc=1
    done
    exit $rc' _ "$work" "${FRESH_CHECK_TARGETS:-demo test}"
rc=$?
{
  echo "fresh-check: what setup made or said:"
  # Only the logs of the commands that ran (FRESH_CHECK_TARGETS may leave one out).
  logs=(); for name in demo test; do [ -f "$work/$name.log" ] && logs+=("$work/$name.log"); done
  [ ${#logs[@]} -gt 0 ] && grep -hE "^(mounted |installing |note: |guest kernel|guest initramfs|\[..:..:..\] set up)" \
    "${logs[@]}" | sort -u | sed 's/^/  /'
  if [ -f "$work/demo.log" ]; then
    echo "fresh-check: the demo's table:"
    sed -n '/┏/,/┘/p' "$work/demo.log" | sed 's/^/  /'
  fi
  if [ -f "$work/test.log" ]; then
    echo "fresh-check: the suite:"
    grep -E "^\[..:..:..\]|passed|failed|slowest|^[0-9.]+s (call|setup|teardown)" "$work/test.log" | tail -40 \
      | sed 's/^/  /'
  fi
} | tee "$log"
if [ "$rc" = 0 ]; then
  rm -rf "$work" 2>/dev/null || echo "fresh-check: could not remove all of $work"
  echo "fresh-check: passed"
else
  echo "fresh-check: FAILED: the clone, its logs (demo.log, test.log) and storage are kept in $work"
fi
exit "$rc"
