#!/usr/bin/env bash
# Issue h36: a plain user's `shade run -- true` against the number of host mounts below
# directories the sandbox rebuilds (an Ubuntu desktop with snaps has ~60 squashfs mounts
# under /snap). For each N: a private mount namespace (`unshare -m --propagation private`,
# so nothing reaches the host), tmpfs over /tmp and /var/tmp (no other session's units),
# a tmpfs on /snap with N tmpfs mounts at /snap/app(K%20)/K, each holding one file; then
# bench/run-latency.sh BEFORE AFTER ROUNDS as the plain user (interleaved rounds).
# SNAP=rw (default, the lead's /tmp/snapbench.sh): /snap and its mounts are tmpfs with mode
# 1777, so the plain user may write them and each mount is a unit of the outside layer.
# SNAP=ro: as on Ubuntu, /snap is root's 0755 and each mount is read-only (squashfs), so
# each is a read-only overlay.
# Usage (root): bench/user-start-mounts.sh BEFORE AFTER [ROUNDS] [N...]
#   WHO=root measures root's runs instead (default user: the plain test user).
#   BASE (default /opt/shade-user-start-mounts) holds the copied binaries and projects:
#   not under /tmp or /var/tmp, which each run covers.
set -euo pipefail
before=$(realpath "${1:?usage: user-start-mounts.sh BEFORE AFTER [ROUNDS] [N...]}")
after=$(realpath "${2:?usage: user-start-mounts.sh BEFORE AFTER [ROUNDS] [N...]}")
rounds=${3:-5}
shift 3 || shift $#
ns=("$@"); (( ${#ns[@]} )) || ns=(0 20 60 120)
here=$(cd "$(dirname "$0")" && pwd)
base=${BASE:-/opt/shade-user-start-mounts}
snap=${SNAP:-rw}
case $snap in
  rw) top=1777 ro= ;;
  ro) top=0755 ro=1 ;;
  *) echo "SNAP is rw or ro" >&2; exit 2 ;;
esac
for n in "${ns[@]}"; do
  echo "### N=$n SNAP=$snap"
  timeout 1200 unshare -m --propagation private bash -c '
    set -e
    mount -t tmpfs -o mode=1777 tmpfs /var/tmp; mount -t tmpfs -o mode=1777 tmpfs /tmp
    mkdir -p /snap; mount -t tmpfs -o mode='"$top"' tmpfs /snap
    for i in $(seq '"$n"'); do
      d=/snap/app$((i%20))/$i; mkdir -p $d; mount -t tmpfs -o size=1m,mode='"$top"' tmpfs $d
      echo x > $d/f
      [[ -z "'"$ro"'" ]] || mount -o remount,ro $d
    done
    echo "mounts in the namespace: $(wc -l < /proc/self/mountinfo)"
    WHO=${WHO:-user} BASE='"$base"' bash '"$here"'/run-latency.sh '"$before $after $rounds"'
  '
done
