package lsm

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
)

// Op is an operation judged as a whole, not by path (enum lsm_op in
// bpf/lsm.c).
type Op uint32

// Operations.
const (
	// OpPtraceAttach: ptrace attach and everything that needs the same
	// access to another process's memory: /proc/PID/mem of another
	// process, process_vm_readv/writev, pidfd_getfd.
	OpPtraceAttach Op = 1
	// OpPtraceRead: read-mode access checks on another process
	// (/proc/PID/environ, maps, kcmp). Denials of the kernel's silent
	// probes (e.g. ps reading /proc/PID/stat) hide fields, not files.
	OpPtraceRead Op = 2
	// OpPtraceTraceme: PTRACE_TRACEME, offering oneself to the parent.
	OpPtraceTraceme Op = 3
	// OpMount: mount(2), including remount, bind, MS_MOVE, propagation.
	OpMount Op = 4
	// OpUmount: umount(2).
	OpUmount Op = 5
	// OpMoveMount: move_mount(2), the only way to attach an fsmount(2) result.
	OpMoveMount Op = 6
	// OpPivotRoot: pivot_root(2).
	OpPivotRoot Op = 7
	// OpChroot: chroot(2).
	OpChroot Op = 8
	// OpFSConfig: new mount API, every fsconfig(2) parameter (fsopen itself
	// has no LSM hook).
	OpFSConfig Op = 9
	// OpKernelReadFile: the kernel reading a file as code or policy:
	// finit_module, kexec_file_load, firmware.
	OpKernelReadFile Op = 10
	// OpKernelLoadData: init_module and kexec_load from a buffer.
	OpKernelLoadData Op = 11
	// OpBPF: the bpf(2) syscall, any command.
	OpBPF Op = 12
	// OpProcMem: opening /proc/PID/mem for any PID, including self.
	OpProcMem Op = 13
	// OpAgentSignal: any signal to the agent's process. Blocked when no
	// rule says otherwise.
	OpAgentSignal Op = 14
	// OpAgentPtrace: any ptrace access check on the agent (attach and
	// read modes). Blocked when no rule says otherwise.
	OpAgentPtrace Op = 15
	// OpCloneIntoCgroup: clone3 with CLONE_INTO_CGROUP, a child started
	// straight into a cgroup chosen by directory fd (judged on the flag
	// the kernel copied; a plain fork or clone stays allowed).
	OpCloneIntoCgroup Op = 16
	// OpPerfEvent: perf_event_open(2).
	OpPerfEvent Op = 17
	// OpUserNS: creating a user namespace (clone or unshare CLONE_NEWUSER).
	OpUserNS Op = 18
	// OpKeyring: creating a key or keyring (add_key, keyctl).
	OpKeyring Op = 19
	// OpUserfaultfd: creating a userfaultfd (the kernel's anon inode).
	OpUserfaultfd Op = 20
	// OpIOUring: creating an io_uring instance, on kernels whose rings get
	// a secure anonymous inode (others: io_uring has no LSM hook).
	OpIOUring Op = 21
	// OpCloneFiles: clone or clone3 with CLONE_FILES and without
	// CLONE_THREAD, a second process sharing the file table (judged on
	// the flags the kernel copied at task_alloc; threads stay allowed).
	OpCloneFiles Op = 22
	// OpUnixConnect: the decision for a unix connect or datagram send
	// whose peer is bound outside Rules.UnixPaths (judged on the peer the
	// kernel found, by its bound path; abstract peers too). Without this
	// op, unix peers are not judged.
	OpUnixConnect Op = 23
	// OpExecFileless: exec, or a PROT_EXEC mapping, of a file with no name
	// (memfd_create + execveat, a file deleted after it was opened,
	// O_TMPFILE): no exec rule can name it.
	OpExecFileless Op = 24
	// OpKernelIface: the kernel group of the one dangerous list
	// (internal/dangerous) where no hook of its own judges it: the
	// capability the syscall checks first (iopl, ioperm, acct, swapon,
	// swapoff, reboot, open_by_handle_at), its key permissions (keyctl,
	// add_key, request_key use OpKeyring), or its entry point (fentry:
	// personality, name_to_handle_at, killed at entry).
	OpKernelIface Op = 25
	// OpOtherTask: an operation on a process outside the sandbox's own
	// subtree (policy operations.other_processes): signals by any route,
	// prlimit, priority and scheduling, ioprio, page migration,
	// ptrace-mode reads, kcmp.
	OpOtherTask Op = 26
	// OpOtherIPC: a System V IPC object or POSIX message queue the
	// sandbox did not create (operations.other_ipc).
	OpOtherIPC Op = 27
	// OpTTYInject: TIOCSTI or TIOCLINUX on any terminal
	// (operations.terminals).
	OpTTYInject Op = 28
	// OpNotifyMark: a fanotify or inotify mark on a file outside the
	// workspaces (operations.notify_marks).
	OpNotifyMark Op = 29
	opMax        Op = 30
)

