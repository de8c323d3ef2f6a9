#!/usr/bin/env bash
# Runs watcher's BPF LSM tests inside a stock Debian kernel under qemu, in
# two boots of the same kernel:
#   lsm       Debian's LSM list as it boots (bpf included): BPF LSM programs;
#   fmod_ret  lsm=landlock,lockdown,yama,apparmor (Ubuntu's default set, no
#             bpf): BPF LSM is built but not enabled, the same decisions run
#             as fmod_ret programs on the security_* functions and must give
#             the same EPERMs.
# Each boot tells the tests which mechanism it expects (WATCHER_EXPECT_MECH).
#
# This host refuses BPF LSM programs (EPERM before the verifier), so the LSM
# tests run for real in a guest: the Debian cloud kernel (CONFIG_BPF_LSM=y,
# `bpf` in its LSM list), extracted from its .deb (never installed), boots a
# busybox initramfs holding the statically linked test binaries. The guest's
# /init mounts what the tests need, runs each binary with its output on the
# second serial port (kernel messages stay on the first), prints a sentinel
# line with the exit status and powers off. This script parses the sentinel.
#
# Usage: test/vm/run.sh [--kernel-pkg NAME] [--pkg ./go/package]... [--timeout SECONDS]
#                       [--run REGEX] [--boot lsm|fmod_ret]... [--env K=V]... [--keep]
#   --kernel-pkg  Debian kernel package (default: what linux-image-cloud-amd64
#                 depends on, from apt-cache; the ABI number moves with updates)
#   --pkg         Go package whose tests run in the guest (repeatable; default
#                 ./internal/enforce/lsm)
#   --run         -test.run regex passed to every test binary
#   --timeout     seconds before each guest is killed (default 900)
#   --boot        which boots to run (repeatable; default both)
#   --env         environment variable for the test binaries (repeatable)
#   --keep        keep the work directory (initramfs, logs)
# Environment: VM_CACHE (default <repo>/.cache/vm) caches downloaded kernels.
# Needs: qemu-system-x86 busybox-static cpio (Debian packages), go, apt-get.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${VM_CACHE:-$repo/.cache/vm}
kernel_pkg=""
pkgs=()
run_re=""
timeout_s=900
keep=0
boots=()
envs=()

while (($#)); do
	case $1 in
	--kernel-pkg) kernel_pkg=$2; shift 2 ;;
	--kernel-pkg=*) kernel_pkg=${1#*=}; shift ;;
	--pkg) pkgs+=("$2"); shift 2 ;;
	--run) run_re=$2; shift 2 ;;
	--timeout) timeout_s=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	--boot) boots+=("$2"); shift 2 ;;
	--env) envs+=("$2"); shift 2 ;;
	-h | --help) sed -n '2,30p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
