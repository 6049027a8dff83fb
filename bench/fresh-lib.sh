# Shared by the fresh-branch measurement scripts (source it): timing and FUSE request counts.

# ms CMD: how long the shell command CMD takes, in milliseconds (its output dropped).
ms() { local t0=$(date +%s%N); eval "$1" >/dev/null; echo $(( ($(date +%s%N) - t0) / 1000000 )); }

# fuse_requests MOUNTPOINT CMD...: run CMD and print how many FUSE requests the connection
# of MOUNTPOINT got, with the four most frequent opcodes (kernel tracepoint
# fuse:fuse_request_send, in a tracing instance of our own; needs root).
fuse_requests() {
  local mp=$1; shift
  local T=/sys/kernel/tracing/instances/shade-fresh-$$
  local dev=$(stat -c %d "$mp"); local kdev=$(( ($(( dev >> 8 & 0xfff )) << 20) | (dev & 0xff) ))
  mkdir -p $T; echo 16384 > $T/buffer_size_kb
  echo "connection == $kdev" > $T/events/fuse/fuse_request_send/filter
  echo > $T/trace; echo 1 > $T/events/fuse/fuse_request_send/enable
  "$@" >/dev/null
  echo 0 > $T/events/fuse/fuse_request_send/enable
  echo "$(grep -c FUSE_ $T/trace) ($(grep -o '(FUSE_[A-Z]*)' $T/trace | sort | uniq -c | sort -rn | head -4 | tr -s ' \n' ' '))"
  rmdir $T
}

# ten_k_repo DIR: a git repository of about 10,000 files (crate sources from the cargo
# registry) at DIR, made once, committed, its index refreshed (so the first `git status`
# measured is a warm one).
ten_k_repo() {
  local proj=$1
  [[ -d $proj/.git ]] && return
  mkdir -p "$proj"
  for c in ~/.cargo/registry/src/*/*/; do
    cp -r "$c" "$proj"/; (( $(find "$proj" -type f | wc -l) >= 10000 )) && break
  done
  (cd "$proj" && git init -q && git config gc.auto 0 && git add -A -f && git -c user.name=b -c user.email=b@l commit -q -m t)
  sleep 1.1; (cd "$proj" && git update-index -q --refresh && git status --porcelain >/dev/null)
}
