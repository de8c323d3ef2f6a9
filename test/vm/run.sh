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
# Every boot loads overlay.ko (and the virtio/virtiofs modules) from the same
# kernel package, so overlay workspaces run in the guest.
#
# --hostroot runs the tests on the host's own userland instead (git, python,
# node, go, gcc: the workload battery): virtiofsd shares a read-only bind of
# the host's root filesystem (only /, no submounts), the guest mounts it under
# a tmpfs overlay (writes stay in guest memory), mounts fresh proc, sys, dev,
# /tmp and /run in it, chroots there and runs each test binary from its
# package directory (the repository is on the host's root), with WATCHER_BIN
# pointing at a watcher binary built for the run.
#
# Usage: test/vm/run.sh [--kernel-pkg NAME] [--pkg ./go/package]... [--timeout SECONDS]
#                       [--run REGEX] [--boot lsm|fmod_ret]... [--env K=V]... [--keep]
#                       [--hostroot] [--mem MIB] [--fetch-only]
#   --kernel-pkg  Debian kernel package (default: what linux-image-cloud-amd64
#                 depends on, from apt-cache; the ABI number moves with updates)
#   --pkg         Go package whose tests run in the guest (repeatable; default
#                 ./internal/enforce/lsm)
#   --run         -test.run regex passed to every test binary
#   --timeout     seconds before each guest is killed (default 900)
#   --boot        which boots to run (repeatable; default both)
#   --env         environment variable for the test binaries (repeatable)
#   --keep        keep the work directory (initramfs, logs)
#   --hostroot    run the tests chrooted into the host's root (see above)
#   --mem         guest memory in MiB (default 1024; 2048 with --hostroot,
#                 where the overlay's writes and /tmp live in guest memory)
#   --fetch-only  download the kernel into the cache and stop (test/vm/lanes.sh
#                 does this once before its lanes start)
# Environment: VM_CACHE (default <repo>/.cache/vm) caches downloaded kernels
# (<pkg>/vmlinuz, config, and modules/*.ko with modules/order, the load order).
# VM_TCG_THREAD (default single) is qemu's TCG threading. Multi-threaded TCG
# (qemu 7.2, Debian 12) locks up the guest when the kernel live-patches code
# that the other vCPU runs: attaching and detaching the raw sys_enter/sys_exit
# tracepoints (their static keys) while another thread makes system calls
# puts both vCPUs in a soft lockup in asm_exc_int3 within ~200 attach/detach
# cycles (3 of 3 boots); single-threaded TCG ran 2 x 1000 cycles clean, and
# the LSM suite took 104 s instead of 98 s. Reproduce with
#   VM_TCG_THREAD=multi test/vm/run.sh --pkg ./internal/enforce \
#     --run '^TestSyscallTracepointFlips$' --env WATCHER_FLIPS=1000 --boot lsm
# Needs: qemu-system-x86 (with /usr/lib/qemu/virtiofsd for --hostroot)
# busybox-static cpio kmod (Debian packages), go, apt-get.
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
hostroot=0
mem_mib=""
fetch_only=0

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
	--hostroot) hostroot=1; shift ;;
	--mem) mem_mib=$2; shift 2 ;;
	--fetch-only) fetch_only=1; shift ;;
	-h | --help) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
