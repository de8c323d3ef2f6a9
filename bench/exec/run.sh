#!/bin/sh
# Cost of the exec subtree (PID, UTS, IPC and mount namespaces, a fresh
# /proc, an init as PID 1) and of the capability drop per `watcher exec`
# run: N runs of `watcher exec -- true` by the binary of main ("before")
# and of this tree ("after"), alternated, against one running agent (this
# tree's), so the agent's start-up is not in the numbers. Prints the
# median, mean and the after/before ratios. Root. Private pins, sockets,
# ledger and cgroups, removed at the end.
# Usage: bench/exec/run.sh [N] [PRESET]
set -e
n=${1:-20}
preset=${2:-restricted}
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/execbench.XXXXXX)
id=$(basename "$tmp" | tr . -)
cg=/watcher-bench-$id
cleanup() {
	[ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
	rm -rf "$tmp" "/sys/fs/bpf/watcher-$id"
	for d in $(find /sys/fs/cgroup/unified$cg /sys/fs/cgroup/unified$cg-exec -depth -type d 2>/dev/null); do rmdir "$d" 2>/dev/null || true; done
}
trap cleanup EXIT
go build -o "$tmp/after" ./cmd/watcher
mkdir "$tmp/main" "$tmp/ws"
git archive main | tar -x -C "$tmp/main"
(cd "$tmp/main" && go build -o "$tmp/before" ./cmd/watcher)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$tmp/policy.yaml" <<POL
version: 1
agent:
  ledger_dir: $tmp/ledger
  socket_dir: $tmp/sock
  pin_dir: /sys/fs/bpf/watcher-$id
  metrics_addr: ""
  exec_cgroup: $cg-exec
  dns: {listen: "127.0.0.1:$port"}
sandboxes:
  - name: bench
    select: {cgroups: [$cg]}
    preset: $preset
    workspace: [$tmp/ws]
POL
"$tmp/after" run --policy "$tmp/policy.yaml" --quiet >"$tmp/agent.log" 2>&1 &
agent=$!
for i in $(seq 100); do [ -S "$tmp/sock/control.sock" ] && break; sleep 0.2; done
cd "$tmp/ws"
for b in before after; do "$tmp/$b" exec -q --socket "$tmp/sock/control.sock" -- true; done # warm
for i in $(seq "$n"); do
	for b in before after; do
		s=$(date +%s%N)
		"$tmp/$b" exec --socket "$tmp/sock/control.sock" -- true 2>"$tmp/verdict"
		e=$(date +%s%N)
		echo "$b $(( (e - s) / 1000 ))" >>"$tmp/times"
		# The verdict's time=: from the release of the child into the
		# leaf to the command's end (init, fork and exec of true).
		v=$(sed -n 's/^watcher: .* time=\([0-9.]*\)\(m\?s\) .*/\1 \2/p' "$tmp/verdict")
		echo "$b-verdict $(echo "$v" | awk '{ print ($2 == "s") ? $1 * 1000000 : $1 * 1000 }')" >>"$tmp/times"
	done
done
python3 - "$tmp/times" "$n" "$preset" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    b, us = line.split()
    times.setdefault(b, []).append(int(us) / 1000)
for what, sfx in (("whole watcher exec", ""), ("verdict time= (command run)", "-verdict")):
    b, a = times["before" + sfx], times["after" + sfx]
    print(f"{what}: before median={statistics.median(b):.1f}ms mean={statistics.mean(b):.1f}ms; after median={statistics.median(a):.1f}ms mean={statistics.mean(a):.1f}ms")
    print(f"  after/before ({sys.argv[3]} preset, {sys.argv[2]} runs each): median {statistics.median(a) / statistics.median(b):.2f}, mean {statistics.mean(a) / statistics.mean(b):.2f}")
PY
