#!/usr/bin/env bash
# make test-vm: every guest suite, in two lanes that run side by side. Each
# guest runs single-threaded TCG (one host core; run.sh's header says why),
# so two lanes use both cores of a 2-core host. A lane goes on after a
# failed step, so one run reports every failure; lines are prefixed with
# the lane's name, and the script fails when any step failed. Each step's
# output is also kept, and a failed step's failure lines (--- FAIL, panic,
# the guest's exit) and its last lines are printed again at the end, where
# the tail of a CI log shows them.
#
# The lanes:
#   kernel   the LSM suite in both boots, the packages that need BPF LSM or
#            cgroup v2 (limits, launch, posture, workspace, ipcobj), the
#            tracepoint flip check, the adversarial suite in both boots, then
#            the workload battery's git, shell and read sessions under the
#            enforcing sandboxes (restricted, dev, read-only);
#   battery  the battery's python, node, c and net sessions under restricted,
#            and c and net under dev; then, in both boots, an agent per
#            preset linking no syscall-wide program; then the egress
#            adversarial suite on the host's userland (iproute2, veth).
# The battery runs on the host's userland (--hostroot) in the lsm boot.
# With zero refusals under an enforcing sandbox, its record-mode twin takes
# the same decisions on the same operations, so the twins stay on the host
# run of test/workloads, as do dev for python and node, and the go
# session: under TCG a cold Go build takes over ten minutes a run (see
# docs/concepts/files.md and bench/README.md, "benign workload battery").
#
# Usage: test/vm/lanes.sh    (KERNEL_PKG=NAME passes --kernel-pkg NAME)
set -uo pipefail
cd "$(dirname "$0")/../.."

kp=()
[[ -n ${KERNEL_PKG:-} ]] && kp=(--kernel-pkg "$KERNEL_PKG")
vm() { ./test/vm/run.sh "${kp[@]}" "$@"; }

# Download the kernel once, before two runs would race for it.
vm --fetch-only || exit 2

status=$(mktemp -d /tmp/watcher-lanes.XXXXXX)
trap 'rm -rf "$status"' EXIT

# step NAME ARGS...: one run.sh call; a failure is noted, the lane goes on.
step() {
	local name=$1; shift
	local t0=$SECONDS log
	log="$status/step-$(tr -c 'A-Za-z0-9_-' _ <<<"$name").log"
	if vm "$@" 2>&1 | tee "$log"; then
		echo "== step $name passed in $((SECONDS - t0)) s"
	else
		echo "== step $name FAILED in $((SECONDS - t0)) s"
		printf '%s\t%s\n' "$name" "$log" >>"$status/failed"
	fi
}

# report_failures: each failed step's failure lines and last lines again.
report_failures() {
	local name log
	while IFS=$'\t' read -r name log; do
		echo "== failed step $name: its failure lines"
		grep -E -e '--- FAIL|^(panic|fatal error):|FAIL[[:space:]]|WATCHER-VM-RESULT|timed out|soft lockup|guest (exit|ran)' "$log" | head -n 60
		echo "== failed step $name: its last 40 lines"
		tail -n 40 "$log"
	done <"$status/failed"
}

# battery SESSIONS SANDBOXES: the workload battery, narrowed.
battery() {
	step "battery $1 ($2)" --hostroot --pkg ./test/workloads --run '^TestBattery$' \
		--env WL_ONLY="$1" --env WL_SANDBOXES="$2" --boot lsm --timeout 3000
}

lane_kernel() {
	step lsm-suite --timeout 1500
	step limits --pkg ./internal/limits --boot lsm
	step launch --pkg ./internal/launch --run 'TestDerivedFileModel|TestOOMScoreNotInherited' --boot lsm
	step posture --pkg ./internal/posture --boot lsm
	step workspace --pkg ./internal/workspace --boot lsm
	step ipcobj --pkg ./internal/enforce/ipcobj --boot lsm
	step tracepoint-flips --pkg ./internal/enforce --run '^TestSyscallTracepointFlips$' --boot lsm
	step adversarial --pkg ./test/adversarial --timeout 2400
	battery git,shell,read restricted,dev,read-only
}

lane_battery() {
	battery python,node,c,net restricted
	battery c,net dev
	# Every preset, both boots: no syscall-wide program (issue 32).
	step syscall-wide --pkg ./internal/agent --run '^TestNoSyscallWidePrograms$'
	# The egress suite needs iproute2's ip netns and veth: the host's
	# userland, one boot (its hooks are cgroup programs, the same in both).
	step egress-adversarial --hostroot --pkg ./test/adversarial --run '^TestEgressAdversarial$' --boot lsm --timeout 1500
}

t0=$SECONDS
lane_kernel 2>&1 | sed -u 's/^/[kernel] /' &
kernel_pid=$!
lane_battery 2>&1 | sed -u 's/^/[battery] /' &
battery_pid=$!
wait "$kernel_pid" "$battery_pid"

echo "== test-vm: both lanes done in $((SECONDS - t0)) s"
if [[ -s $status/failed ]]; then
	report_failures
	echo "== test-vm FAILED: $(cut -f1 "$status/failed" | paste -sd,)"
	exit 1
fi
echo "== test-vm passed"