// PathOp is what a file_op event changed (enum path_op in bpf/lsm.c).
type PathOp uint32

var pathOpNames = [...]string{"", "truncate", "create", "mkdir", "unlink", "rmdir", "symlink",
	"link_source", "link", "rename_from", "rename_to", "chmod", "chown", "setxattr", "removexattr",
	"exec", "mmap_exec", "utimes", "notify_mark"}

func (p PathOp) String() string {
	if int(p) < len(pathOpNames) && p != 0 {
		return pathOpNames[p]
	}
	return fmt.Sprintf("path_op(%d)", uint32(p))
}

var opNames = map[Op]string{
	OpPtraceAttach: "ptrace_attach", OpPtraceRead: "ptrace_read", OpPtraceTraceme: "ptrace_traceme",
	OpMount: "mount", OpUmount: "umount", OpMoveMount: "move_mount", OpPivotRoot: "pivot_root",
	OpChroot: "chroot", OpFSConfig: "fsconfig", OpKernelReadFile: "kernel_read_file",
	OpKernelLoadData: "kernel_load_data", OpBPF: "bpf", OpProcMem: "proc_mem",
	OpAgentSignal: "agent_signal", OpAgentPtrace: "agent_ptrace",
	OpCloneIntoCgroup: "clone_into_cgroup", OpPerfEvent: "perf_event_open", OpUserNS: "userns_create",
	OpKeyring: "key_alloc", OpUserfaultfd: "userfaultfd", OpIOUring: "io_uring_setup",
	OpCloneFiles: "clone_files", OpUnixConnect: "unix_connect", OpExecFileless: "exec_fileless",
	OpKernelIface: "kernel_interface", OpOtherTask: "other_process", OpOtherIPC: "other_ipc",
	OpTTYInject: "tty_inject", OpNotifyMark: "notify_mark",
}

// Checks of lsm_syscall_checks (CHECK_* in bpf/lsm.c); capabilities are
// their own number.
const (
	checkKey   = 64
	checkEntry = 65
	// syscallCompat: i386 numbers are keyed as syscallCompat + nr.
	syscallCompat = 0x10000
	// syscallTag marks a task event's mode as a syscall-scoped decision.
	syscallTag = 0x80000000
)

// groupOp is the op whose rule decides a dangerous-list entry judged in
// its syscall: the rule of its policy group.
func groupOp(o dangerous.Op) Op {
	switch {
	case o.Group == dangerous.GroupMount:
		return OpMount
	case o.Group == dangerous.GroupModule:
		return OpKernelLoadData
	case o.Group == dangerous.GroupIOUring:
		return OpIOUring
	case o.Hook == dangerous.HookKeyPermission:
		return OpKeyring
	}
	return OpKernelIface
}

