#!/usr/bin/env bash
# Runs watcher's BPF LSM tests inside a stock Debian kernel under qemu.
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
#                       [--run REGEX] [--keep]
#   --kernel-pkg  Debian kernel package (default: what linux-image-cloud-amd64
#                 depends on, from apt-cache; the ABI number moves with updates)
#   --pkg         Go package whose tests run in the guest (repeatable; default
#                 ./internal/enforce/lsm)
#   --run         -test.run regex passed to every test binary
#   --timeout     seconds before the guest is killed (default 900)
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

while (($#)); do
	case $1 in
	--kernel-pkg) kernel_pkg=$2; shift 2 ;;
	--kernel-pkg=*) kernel_pkg=${1#*=}; shift ;;
	--pkg) pkgs+=("$2"); shift 2 ;;
	--run) run_re=$2; shift 2 ;;
	--timeout) timeout_s=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	-h | --help) sed -n '2,21p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
((${#pkgs[@]})) || pkgs=(./internal/enforce/lsm)

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
[[ -n $run_re ]] && testargs="$testargs -test.run=$run_re"
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
out=/dev/ttyS1
[ -c \$out ] || out=/dev/console
{
	echo "guest: kernel \$(uname -r), lsm \$(cat /sys/kernel/security/lsm), \$(nproc) cpus, up \$(cut -d' ' -f1 /proc/uptime)s"
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
echo "== booting ($(elapsed)s spent building; initramfs $(du -h "$work/initrd.cpio" | cut -f1))"
: >"$work/tests.log"
tail -n +1 -f "$work/tests.log" &
tailpid=$!
boot0=$(date +%s.%N)
set +e
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
	-machine q35 -accel tcg,thread=multi -cpu max -m 1024 -smp 2 \
	-nographic -no-reboot -monitor none \
	-serial "file:$work/kernel.log" -serial "file:$work/tests.log" \
	-kernel "$vmlinuz" -initrd "$work/initrd.cpio" \
	-append "console=ttyS0 panic=-1 quiet lsm=lockdown,capability,landlock,yama,bpf"
qrc=$?
set -e
sleep 0.3
kill "$tailpid" 2>/dev/null || true
wait "$tailpid" 2>/dev/null || true
boot_s=$(awk -v a="$boot0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')

result=$(sed -n 's/^WATCHER-VM-RESULT: \([0-9]*\).*/\1/p' "$work/tests.log" | tail -1)
if [[ -z $result ]]; then
	if ((qrc == 124 || qrc == 137)); then
		echo "run.sh: guest timed out after ${timeout_s}s" >&2
	else
		echo "run.sh: guest stopped (qemu exit $qrc) without a result line" >&2
	fi
	echo "--- kernel log (last 40 lines)" >&2
	tail -n 40 "$work/kernel.log" >&2
	exit 1
fi
echo "== guest ran ${boot_s}s (qemu), ${kernel_pkg}, total $(elapsed)s; exit status $result"
if ((result != 0)); then
	grep -E 'BUG|WARNING|Oops|panic' "$work/kernel.log" >&2 || true
	exit 1
fi