((${#pkgs[@]})) || pkgs=(./internal/enforce/lsm)
((${#boots[@]})) || boots=(lsm fmod_ret)
for b in "${boots[@]}"; do
	case $b in lsm | fmod_ret) ;; *) echo "run.sh: unknown boot $b (lsm or fmod_ret)" >&2; exit 2 ;; esac
done

[[ -z $mem_mib ]] && { ((hostroot)) && mem_mib=2048 || mem_mib=1024; }
[[ $mem_mib =~ ^[0-9]+$ ]] || { echo "run.sh: --mem wants MiB, got $mem_mib" >&2; exit 2; }
virtiofsd=/usr/lib/qemu/virtiofsd
# virtiofsd shares / alone (no submounts): the checkout must be on it.
if ((hostroot)) && [[ $(stat -c %d "$repo") != $(stat -c %d /) ]]; then
	echo "run.sh: --hostroot shares only the root filesystem, and $repo is on another mount: clone the repository onto /" >&2; exit 2
fi
if ((hostroot)) && [[ ! -x $virtiofsd ]]; then
	echo "run.sh: --hostroot needs $virtiofsd (apt-get install qemu-system-common)" >&2; exit 2
fi

for tool in qemu-system-x86_64 cpio go modinfo; do
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
moddir=$kdir/modules
# Modules the guest loads (their dependencies are added from modinfo):
# overlayfs for workspaces, virtio-pci and virtiofs for --hostroot, veth
# for the egress suites' network namespaces.
guest_modules=(overlay virtio_pci virtiofs veth)

# extract_modules DEBROOT: copies guest_modules and their dependencies into
# $moddir with a load order, atomically (other runs share the cache).
extract_modules() {
	local x=$1 tmp order=() seen=" " m
	local mroot
	mroot=$(ls -d "$x"/lib/modules/*/ 2>/dev/null | head -1)
	[[ -n $mroot ]] || { echo "run.sh: no lib/modules in $kernel_pkg" >&2; return 1; }
	tmp=$(mktemp -d "$kdir/modules.tmp.XXXXXX")
	add() {
		local name=$1 f dep
		[[ $seen == *" $name "* ]] && return 0
		seen+="$name "
		f=$(find "$mroot" -name "$name.ko" -print -quit)
		if [[ -z $f ]]; then
			# Built in (modules.builtin) needs no file.
			grep -q "/$name.ko\$" "$mroot/modules.builtin" 2>/dev/null && return 0
			echo "run.sh: module $name not in $kernel_pkg" >&2; return 1
		fi
		for dep in $(modinfo -F depends "$f" | tr ',' ' '); do add "$dep" || return 1; done
		cp "$f" "$tmp/$name.ko"
		order+=("$name")
	}
	for m in "${guest_modules[@]}"; do add "$m" || { rm -rf "$tmp"; return 1; }; done
	printf '%s\n' "${order[@]}" >"$tmp/order"
	chmod 0755 "$tmp"
	# A concurrent run may have won: keep theirs.
	mv -T "$tmp" "$moddir" 2>/dev/null || rm -rf "$tmp"
}

modules_cached() {
	local m
	[[ -s $moddir/order ]] || return 1
	for m in "${guest_modules[@]}"; do grep -qx "$m" "$moddir/order" || return 1; done
}
if [[ ! -s $vmlinuz ]] || ! modules_cached; then
	echo "== downloading $kernel_pkg"
	dl=$(mktemp -d)
	# apt-get download drops privileges to _apt: give it a directory it may write.
	chmod 0777 "$dl"
	(cd "$dl" && apt-get download -q "$kernel_pkg" >/dev/null) || {
		rm -rf "$dl"; echo "run.sh: apt-get download $kernel_pkg failed" >&2; exit 2; }
	dpkg-deb -x "$dl"/*.deb "$dl/x"
	mkdir -p "$kdir"
	if [[ ! -s $vmlinuz ]]; then
		cp "$dl"/x/boot/vmlinuz-* "$vmlinuz.tmp.$$" && mv "$vmlinuz.tmp.$$" "$vmlinuz"
		cp "$dl"/x/boot/config-* "$kdir/config" 2>/dev/null || true
	fi
	if ! modules_cached; then
		[[ -d $moddir ]] && mv -T "$moddir" "$kdir/modules.old.$$" 2>/dev/null && rm -rf "$kdir/modules.old.$$"
		extract_modules "$dl/x" || { rm -rf "$dl"; exit 2; }
	fi
	rm -rf "$dl"
fi
echo "== kernel $kernel_pkg ($vmlinuz)"
((fetch_only)) && exit 0

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
dirs=()
for p in "${pkgs[@]}"; do
	name=$(echo "${p#./}" | tr '/.' '__')
	echo "== go test -c $p"
	(cd "$repo" && CGO_ENABLED=0 go test -c -o "$root/tests/$name.test" "$p")
	[[ -x $root/tests/$name.test ]] || { echo "run.sh: $p has no tests" >&2; exit 2; }
	names+=("$name")
	# The package directory, where `go test` runs a package's tests: on the
	# host's root, so the same path inside a --hostroot guest.
	dirs+=("$(cd "$repo" && go list -f '{{.Dir}}' "$p")")
done
if ((hostroot)); then
	echo "== go build ./cmd/watcher (WATCHER_BIN in the guest)"
	(cd "$repo" && CGO_ENABLED=0 go build -o "$root/tests/watcher" ./cmd/watcher)
	envs+=("WATCHER_BIN=/run/watcher-vm/watcher")
fi
mkdir -p "$root/modules"
cp "$moddir"/*.ko "$moddir/order" "$root/modules/"

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
out=/dev/ttyS1
[ -c \$out ] || out=/dev/console
# Modules of the same kernel package, in dependency order.
for m in \$(cat /modules/order); do
	insmod /modules/\$m.ko 2>>/tmp/insmod.log || echo "guest: insmod \$m failed: \$(tail -1 /tmp/insmod.log)" >\$out
done
hostroot=$hostroot
r=
if [ \$hostroot = 1 ]; then
	# The host's root, read-only, under a tmpfs overlay.
	r=/newroot
	mkdir -p /mnt/host /mnt/rw \$r
	if ! mount -t virtiofs -o ro hostroot /mnt/host; then
		echo "guest: mount virtiofs failed" >\$out; echo "WATCHER-VM-RESULT: 3" >\$out; poweroff -f
	fi
	mount -t tmpfs -o mode=0755 tmpfs /mnt/rw
	mkdir -p /mnt/rw/upper /mnt/rw/work
	if ! mount -t overlay overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work \$r; then
		echo "guest: mount overlay failed" >\$out; echo "WATCHER-VM-RESULT: 3" >\$out; poweroff -f
	fi
	mkdir -p \$r/proc \$r/sys \$r/dev \$r/tmp \$r/run \$r/home \$r/root
	# A checkout under a directory replaced below (a clone in /tmp) stays
	# visible: its overlay subtree is moved back on top afterwards.
	repo=$(printf %q "$repo")
	case \$repo in /tmp/*|/run/*|/home/*|/root/*)
		mkdir -p /mnt/repo && mount --bind \$r\$repo /mnt/repo ;;
	esac
	mount -t proc proc \$r/proc
	mount -t sysfs sysfs \$r/sys
	mount -t devtmpfs devtmpfs \$r/dev
	# Where tests write: tmpfs, not the overlay. Lookups of files in an
	# overlay's upper layer read trusted.* xattrs, a CAP_SYS_ADMIN check in
	# the caller's context, which the capability rules would record.
	mount -t tmpfs -o mode=1777 tmpfs \$r/tmp
	mount -t tmpfs -o mode=0755 tmpfs \$r/run
	mount -t tmpfs -o mode=0755 tmpfs \$r/home
	mount -t tmpfs -o mode=0700 tmpfs \$r/root
	mkdir -p \$r/run/watcher-vm
	mount --bind /tests \$r/run/watcher-vm
	if grep -q ' /mnt/repo ' /proc/mounts; then
		mkdir -p \$r\$repo && mount --move /mnt/repo \$r\$repo
	fi
fi
# What udev would add to devtmpfs: /dev/fd (process substitution), stdio
# links, ptys, POSIX shared memory.
mkdir -p \$r/dev/pts \$r/dev/shm
mount -t devpts -o ptmxmode=0666 devpts \$r/dev/pts
mount -t tmpfs -o mode=1777 tmpfs \$r/dev/shm
ln -sf /proc/self/fd \$r/dev/fd
ln -sf /proc/self/fd/0 \$r/dev/stdin
ln -sf /proc/self/fd/1 \$r/dev/stdout
ln -sf /proc/self/fd/2 \$r/dev/stderr
mount -t securityfs securityfs \$r/sys/kernel/security
mkdir -p \$r/sys/fs/cgroup \$r/sys/fs/bpf \$r/sys/kernel/tracing
mount -t cgroup2 cgroup2 \$r/sys/fs/cgroup
mount -t bpf bpf \$r/sys/fs/bpf
mount -t tracefs tracefs \$r/sys/kernel/tracing
# Loopback for suites that run a real agent (DNS proxy, control socket).
ip link set lo up 2>/dev/null || true
hostname vm
$(for e in "${envs[@]}"; do printf 'export %q\n' "$e"; done)
for w in \$(cat /proc/cmdline); do
	case \$w in watcher_mech=*) export WATCHER_EXPECT_MECH=\${w#watcher_mech=} ;; esac
done
# runtest NAME DIR: one test binary; from its package directory in the host's
# root with --hostroot, else from /tmp of the initramfs.
runtest() {
	if [ \$hostroot = 1 ]; then
		chroot \$r /bin/sh -c "cd '\$2' && exec /run/watcher-vm/\$1.test $testargs"
	else
		/tests/\$1.test $testargs
	fi
}
{
	echo "guest: kernel \$(uname -r), lsm \$(cat \$r/sys/kernel/security/lsm), expecting \$WATCHER_EXPECT_MECH, \$(nproc) cpus, \$(awk '/MemTotal/{print int(\$2/1024)}' /proc/meminfo) MiB, up \$(cut -d' ' -f1 /proc/uptime)s\$([ \$hostroot = 1 ] && echo ', host root')"
	status=0
	cd /tmp
	set -- ${dirs[*]}
	for t in ${names[*]}; do
		echo "=== guest: \$t"
		runtest \$t \$1 2>&1
		rc=\$?
		shift
		echo "=== guest: \$t exit \$rc (up \$(cut -d' ' -f1 /proc/uptime)s)"
		[ \$rc -eq 0 ] || status=\$rc
	done
	if [ \$hostroot = 1 ]; then
		# What reached the overlay's upper layer (each entry there costs a
		# CAP_SYS_ADMIN check at every lookup: keep it empty).
		echo "guest: overlay upper layer: \$(cd /mnt/rw/upper && find . -mindepth 1 -maxdepth 4 | head -20 | tr '\\n' ' ')"
	fi
	echo "WATCHER-VM-RESULT: \$status"
} >\$out 2>&1
sync
poweroff -f
EOF
chmod 0755 "$root/init"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd.cpio"

# --- boot -------------------------------------------------------------------
echo "== initramfs $(du -h "$work/initrd.cpio" | cut -f1), $(elapsed)s spent building"

# start_virtiofsd NAME: serves a read-only view of the host's root filesystem
# on $work/vfs-NAME.sock, and sets started_pid. The view is a non-recursive
# bind of / made read-only in a private mount namespace, so no host mount
# (proc, sys, cgroups, bpffs) is shared and nothing the guest does reaches
# the host's files.
start_virtiofsd() {
	local name=$1 sock=$work/vfs-$1.sock view=$work/hostroot
	mkdir -p "$view"
	unshare --mount --propagation private sh -c '
		mount --bind / "$1" && mount -o remount,bind,ro "$1" &&
		exec "$2" --socket-path="$3" -o source="$1" -o cache=auto -o no_posix_lock -o no_flock --thread-pool-size=4
	' sh "$view" "$virtiofsd" "$sock" >"$work/virtiofsd-$name.log" 2>&1 &
	started_pid=$!
	local i
	for ((i = 0; i < 100; i++)); do
		[[ -S $sock ]] && return 0
		kill -0 "$started_pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "run.sh: virtiofsd did not start:" >&2
	cat "$work/virtiofsd-$name.log" >&2
	return 1
}

# boot NAME APPEND: one guest run; prints its qemu time, fails on a failed test.
boot() {
	local name=$1 append=$2 log=$work/tests-$1.log klog=$work/kernel-$1.log
	echo "== boot $name: $append"
	: >"$log"
	tail -n +1 -f "$log" &
	local tailpid=$! boot0
	boot0=$(date +%s.%N)
	set +e
	# no_timer_check: on a loaded host TCG can miss the kernel's IO-APIC
	# timer probe, which then panics before /init.
	local qargs=(-m "$mem_mib") vfspid=""
	if ((hostroot)); then
		start_virtiofsd "$name" || { set -e; kill "$tailpid" 2>/dev/null; return 1; }
		vfspid=$started_pid
		# vhost-user needs the guest memory shared with virtiofsd.
		qargs+=(-object "memory-backend-memfd,id=mem,size=${mem_mib}M,share=on" -numa node,memdev=mem
			-chardev "socket,id=vfs,path=$work/vfs-$name.sock"
			-device vhost-user-fs-pci,chardev=vfs,tag=hostroot)
	fi
	timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
		-machine q35 -accel tcg,thread=${VM_TCG_THREAD:-single} -cpu max -smp 2 "${qargs[@]}" \
		-nographic -no-reboot -monitor none \
		-serial "file:$klog" -serial "file:$log" \
		-kernel "$vmlinuz" -initrd "$work/initrd.cpio" \
		-append "console=ttyS0 panic=-1 quiet no_timer_check $append watcher_mech=$name"
	local qrc=$?
	if [[ -n $vfspid ]]; then
		kill "$vfspid" 2>/dev/null
		wait "$vfspid" 2>/dev/null
	fi
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