// SyscallChecks lists lsm_syscall_checks' entries, from the one dangerous
// list: per syscall number (both tables) and check, the op deciding it.
func SyscallChecks() map[lsmSyscallCheckKey]Op {
	out := map[lsmSyscallCheckKey]Op{}
	for _, o := range dangerous.Ops {
		var checks []uint32
		switch {
		case o.Hook == dangerous.HookCapable:
			for _, c := range o.Caps() {
				checks = append(checks, uint32(c))
			}
		case o.Hook == dangerous.HookKeyPermission:
			checks = []uint32{checkKey}
		case o.AtEntry():
			checks = []uint32{checkEntry}
		}
		for _, c := range checks {
			if o.NR64 != dangerous.None {
				out[lsmSyscallCheckKey{Nr: uint32(o.NR64), Check: c}] = groupOp(o)
			}
			if o.NR32 != dangerous.None {
				out[lsmSyscallCheckKey{Nr: syscallCompat + uint32(o.NR32), Check: c}] = groupOp(o)
			}
		}
	}
	return out
}

// syscallName names a syscall-scoped decision's syscall (task event mode
// without syscallTag).
func syscallName(nr uint32) string {
	compat := nr >= syscallCompat
	for _, o := range dangerous.Ops {
		if !compat && o.NR64 != dangerous.None && uint32(o.NR64) == nr {
			return o.Name
		}
		if compat && o.NR32 != dangerous.None && uint32(o.NR32) == nr-syscallCompat {
			return o.Name + " (i386)"
		}
	}
	return fmt.Sprintf("syscall %d", nr)
}

// writeSyscallChecks fills lsm_syscall_checks (the same content for every
// agent: the list is compiled in). Stale entries are removed after the
// new ones are written.
func writeSyscallChecks(coll *ebpf.Collection) error {
	m := coll.Maps["lsm_syscall_checks"]
	if m == nil {
		return errors.New("lsm_syscall_checks map missing")
	}
	want := SyscallChecks()
	for k, op := range want {
		if err := m.Put(k, uint32(op)); err != nil {
			return fmt.Errorf("write lsm_syscall_checks: %w", err)
		}
	}
	var k lsmSyscallCheckKey
	var v uint32
	var stale []lsmSyscallCheckKey
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		m.Delete(k)
	}
	return nil
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", uint32(o))
}

// Decision is what a rule does (enforce.ActionAllow/Record/Block/Kill) and
// the policy rule id reported in events.
type Decision struct {
	Action uint32
	RuleID uint32
}

// Access selects which opens a file rule applies to.
type Access uint8

// Access bits; zero means both.
const (
	AccessRead  Access = 1
	AccessWrite Access = 2 // FMODE_WRITE, O_TRUNC or O_APPEND
	AccessAll   Access = AccessRead | AccessWrite
)

// PathRule judges opens by the path the kernel resolved (bpf_d_path of the
// opened file, relative to the opening task's root).
type PathRule struct {
	// Path is absolute, at most 251 bytes.
	Path string
	// Prefix matches every path that starts with Path byte for byte
	// ("/etc/sudoers" covers /etc/sudoers.d/x). A Path ending in "/" also
	// matches the directory itself. False: exactly Path; an exact rule
	// also matches the file's inode (as it is when the rules are set), so
	// hard links to it are judged the same; that file only, not a later
	// one given its inode number (enforce.FileID).
	Prefix bool
	// Access is what the rule judges; the other access inherits from the
	// longest enclosing prefix rule. Zero means both.
	Access Access
	// Decision for the matched access.
	Decision
}

// FSRule judges every open on a filesystem type, by superblock magic
// (unix.CGROUP2_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.BPF_FS_MAGIC...).
type FSRule struct {
	Magic  uint64
	Access Access // zero: both
	Decision
}

// AnyDevice is a wildcard for DeviceRule.Major and Minor.
const AnyDevice = ^uint32(0)

// DeviceRule judges opens of device nodes by type and number (the node's
// i_rdev), wherever the node lives (/dev/mem is char 1:1; a copy made
// with mknod elsewhere is the same device).
type DeviceRule struct {
	Block        bool   // block device; false: character device
	Major, Minor uint32 // or AnyDevice
	Access       Access // zero: both
	Decision
}

