#!/bin/sh
# End-to-end event throughput: a sandboxed openat+close loop, the real agent
# binary (watcher run) recording its syscalls into the ledger at the default
# sampling; prints kernel events/s handled, kernel ring and queue losses, the
# agent's CPU time and peak RSS, and the workload's rate without the agent
# (baseline, same run), and the ledger's append rate alone (agent-like
# records into a fresh ledger, in the bench's process) before the agent
# starts and beside one more flood round. Root. Private pin dir, cgroups,
# sockets and ledgers, all removed at the end.
# Usage: bench/e2e/run.sh [-opens N] [-rounds N] [-rate R]
set -e
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/watcher" ./cmd/watcher
# The workload must not link cilium/ebpf: its init calls bpf(2), which the
# kill backstop answers with SIGKILL inside a sandbox.
CGO_ENABLED=0 go build -o "$tmp/openloop" ./bench/e2e/openloop
go build -o "$tmp/e2e" ./bench/e2e
"$tmp/e2e" -watcher "$tmp/watcher" -workload "$tmp/openloop" "$@"
