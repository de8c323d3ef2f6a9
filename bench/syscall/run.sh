#!/bin/sh
# Syscall overhead of watcher's tracepoint programs (kill backstop and
# recording): bare, inside a sandbox, outside while attached, and each attach
# mechanism alone; ratios against bare measured in the same run. Root.
# Usage: bench/syscall/run.sh [-rounds N] [-iters N]
set -e
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 go build -o "$tmp/loop" ./bench/syscall/loop
go build -o "$tmp/bench" ./bench/syscall
"$tmp/bench" -loop "$tmp/loop" "$@"