// CapRule records or blocks the use of one capability (CAP_*), as
// checked by the capable LSM hook after the capability module granted it.
type CapRule struct {
	Cap int
	Decision
}

// ExecRule judges the files that supply code to a process, by the path
// the kernel resolved: the executable, a script's interpreter (each
// binary of an execve chain passes bprm_check_security), and files mapped
// executable (mmap_file, file_mprotect with PROT_EXEC: `ld.so /tmp/x`, a
// preloaded library). What a noexec mount means, per path.
type ExecRule struct {
	// Path is absolute, at most 251 bytes.
	Path string
	// Prefix matches every path starting with Path; false: exactly Path.
	Prefix bool
	Decision
}

// Rules are one sandbox's LSM rules. File tables are all consulted and the
// strictest match wins; when none of the sandbox's file tables match, the
// defaults (sandbox id 0) are consulted. Ops missing here fall back to the
// defaults, then to allow (block for OpAgentSignal and OpAgentPtrace).
type Rules struct {
	Ops     map[Op]Decision
	Paths   []PathRule
	FS      []FSRule
	Devices []DeviceRule
	Caps    []CapRule
	// Exec rules: the longest matching prefix decides; none: allowed.
	Exec []ExecRule
	// Sockets judge socket creation by family, type and protocol, for
	// every family (socket_create).
	Sockets []SocketRule
	// UnixPaths are the unix socket paths a connect or datagram send may
	// reach when Ops has OpUnixConnect: a path ending in "/" covers
	// everything below it, others exactly that path. Judged on the bound
	// path of the socket the kernel found (symlinks resolved).
	UnixPaths []string
	// NotifyPaths are where inotify and fanotify marks may go when Ops
	// has OpNotifyMark (the sandbox's workspaces): a path ending in "/"
	// covers everything below it, others exactly that path. Judged on the
	// path the kernel resolved for the mark.
	NotifyPaths []string
}

// AnySocket is a wildcard for SocketRule's Family, Type and Protocol.
const AnySocket = -1

// SocketRule judges socket(2) and socketpair(2) from a sandbox. Lookups go
// from the most specific pattern to the least: (family, type, protocol),
// (family, any, protocol), (family, type, any), (family, any, any), (any,
// type, any), like cgroupbpf.SocketRule, whose rules it can carry over
// to families cgroup/sock_create never sees (AF_PACKET, AF_NETLINK...).
type SocketRule struct {
	Family, Type, Protocol int // AF_*, SOCK_*, IPPROTO_*, or AnySocket
	Decision
}

const pathKeyLen = len(lsmPathKey{}.Path)

// kernelDev converts a stat st_dev to the kernel's internal dev_t.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}

func checkDecision(d Decision) error {
	if d.Action > enforce.ActionKill {
		return fmt.Errorf("action %d out of range", d.Action)
	}
	return nil
}

func accessOrAll(a Access) Access {
	if a == 0 {
		return AccessAll
	}
	return a
}

// merge applies d to the accesses in a, keeping the stricter decision.
func merge(r *lsmAccessRule, set *Access, a Access, d Decision) {
	if a&AccessRead != 0 && (*set&AccessRead == 0 || d.Action > r.ReadAction) {
		r.ReadAction, r.ReadRule = d.Action, d.RuleID
	}
	if a&AccessWrite != 0 && (*set&AccessWrite == 0 || d.Action > r.WriteAction) {
		r.WriteAction, r.WriteRule = d.Action, d.RuleID
	}
	*set |= a
}

type pathEntry struct {
	key  string // path bytes, with a trailing NUL for exact rules
	rule lsmAccessRule
	set  Access
}

