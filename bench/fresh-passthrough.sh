#!/usr/bin/env bash
# Passthrough on/off: fresh branch, first rg over 10k files, first read of a 512 MiB file.
# Usage: bench/fresh-passthrough.sh ROUNDS   (as root; builds its project on its own tmpfs)
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOUNT=${MOUNT:-$here/target/release/examples/mount}  # cargo build --release -p shade-fusefs --example mount
base=/var/tmp/fresh-pt
mkdir -p $base; mountpoint -q $base || mount -t tmpfs -o size=2g tmpfs $base
proj=$base/proj
if [[ ! -d $proj ]]; then
  mkdir -p $proj/tree
  n=0
  for c in ~/.cargo/registry/src/*/*/; do cp -r "$c" $proj/tree/; n=$(find $proj/tree -type f | wc -l); ((n >= 10000)) && break; done
  head -c 512M /dev/urandom > $proj/blob.bin
fi
export SHADE_STATE_DIR=$base/state
source "$here/bench/fresh-lib.sh"
count() { fuse_requests "$@"; }
run() { # mode what cmd
  local mode=$1 what=$2; shift 2
  coproc M { SHADE_FUSE_PASSTHROUGH=$mode exec $MOUNT $proj 2>/dev/null; }
  read -r mp <&"${M[0]}"
  local t0=$(date +%s%N)
  (cd $mp && eval "$*" >/dev/null)
  local t1=$(date +%s%N)
  echo "$what pt=$mode $(( (t1 - t0) / 1000000 )) ms"
  exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
}
cat $proj/blob.bin >/dev/null; (cd $proj/tree && rg --no-ignore -c 'fn ' >/dev/null)
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $rounds); do
  for mode in 0 1; do
    (cd $proj/tree && rg --no-ignore -c 'fn ' >/dev/null)
    run $mode rg "cd tree && rg --no-ignore -c 'fn '"
    cat $proj/blob.bin >/dev/null
    run $mode read "dd if=blob.bin of=/dev/null bs=1M 2>/dev/null"
    run $mode rg-then-read "cd tree && rg --no-ignore -c 'fn ' && cat ../blob.bin"
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in 0 1; do
  coproc M { SHADE_FUSE_PASSTHROUGH=$mode exec $MOUNT $proj 2>/dev/null; }
  read -r mp <&"${M[0]}"
  echo "requests rg pt=$mode: $(count $mp sh -c "cd $mp/tree && rg --no-ignore -c 'fn '")"
  echo "requests read pt=$mode: $(count $mp dd if=$mp/blob.bin of=/dev/null bs=1M)"
  exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
done