((${#pkgs[@]})) || pkgs=(./internal/enforce/lsm)
((${#boots[@]})) || boots=(lsm fmod_ret)
for b in "${boots[@]}"; do
	case $b in lsm | fmod_ret) ;; *) echo "run.sh: unknown boot $b (lsm or fmod_ret)" >&2; exit 2 ;; esac
done

for tool in qemu-system-x86_64 cpio go; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found (apt-get install qemu-system-x86 cpio; Go)" >&2; exit 2; }
done
busybox=""
for b in /bin/busybox /usr/bin/busybox; do
	if [[ -x $b ]] && file -L "$b" 2>/dev/null | grep -q 'statically linked'; then busybox=$b; break; fi
done
if [[ -z $busybox ]]; then
	# `file` may be missing: busybox-static installs /bin/busybox statically linked.
	[[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 && busybox=/bin/busybox
fi
[[ -n $busybox ]] || { echo "run.sh: a static busybox is needed (apt-get install busybox-static)" >&2; exit 2; }

t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# --- kernel ---------------------------------------------------------------
if [[ -z $kernel_pkg ]]; then
	kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/{print $2; exit}') || true
	if [[ -z $kernel_pkg ]]; then
		# No apt metadata: fall back to the newest cached kernel.
		kernel_pkg=$(ls -1 "$cache" 2>/dev/null | grep '^linux-image-' | sort -V | tail -1) || true
	fi
	[[ -n $kernel_pkg ]] || { echo "run.sh: cannot resolve linux-image-cloud-amd64 (apt-get update?) and no cached kernel" >&2; exit 2; }
fi
kdir=$cache/$kernel_pkg
vmlinuz=$kdir/vmlinuz
if [[ ! -s $vmlinuz ]]; then
	echo "== downloading $kernel_pkg"
	dl=$(mktemp -d)
	# apt-get download drops privileges to _apt: give it a directory it may write.
	chmod 0777 "$dl"
	(cd "$dl" && apt-get download -q "$kernel_pkg" >/dev/null) || {
		rm -rf "$dl"; echo "run.sh: apt-get download $kernel_pkg failed" >&2; exit 2; }
	dpkg-deb -x "$dl"/*.deb "$dl/x"
	mkdir -p "$kdir"
	cp "$dl"/x/boot/vmlinuz-* "$vmlinuz.tmp" && mv "$vmlinuz.tmp" "$vmlinuz"
	cp "$dl"/x/boot/config-* "$kdir/config" 2>/dev/null || true
	rm -rf "$dl"
fi
echo "== kernel $kernel_pkg ($vmlinuz)"

# --- test binaries ----------------------------------------------------------
work=$(mktemp -d /tmp/watcher-vm.XXXXXX)
cleanup() {
	if ((keep)); then echo "== kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,root,run,tests,usr/bin,usr/sbin}
chmod 1777 "$root/tmp"

names=()
for p in "${pkgs[@]}"; do
	name=$(echo "${p#./}" | tr '/.' '__')
	echo "== go test -c $p"
	(cd "$repo" && CGO_ENABLED=0 go test -c -o "$root/tests/$name.test" "$p")
	[[ -x $root/tests/$name.test ]] || { echo "run.sh: $p has no tests" >&2; exit 2; }
	names+=("$name")
done

# --- initramfs ----------------------------------------------------------------
cp "$busybox" "$root/bin/busybox"
# Files the tests expect on a normal system: credentials stand-ins with the
# real names and modes, so rules on /etc/shadow are exercised on a real file.
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"
echo 'root:*:19000:0:99999:7:::' >"$root/etc/shadow"
chmod 0640 "$root/etc/shadow"
echo 'vm' >"$root/etc/hostname"

testargs="-test.v -test.count=1 -test.timeout=$((timeout_s - 30))s"
[[ -n $run_re ]] && testargs="$testargs '-test.run=$run_re'"
cat >"$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t securityfs securityfs /sys/kernel/security
mkdir -p /sys/fs/cgroup /sys/fs/bpf /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
# Loopback for suites that run a real agent (DNS proxy, control socket).
ip link set lo up 2>/dev/null || true
$(for e in "${envs[@]}"; do printf 'export %q\n' "$e"; done)
for w in \$(cat /proc/cmdline); do
	case \$w in watcher_mech=*) export WATCHER_EXPECT_MECH=\${w#watcher_mech=} ;; esac
done
out=/dev/ttyS1
[ -c \$out ] || out=/dev/console
{
	echo "guest: kernel \$(uname -r), lsm \$(cat /sys/kernel/security/lsm), expecting \$WATCHER_EXPECT_MECH, \$(nproc) cpus, up \$(cut -d' ' -f1 /proc/uptime)s"
	status=0
	cd /tmp
	for t in ${names[*]}; do
		echo "=== guest: \$t"
		/tests/\$t.test $testargs 2>&1
		rc=\$?
		echo "=== guest: \$t exit \$rc (up \$(cut -d' ' -f1 /proc/uptime)s)"
		[ \$rc -eq 0 ] || status=\$rc
	done
	echo "WATCHER-VM-RESULT: \$status"
} >\$out 2>&1
sync
poweroff -f
EOF
chmod 0755 "$root/init"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd.cpio"

# --- boot -------------------------------------------------------------------
echo "== initramfs $(du -h "$work/initrd.cpio" | cut -f1), $(elapsed)s spent building"

# boot NAME APPEND: one guest run; prints its qemu time, fails on a failed test.
boot() {
	local name=$1 append=$2 log=$work/tests-$1.log klog=$work/kernel-$1.log
	echo "== boot $name: $append"
	: >"$log"
	tail -n +1 -f "$log" &
	local tailpid=$! boot0
	boot0=$(date +%s.%N)
	set +e
	timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
		-machine q35 -accel tcg,thread=multi -cpu max -m 1024 -smp 2 \
		-nographic -no-reboot -monitor none \
		-serial "file:$klog" -serial "file:$log" \
		-kernel "$vmlinuz" -initrd "$work/initrd.cpio" \
		-append "console=ttyS0 panic=-1 quiet $append watcher_mech=$name"
	local qrc=$?
	set -e
	sleep 0.3
	kill "$tailpid" 2>/dev/null || true
	wait "$tailpid" 2>/dev/null || true
	local boot_s result
	boot_s=$(awk -v a="$boot0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
	result=$(sed -n 's/^WATCHER-VM-RESULT: \([0-9]*\).*/\1/p' "$log" | tail -1)
	if [[ -z $result ]]; then
		if ((qrc == 124 || qrc == 137)); then
			echo "run.sh: boot $name: guest timed out after ${timeout_s}s" >&2
		else
			echo "run.sh: boot $name: guest stopped (qemu exit $qrc) without a result line" >&2
		fi
		echo "--- kernel log (last 40 lines)" >&2
		tail -n 40 "$klog" >&2
		return 1
	fi
	echo "== boot $name: guest ran ${boot_s}s (qemu), ${kernel_pkg}; exit status $result"
	if ((result != 0)); then
		grep -E 'BUG|WARNING|Oops|panic' "$klog" >&2 || true
		return 1
	fi
}

failed=()
for b in "${boots[@]}"; do
	case $b in
	# Debian's own list as it boots (bpf last).
	lsm) boot lsm "" || failed+=(lsm) ;;
	# Built but not enabled: Ubuntu's default set.
	fmod_ret) boot fmod_ret "lsm=landlock,lockdown,yama,apparmor" || failed+=(fmod_ret) ;;
	esac
done
echo "== total $(elapsed)s for boots: ${boots[*]}"
if ((${#failed[@]})); then
	echo "run.sh: failed boots: ${failed[*]}" >&2
	exit 1
fi