// buildPaths turns path rules into LPM entries, filling each entry's
// unspecified access from the longest enclosing prefix entry.
func buildPaths(rules []PathRule) (map[string]*pathEntry, error) {
	entries := map[string]*pathEntry{}
	add := func(key string, a Access, d Decision) {
		e := entries[key]
		if e == nil {
			e = &pathEntry{key: key}
			entries[key] = e
		}
		merge(&e.rule, &e.set, a, d)
	}
	for _, r := range rules {
		if !strings.HasPrefix(r.Path, "/") {
			return nil, fmt.Errorf("path rule %q: not absolute", r.Path)
		}
		if strings.IndexByte(r.Path, 0) >= 0 {
			return nil, fmt.Errorf("path rule %q: contains NUL", r.Path)
		}
		if len(r.Path)+1 > pathKeyLen {
			return nil, fmt.Errorf("path rule %q: longer than %d bytes", r.Path, pathKeyLen-1)
		}
		if err := checkDecision(r.Decision); err != nil {
			return nil, fmt.Errorf("path rule %q: %w", r.Path, err)
		}
		a := accessOrAll(r.Access)
		if !r.Prefix {
			add(r.Path+"\x00", a, r.Decision)
			continue
		}
		add(r.Path, a, r.Decision)
		if len(r.Path) > 1 && strings.HasSuffix(r.Path, "/") {
			add(strings.TrimSuffix(r.Path, "/")+"\x00", a, r.Decision)
		}
	}
	// Inherit, longest enclosing first: process keys by length so each
	// enclosing entry is complete before its children read it.
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) < len(keys[j]) })
	for _, k := range keys {
		e := entries[k]
		if e.set == AccessAll {
			continue
		}
		var parent *pathEntry
		for _, pk := range keys {
			if len(pk) >= len(k) {
				break
			}
			if !strings.HasSuffix(pk, "\x00") && strings.HasPrefix(k, pk) {
				parent = entries[pk] // keys are sorted: the last hit is the longest
			}
		}
		if parent == nil {
			continue
		}
		if e.set&AccessRead == 0 {
			e.rule.ReadAction, e.rule.ReadRule = parent.rule.ReadAction, parent.rule.ReadRule
		}
		if e.set&AccessWrite == 0 {
			e.rule.WriteAction, e.rule.WriteRule = parent.rule.WriteAction, parent.rule.WriteRule
		}
		e.set = AccessAll
	}
	return entries, nil
}

// prefixInodes adds inode entries for the files below prefix rules that
// judge reads, each with the rule its own path gets (the longest matching
// entry: an allowed file below a protected directory stays allowed), as
// the files are now (each entry with the file's generation: a file
// deleted later does not lend its entry to the next file given the
// number). A file created, moved in or replaced later needs another
// SetRules (the agent watches these directories). Exact rules' entries
// win over these.
func prefixInodes(sid uint32, entries map[string]*pathEntry, inodes map[lsmInoKey]lsmInoRule) error {
	var prefixes []string
	for key, e := range entries {
		if !strings.HasSuffix(key, "\x00") && e.rule.ReadAction != enforce.ActionAllow && key != "/" {
			prefixes = append(prefixes, key)
		}
	}
	sort.Strings(prefixes)
	budget := enforce.MaxTreeInodes
	exact := map[lsmInoKey]bool{}
	for k := range inodes {
		exact[k] = true
	}
	for _, pfx := range prefixes {
		_, err := enforce.TreeInodes(strings.TrimSuffix(pfx, "/"), &budget, func(path string, id *enforce.FileID) {
			e := longestEntry(entries, path, id.Mode&unix.S_IFMT == unix.S_IFDIR)
			if e == nil || (e.rule.ReadAction == enforce.ActionAllow && e.rule.WriteAction == enforce.ActionAllow) {
				return
			}
			ik := lsmInoKey{SandboxId: sid, Dev: kernelDev(id.Dev), Ino: id.Ino}
			if !exact[ik] {
				inodes[ik] = lsmInoRule{Rule: e.rule, Generation: id.Generation}
			}
		})
		if err != nil {
			return fmt.Errorf("inodes below %q: %w", pfx, err)
		}
	}
	return nil
}

