#!/bin/sh
# Syscall overhead of watcher's tracepoint programs (kill backstop and
# recording): bare, inside a sandbox, outside while attached, and each attach
# mechanism alone; ratios against bare measured in the same run. Root.
# Usage: bench/syscall/run.sh [-before REV] [-rounds N] [-iters N] [-progtime] [-cpu]
#   -before REV: also measure the backstop object committed at git revision
#   REV (e.g. main), interleaved with this tree's, in the same run.
set -e
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$1" = "-before" ]; then
	git show "$2:internal/enforce/backstop/backstop_x86_bpfel.o" >"$tmp/before.o"
	shift 2
	set -- -before "$tmp/before.o" "$@"
fi
CGO_ENABLED=0 go build -o "$tmp/loop" ./bench/syscall/loop
go build -o "$tmp/bench" ./bench/syscall
"$tmp/bench" -loop "$tmp/loop" "$@"
