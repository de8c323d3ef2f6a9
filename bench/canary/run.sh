#!/usr/bin/env bash
# What one canary run costs: starts a private agent (restricted preset, one
# sandbox, private pins, cgroups and sockets), runs `watcher check` N times
# and prints the agent's CPU (its own and its reaped probes') per run, the
# wall time per run, the idle agent's CPU over the same wall time (the
# baseline, measured in the same run), and what the default 5-minute
# interval costs as a fraction of one core.
# Usage: bench/canary/run.sh [N]   (root; default N=10)
set -euo pipefail
n=${1:-10}
repo=$(cd "$(dirname "$0")/../.." && pwd)
id=$$
work=$(mktemp -d /tmp/watcher-canary-bench-XXXX)
bin=$work/watcher
pin=/sys/fs/bpf/watcher-canary-bench-$id
cg=/watcher-canary-bench-$id
ws=/var/lib/watcher-canary-bench-$id
mkdir -p "$ws"
(cd "$repo" && go build -o "$bin" ./cmd/watcher)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$work/policy.yaml" <<YAML
version: 1
agent:
  ledger_dir: $work/ledger
  socket_dir: $work/run
  pin_dir: $pin
  metrics_addr: ""
  exec_cgroup: $cg-exec
  dns: {listen: "127.0.0.1:$(port)", upstreams: ["127.0.0.1:1"]}
sandboxes:
  - name: bench
    select: {cgroups: [$cg]}
    preset: restricted
    workspace: [$ws]
    canary: {enabled: true, interval: 1h}
YAML
"$bin" run --policy "$work/policy.yaml" --quiet >"$work/agent.log" 2>&1 &
agent=$!
cleanup() {
	kill "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
	"$bin" unpin --pin-dir "$pin" --force >/dev/null 2>&1 || true
	cgroot=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
	for c in "$cg" "$cg-exec"; do [ -d "$cgroot$c" ] && find "$cgroot$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
	rm -rf "$work" "$ws"
}
trap cleanup EXIT
sock=$work/run/control.sock
for _ in $(seq 1 600); do "$bin" status --socket "$sock" >/dev/null 2>&1 && break; sleep 0.2; done
"$bin" check --socket "$sock" >/dev/null # warm: the start run and page cache
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15+$16+$17}' "/proc/$agent/stat"; }
a=$(cpu); s=$(date +%s.%N)
for _ in $(seq 1 "$n"); do "$bin" check --socket "$sock" >/dev/null || echo "a check failed" >&2; done
e=$(date +%s.%N); b=$(cpu)
wall=$(echo "$e - $s" | bc -l)
# Baseline: the idle agent over the same wall time.
c=$(cpu); sleep "$wall"; d=$(cpu)
checks=$("$bin" check --json --socket "$sock" | grep -c '"check": ')
awk -v a="$a" -v b="$b" -v c="$c" -v d="$d" -v t="$tck" -v n="$n" -v w="$wall" -v k="$checks" 'BEGIN {
	run = (b - a) / t / n; idle = (d - c) / t / n
	printf "canary: %d probes per run, %.3f s wall per run\n", k, w / n
	printf "agent CPU per run %.3f s (idle agent over the same time: %.3f s, %.1fx)\n", run, idle, (idle > 0 ? run / idle : 0)
	printf "default interval 5m: %.3f%% of one core per sandbox\n", 100 * (run - idle) / 300
}'