// longestEntry returns the entry the kernel's longest prefix match picks
// for path (a directory also as path + "/").
func longestEntry(entries map[string]*pathEntry, path string, dir bool) *pathEntry {
	if e, ok := entries[path+"\x00"]; ok {
		return e
	}
	var best *pathEntry
	bestLen := -1
	for key, e := range entries {
		if strings.HasSuffix(key, "\x00") || len(key) <= bestLen {
			continue
		}
		if strings.HasPrefix(path, key) || (dir && strings.HasPrefix(path+"/", key)) {
			best, bestLen = e, len(key)
		}
	}
	return best
}

func pathKey(sid uint32, key string) lsmPathKey {
	k := lsmPathKey{SandboxId: sid, Prefixlen: uint32(32 + 8*len(key))}
	for i := 0; i < len(key); i++ {
		k.Path[i] = int8(key[i])
	}
	return k
}

// SetRules replaces the rules of sandbox id sid (0: the defaults). New
// entries are written before stale ones are removed, so a rule present in
// both the old and the new set is never absent.
func (l *LSM) SetRules(sid uint32, r Rules) error {
	if err := l.setRules(sid, r); err != nil {
		return fmt.Errorf("set lsm rules for sandbox %d: %w", sid, err)
	}
	return nil
}

func (l *LSM) setRules(sid uint32, r Rules) error {
	m := l.maps.Maps
	if err := writeMmapMinAddr(l.maps); err != nil {
		return err
	}
	// Build everything first: invalid rules change nothing.
	ops := map[lsmOpKey]lsmDecision{}
	for op, d := range r.Ops {
		if op == 0 || op >= opMax {
			return fmt.Errorf("unknown op %d", op)
		}
		if err := checkDecision(d); err != nil {
			return fmt.Errorf("op %s: %w", op, err)
		}
		ops[lsmOpKey{SandboxId: sid, Op: uint32(op)}] = lsmDecision{Action: d.Action, RuleId: d.RuleID}
	}
	entries, err := buildPaths(r.Paths)
	if err != nil {
		return err
	}
	paths := map[lsmPathKey]lsmAccessRule{}
	inodes := map[lsmInoKey]lsmInoRule{}
	for key, e := range entries {
		paths[pathKey(sid, key)] = e.rule
		if !strings.HasSuffix(key, "\x00") {
			continue
		}
		// Exact rules also match the file's identity (hard links): its
		// inode number and generation, so the entry never judges a later
		// file given the number (enforce.FileID).
		id, err := enforce.IdentifyFile(strings.TrimSuffix(key, "\x00"), true)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EACCES) {
				continue
			}
			return fmt.Errorf("identify %q: %w", strings.TrimSuffix(key, "\x00"), err)
		}
		ik := lsmInoKey{SandboxId: sid, Dev: kernelDev(id.Dev), Ino: id.Ino}
		if old, ok := inodes[ik]; ok {
			// Two exact paths naming one file: keep the stricter per access.
			set := AccessAll
			merge(&old.Rule, &set, AccessRead, Decision{e.rule.ReadAction, e.rule.ReadRule})
			merge(&old.Rule, &set, AccessWrite, Decision{e.rule.WriteAction, e.rule.WriteRule})
			inodes[ik] = old
			continue
		}
		inodes[ik] = lsmInoRule{Rule: e.rule, Generation: id.Generation}
	}
	if err := prefixInodes(sid, entries, inodes); err != nil {
		return err
	}
	execs := map[lsmPathKey]lsmDecision{}
	for _, r := range r.Exec {
		if !strings.HasPrefix(r.Path, "/") || strings.IndexByte(r.Path, 0) >= 0 || len(r.Path)+1 > pathKeyLen {
			return fmt.Errorf("exec rule %q: not an absolute path of at most %d bytes", r.Path, pathKeyLen-1)
		}
		if err := checkDecision(r.Decision); err != nil {
			return fmt.Errorf("exec rule %q: %w", r.Path, err)
		}
		key := r.Path
		if !r.Prefix {
			key += "\x00"
		}
		execs[pathKey(sid, key)] = lsmDecision{Action: r.Action, RuleId: r.RuleID}
	}
	socks, err := socketEntries(sid, r.Sockets)
	if err != nil {
		return err
	}
	unixPaths, err := allowPaths(sid, "unix socket", r.UnixPaths)
	if err != nil {
		return err
	}
	notifyPaths, err := allowPaths(sid, "notify mark", r.NotifyPaths)
	if err != nil {
		return err
	}
	fs := map[lsmFsKey]lsmAccessRule{}
	fsSet := map[lsmFsKey]Access{}
	for _, f := range r.FS {
		if err := checkDecision(f.Decision); err != nil {
			return fmt.Errorf("fs rule %#x: %w", f.Magic, err)
		}
		k := lsmFsKey{SandboxId: sid, Magic: f.Magic}
		rule, set := fs[k], fsSet[k]
		merge(&rule, &set, accessOrAll(f.Access), f.Decision)
		fs[k], fsSet[k] = rule, set
	}
	devs := map[lsmDevKey]lsmAccessRule{}
	devSet := map[lsmDevKey]Access{}
	for _, d := range r.Devices {
		if err := checkDecision(d.Decision); err != nil {
			return fmt.Errorf("device rule %d:%d: %w", d.Major, d.Minor, err)
		}
		if d.Major == AnyDevice && d.Minor != AnyDevice {
			return fmt.Errorf("device rule *:%d: a minor needs a major", d.Minor)
		}
		typ := uint32(2)
		if d.Block {
			typ = 1
		}
		k := lsmDevKey{SandboxId: sid, Type: typ, Major: d.Major, Minor: d.Minor}
		rule, set := devs[k], devSet[k]
		merge(&rule, &set, accessOrAll(d.Access), d.Decision)
		devs[k], devSet[k] = rule, set
	}
	var caps lsmCapRules
	for _, c := range r.Caps {
		if c.Cap < 0 || c.Cap >= 64 {
			return fmt.Errorf("capability %d out of range", c.Cap)
		}
		if err := checkDecision(c.Decision); err != nil {
			return fmt.Errorf("capability %d: %w", c.Cap, err)
		}
		bit := uint64(1) << c.Cap
		switch c.Action {
		case enforce.ActionAllow:
			continue
		case enforce.ActionRecord:
			if caps.Block&bit == 0 {
				caps.Record |= bit
				caps.RuleId[c.Cap] = c.RuleID
			}
		default: // block; kill is treated as block for capabilities
			caps.Block |= bit
			caps.RuleId[c.Cap] = c.RuleID
		}
	}

	// Write, then prune.
	if err := enforce.PutAll(m["lsm_op_rules"], ops); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_path_rules"], paths); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_exec_rules"], execs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_inode_rules"], inodes); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_fs_rules"], fs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_dev_rules"], devs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_sock_rules"], socks); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_unix_rules"], unixPaths); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_notify_paths"], notifyPaths); err != nil {
		return err
	}
	capMap := m["lsm_cap_rules"]
	if caps.Record|caps.Block != 0 {
		if err := capMap.Put(sid, caps); err != nil {
			return fmt.Errorf("lsm_cap_rules: %w", err)
		}
	} else if err := capMap.Delete(sid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lsm_cap_rules: %w", err)
	}
	if err := enforce.PruneMap(m["lsm_op_rules"], func(k lsmOpKey) bool { _, keep := ops[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_path_rules"], func(k lsmPathKey) bool { _, keep := paths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_exec_rules"], func(k lsmPathKey) bool { _, keep := execs[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_inode_rules"], func(k lsmInoKey) bool { _, keep := inodes[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_fs_rules"], func(k lsmFsKey) bool { _, keep := fs[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_sock_rules"], func(k lsmSockKey) bool { _, keep := socks[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_unix_rules"], func(k lsmPathKey) bool { _, keep := unixPaths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_notify_paths"], func(k lsmPathKey) bool { _, keep := notifyPaths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	return enforce.PruneMap(m["lsm_dev_rules"], func(k lsmDevKey) bool { _, keep := devs[k]; return k.SandboxId != sid || keep })
}

// allowPaths builds the LPM entries of sandbox sid allowing paths (what
// names what they are for errors): a path ending in "/" covers the tree
// below it, others exactly that path.
func allowPaths(sid uint32, what string, paths []string) (map[lsmPathKey]lsmDecision, error) {
	out := map[lsmPathKey]lsmDecision{}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 || len(p)+1 > pathKeyLen {
			return nil, fmt.Errorf("%s path %q: not an absolute path of at most %d bytes", what, p, pathKeyLen-1)
		}
		key := p
		if !strings.HasSuffix(p, "/") {
			key += "\x00"
		}
		out[pathKey(sid, key)] = lsmDecision{Action: enforce.ActionAllow}
	}
	return out, nil
}

// socketEntries builds the lsm_sock_rules entries of sandbox sid.
func socketEntries(sid uint32, rules []SocketRule) (map[lsmSockKey]lsmDecision, error) {
	field := func(v int, what string) (uint32, error) {
		switch {
		case v == AnySocket:
			return ^uint32(0), nil
		case v < 0 || v > 0xffff:
			return 0, fmt.Errorf("socket %s %d out of range", what, v)
		}
		return uint32(v), nil
	}
	out := map[lsmSockKey]lsmDecision{}
	for _, r := range rules {
		if err := checkDecision(r.Decision); err != nil {
			return nil, fmt.Errorf("socket rule %d/%d/%d: %w", r.Family, r.Type, r.Protocol, err)
		}
		fam, err := field(r.Family, "family")
		if err != nil {
			return nil, err
		}
		typ, err := field(r.Type, "type")
		if err != nil {
			return nil, err
		}
		proto, err := field(r.Protocol, "protocol")
		if err != nil {
			return nil, err
		}
		if fam == ^uint32(0) && (typ == ^uint32(0) || proto != ^uint32(0)) {
			return nil, fmt.Errorf("socket rule */%d/%d: an any-family rule needs a type and any protocol (it is not looked up otherwise)", r.Type, r.Protocol)
		}
		k := lsmSockKey{SandboxId: sid, Family: fam, Type: typ, Protocol: proto}
		if old, ok := out[k]; ok && old.Action >= r.Action {
			continue // the stricter rule wins
		}
		out[k] = lsmDecision{Action: r.Action, RuleId: r.RuleID}
	}
	return out, nil
}

// ClearRules removes every rule of sandbox sid.
func (l *LSM) ClearRules(sid uint32) error { return l.SetRules(sid, Rules{}) }

// ProtectAgentFiles returns prefix rules refusing every open (read and
// write) of the given agent paths (ledger directory, key files, the bpffs
// pin directory): directories should end in "/".
func ProtectAgentFiles(ruleID uint32, paths ...string) []PathRule {
	out := make([]PathRule, 0, len(paths))
	for _, p := range paths {
		out = append(out, PathRule{Path: p, Prefix: true, Decision: Decision{Action: enforce.ActionBlock, RuleID: ruleID}})
	}
	return out
}

// statDev is used by tests and callers building DeviceRules from a node.
func statDev(path string) (block bool, major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, 0, 0, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		block = true
	case unix.S_IFCHR:
	default:
		return false, 0, 0, fmt.Errorf("%s is not a device node", path)
	}
	return block, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), nil
}

// DeviceRuleFor builds a rule for the device node at path.
func DeviceRuleFor(path string, access Access, d Decision) (DeviceRule, error) {
	block, major, minor, err := statDev(path)
	if err != nil {
		return DeviceRule{}, fmt.Errorf("device rule for %s: %w", path, err)
	}
	return DeviceRule{Block: block, Major: major, Minor: minor, Access: access, Decision: d}, nil
}
