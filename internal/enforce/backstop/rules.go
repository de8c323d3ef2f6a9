package backstop

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// Categories (enum bs_category in bpf/backstop.c).
const (
	catCgroupWrite  = 1
	catProcMem      = 2
	catCloneFiles   = 3
	catIOUring      = 4
	catIOUringOpen  = 5
	catSignalAgent  = 6
	catCgroupEscape = 7
	catPath         = 8
	catCompat       = 9
	catModify       = 10
	catExecFileless = 11
	catMmapExec     = 12
	catPacketSocket = 13
	catUnixPeer     = 14
	catLowMapping   = 15
	catOtherTask    = 16
	catTTYInject    = 17
	catNetConfig    = 18
	catClockAdjust  = 19
	catNamespaces   = 20
	catSyslog       = 21
	catQuota        = 22
	catCapUse       = 23
	catOtherIPC     = 24
	catNotifyMark   = 25
	catMax          = 26
)

var categoryNames = map[uint32]string{
	catCgroupWrite: "cgroup_write", catProcMem: "proc_mem", catCloneFiles: "clone_files",
	catIOUring: "io_uring", catIOUringOpen: "io_uring_open", catSignalAgent: "signal_agent",
	catCgroupEscape: "cgroup_escape", catPath: "path", catCompat: "compat_syscall",
	catModify: "modified_outside_writable", catExecFileless: "exec_fileless", catMmapExec: "mmap_exec",
	catPacketSocket: "packet_socket", catUnixPeer: "unix_peer", catLowMapping: "low_mapping",
	catOtherTask: "other_process", catTTYInject: "tty_inject", catNetConfig: "net_config",
	catClockAdjust: "clock_adjust", catNamespaces: "namespaces", catSyslog: "syslog",
	catQuota: "quota", catCapUse: "capability_used", catOtherIPC: "other_ipc", catNotifyMark: "notify_mark",
}

// compatNRBase: events carry i386 syscall n as compatNRBase+n.
const compatNRBase = 0x10000

// Syscalls is the x86_64 syscall table for the names rules may use.
var Syscalls = map[string]int{
	"getpid": 39, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "kill": 62,
	"ptrace": 101, "rt_sigqueueinfo": 129, "pivot_root": 155, "chroot": 161,
	"mount": 165, "umount2": 166, "init_module": 175, "delete_module": 176,
	"tkill": 200, "tgkill": 234, "kexec_load": 246, "rt_tgsigqueueinfo": 297,
	"perf_event_open": 298, "open_by_handle_at": 304, "process_vm_readv": 310,
	"process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
	"userfaultfd": 323, "pidfd_send_signal": 424, "io_uring_setup": 425,
	"io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
	"fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
	"pidfd_getfd": 438, "mount_setattr": 442, "keyctl": 250, "add_key": 248,
	"request_key": 249, "setns": 308, "unshare": 272, "reboot": 169, "mmap": 9, "socket": 41,
	"mprotect": 10, "pkey_mprotect": 329,
	"mremap": 25, "shmat": 30, "execveat": 322,
	"ioctl": 16, "fcntl": 72, "syslog": 103, "setpriority": 141, "sched_setparam": 142,
	"sched_setscheduler": 144, "adjtimex": 159, "quotactl": 179, "sched_setaffinity": 203,
	"ioprio_set": 251, "migrate_pages": 256, "move_pages": 279, "prlimit64": 302,
	"clock_adjtime": 305, "kcmp": 312, "sched_setattr": 314, "pidfd_open": 434,
	"process_madvise": 440, "quotactl_fd": 443,
	"shmctl": 31, "semop": 65, "semctl": 66, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220,
	"mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
}

// The one list of dangerous syscalls names every entry rules may use.
func init() {
	for _, o := range dangerous.Ops {
		if o.NR64 != dangerous.None {
			Syscalls[o.Name] = o.NR64
		}
	}
	for _, o := range dangerous.HostState {
		if o.NR64 != dangerous.None {
			Syscalls[o.Name] = o.NR64
		}
	}
}

// SyscallName returns the name of nr, or "" when not in Syscalls.
func SyscallName(nr int64) string {
	for name, n := range Syscalls {
		if int64(n) == nr {
			return name
		}
	}
	return ""
}

// categorySyscalls are checked by argument; their action is the
// category's. A syscall judged for several categories (bpf/backstop.c
// entry_category picks one by its arguments) is on the slow path when any
// of them has a rule.
var categorySyscalls = map[string][]uint32{
	"clone": {catCloneFiles, catNamespaces}, "clone3": {catCloneFiles}, "io_uring_setup": {catIOUring},
	"kill": {catOtherTask, catSignalAgent}, "tkill": {catOtherTask, catSignalAgent}, "tgkill": {catOtherTask, catSignalAgent},
	"rt_sigqueueinfo": {catOtherTask, catSignalAgent}, "rt_tgsigqueueinfo": {catOtherTask, catSignalAgent},
	"pidfd_send_signal": {catOtherTask, catSignalAgent}, "mmap": {catMmapExec}, "socket": {catPacketSocket},
	"mprotect": {catMmapExec}, "pkey_mprotect": {catMmapExec},
	"ioctl": {catTTYInject, catNetConfig, catOtherTask}, "fcntl": {catOtherTask},
	"pidfd_open": {catOtherTask}, "prlimit64": {catOtherTask}, "setpriority": {catOtherTask},
	"ioprio_set": {catOtherTask}, "sched_setparam": {catOtherTask}, "sched_setscheduler": {catOtherTask},
	"sched_setaffinity": {catOtherTask}, "sched_setattr": {catOtherTask}, "migrate_pages": {catOtherTask},
	"move_pages": {catOtherTask}, "process_madvise": {catOtherTask}, "kcmp": {catOtherTask},
	"adjtimex": {catClockAdjust}, "clock_adjtime": {catClockAdjust},
	"setns": {catNamespaces}, "unshare": {catNamespaces},
	"syslog": {catSyslog}, "quotactl": {catQuota}, "quotactl_fd": {catQuota},
	"shmat": {catOtherIPC}, "shmctl": {catOtherIPC}, "semop": {catOtherIPC}, "semtimedop": {catOtherIPC},
	"semctl": {catOtherIPC}, "msgsnd": {catOtherIPC}, "msgrcv": {catOtherIPC}, "msgctl": {catOtherIPC},
	"mq_timedsend": {catOtherIPC}, "mq_timedreceive": {catOtherIPC}, "mq_notify": {catOtherIPC},
}

// DefaultRules is the backstop for the dangerous operations watcher refuses
// with BPF LSM where it can: everything killed.
func DefaultRules() backstoprules.Rules {
	kill := backstoprules.Rule{Action: enforce.ActionKill}
	var r backstoprules.Rules
	for _, name := range []string{
		"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
		"mount", "umount2", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
		"mount_setattr", "pivot_root", "chroot",
		"bpf", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	} {
		r.Syscalls = append(r.Syscalls, backstoprules.SyscallRule{Name: name, Rule: kill})
	}
	rw := backstoprules.OpRead | backstoprules.OpWrite
	for _, p := range []backstoprules.PathRule{
		{Path: "/etc/shadow", Ops: rw}, {Path: "/etc/gshadow", Ops: rw},
		{Path: "/etc/shadow-", Ops: rw}, {Path: "/etc/gshadow-", Ops: rw},
		{Path: "/etc/sudoers", Ops: rw}, {Path: "/etc/sudoers.d/", Prefix: true, Ops: rw},
		{Path: "/etc/ssh/ssh_host_", Prefix: true, Ops: rw},
		{Path: "/root/.ssh/", Prefix: true, Ops: rw},
		{Path: "/dev/mem", Ops: rw}, {Path: "/dev/kmem", Ops: rw}, {Path: "/dev/port", Ops: rw},
		{Path: "/proc/kcore", Ops: rw},
		{Path: "/proc/sys/", Prefix: true, Ops: backstoprules.OpWrite},
		{Path: "/sys/", Prefix: true, Ops: backstoprules.OpWrite},
		{Path: "/sys/fs/bpf/", Prefix: true, Ops: rw},
	} {
		p.Rule = kill
		r.Paths = append(r.Paths, p)
	}
	r.CgroupWrite, r.ProcMem, r.CloneFiles = kill, kill, kill
	r.IOUring, r.IOUringOpen, r.SignalAgent, r.CgroupEscape = kill, kill, kill, kill
	r.Compat = kill
	return r
}

// SetRules replaces the rule maps' contents with r. New entries are written
// before stale ones are removed, so rules present in both sets never lapse.
// Once attached, the raw syscall tracepoints follow the rules: attached
// after rules that need them are written, detached after the last such
// rule is removed.
//
// The verdict cache is off while the maps are written (the rules
// generation is odd) and every verdict cached before is stale after.
func (b *Backstop) SetRules(r backstoprules.Rules) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.advanceRulesGen(false); err != nil {
		return err
	}
	if err := b.setSyscalls(r); err != nil {
		return err
	}
	if err := b.setPaths(r.Paths); err != nil {
		return err
	}
	if err := b.setDirs(r); err != nil {
		return err
	}
	if err := b.setUnixPaths(r.UnixPaths); err != nil {
		return err
	}
	if err := b.writeMmapMinAddr(); err != nil {
		return err
	}
	b.needSyscalls = r.NeedsSyscallTracepoints()
	if b.attached {
		if err := b.syncSyscallsLocked(); err != nil {
			return err
		}
	}
	return b.advanceRulesGen(b.cacheReadyLocked())
}

// setDirs writes the inode table that judges changes made without a
// write-open. Places that do not exist are left out (nothing to change).
func (b *Backstop) setDirs(r backstoprules.Rules) error {
	m := b.maps("bs_dirs")
	dirs := r.Dirs
	if dirs == nil {
		for _, p := range r.Paths {
			if p.Ops&backstoprules.OpRead != 0 && p.Action != enforce.ActionAllow && p.Path != "/" {
				dirs = append(dirs, backstoprules.DirRule{Path: p.Path, Kind: backstoprules.DirProtected, SandboxID: p.SandboxID, Rule: p.Rule})
			}
		}
	}
	want := map[backstopDirKey]backstopDirRule{}
	for _, d := range dirs {
		if err := checkAction(d.Action); err != nil {
			return fmt.Errorf("backstop dir rule %q: %w", d.Path, err)
		}
		if d.Kind == backstoprules.DirDefault {
			want[backstopDirKey{SandboxId: d.SandboxID}] = backstopDirRule{Action: d.Action, RuleId: d.ID}
			continue
		}
		id, err := enforce.IdentifyFile(d.Path, true)
		if err != nil {
			continue
		}
		k := backstopDirKey{Ino: id.Ino, Dev: devOf(id.Dev), SandboxId: d.SandboxID}
		if cur, ok := want[k]; ok && cur.Kind == uint32(backstoprules.DirProtected) {
			continue // protection wins over an allowance on the same inode
		}
		// With the generation: a later file reusing the number is
		// another place (enforce.FileID).
		want[k] = backstopDirRule{Kind: uint32(d.Kind), Action: d.Action, RuleId: d.ID, Generation: id.Generation}
	}
	if len(want) > 0 {
		devs, err := mountedDevs()
		if err != nil {
			return err
		}
		for _, d := range devs {
			want[backstopDirKey{Dev: d, SandboxId: mountedSB}] = backstopDirRule{}
		}
	}
	if err := enforce.SyncMap(m, want); err != nil {
		return fmt.Errorf("backstop dir rules: %w", err)
	}
	return nil
}

// AgentSignals returns how many times sandboxed processes signalled the
// agent with sig (any route: kill, process groups, SIGIO of a file
// owner...), so the agent can ignore a termination request it did not get
// from its operator.
func (b *Backstop) AgentSignals(sig syscall.Signal) (uint64, error) {
	var n uint64
	if err := b.maps("bs_agent_signals").Lookup(uint32(sig), &n); err != nil {
		return 0, fmt.Errorf("agent signal count: %w", err)
	}
	return n, nil
}

// OperatorSignals returns how many times sig reached the agent the way
// its operator sends it: from a user process outside every sandbox (kill,
// tgkill, sigqueue) or from the kernel itself (a terminal's ^C), never a
// file owner's SIGIO. Counted in the kernel before delivery.
func (b *Backstop) OperatorSignals(sig syscall.Signal) (uint64, error) {
	var n uint64
	if err := b.maps("bs_operator_signals").Lookup(uint32(sig), &n); err != nil {
		return 0, fmt.Errorf("operator signal count: %w", err)
	}
	return n, nil
}

// Keys of bs_sb_rules (SBR_* in bpf/backstop.c): what a per-sandbox
// rule is for.
const (
	sbrSyscall   = 0x00000 // x86_64 syscall number
	sbrSyscall32 = 0x10000 // i386 syscall number
	sbrCategory  = 0x20000 // category
	sbrCap       = 0x40000 // capability refused when used (cap_capable)
)

// sandboxTable is one sandbox's syscall and category rules by bs_sb_rules
// "what" (sbr* | number), allow entries left out.
type sandboxTable map[uint32]backstoprules.Rule

// table validates r and lays it out by bs_sb_rules key.
func sandboxTableOf(r backstoprules.SandboxRules) (sandboxTable, error) {
	t := sandboxTable{}
	set := func(what uint32, rule backstoprules.Rule) {
		// By i386 number only where 32-bit calls run at all: a compat
		// rule decides every one of them before its number is looked at.
		if rule.Action != enforce.ActionAllow && (what&sbrSyscall32 == 0 || r.Compat.Action == enforce.ActionAllow && !r.NoI386) {
			t[what] = rule
		}
	}
	for _, sr := range r.Syscalls {
		nr, ok := Syscalls[sr.Name]
		if !ok {
			return nil, fmt.Errorf("backstop rule: unknown syscall %q", sr.Name)
		}
		if _, isCat := categorySyscalls[sr.Name]; isCat {
			return nil, fmt.Errorf("backstop rule: syscall %q is argument-checked: use its category rule", sr.Name)
		}
		if err := checkAction(sr.Action); err != nil {
			return nil, fmt.Errorf("backstop rule for %s: %w", sr.Name, err)
		}
		set(sbrSyscall|uint32(nr), sr.Rule)
		// The same rule by i386 number, from the one list.
		if op, ok := dangerous.Lookup(sr.Name); ok && op.NR32 != dangerous.None && op.NR32 < maxSyscalls {
			set(sbrSyscall32|uint32(op.NR32), sr.Rule)
			if sr.Name == "umount2" {
				set(sbrSyscall32|22, sr.Rule) // i386 umount
			}
		}
	}
	for c, rule := range r.CapUse {
		if c < 0 || c > 63 {
			return nil, fmt.Errorf("backstop capability rule: capability %d out of range", c)
		}
		if err := checkAction(rule.Action); err != nil {
			return nil, fmt.Errorf("backstop capability %d rule: %w", c, err)
		}
		set(sbrCap|uint32(c), rule)
		// The gate of the cap_capable program.
		if rule.Action != enforce.ActionAllow && rule.Action > t[sbrCategory|catCapUse].Action {
			t[sbrCategory|catCapUse] = rule
		}
	}
	cats := categoriesOf(r)
	for cat, rule := range cats {
		if err := checkAction(rule.Action); err != nil {
			return nil, fmt.Errorf("backstop %s rule: %w", categoryNames[cat], err)
		}
		set(sbrCategory|cat, rule)
	}
	// io_uring_setup is a category in the x86_64 table (argument-free, but
	// shared with the ring-open checks); by i386 number it is a plain rule,
	// for sandboxes that let 32-bit calls run (Compat allows them).
	if op, ok := dangerous.Lookup("io_uring_setup"); ok && op.NR32 != dangerous.None {
		set(sbrSyscall32|uint32(op.NR32), r.IOUring)
	}
	return t, nil
}

func categoriesOf(r backstoprules.SandboxRules) map[uint32]backstoprules.Rule {
	return map[uint32]backstoprules.Rule{
		catCgroupWrite: r.CgroupWrite, catProcMem: r.ProcMem, catCloneFiles: r.CloneFiles,
		catIOUring: r.IOUring, catIOUringOpen: r.IOUringOpen, catSignalAgent: r.SignalAgent,
		catCgroupEscape: r.CgroupEscape, catCompat: r.Compat, catExecFileless: r.ExecFileless, catMmapExec: r.MmapExec,
		catPacketSocket: r.PacketSocket, catUnixPeer: r.UnixPeer, catLowMapping: r.LowMapping,
		catOtherTask: r.OtherTask, catTTYInject: r.TTYInject, catNetConfig: r.NetConfig,
		catClockAdjust: r.ClockAdjust, catNamespaces: r.Namespaces, catSyslog: r.Syslog, catQuota: r.Quota,
		catOtherIPC: r.OtherIPC, catNotifyMark: r.NotifyMark,
	}
}

// setSyscalls writes the syscall and category rules: each sandbox's own
// actions into bs_sb_rules, and the host-wide arrays that only say
// whether any sandbox has a rule (the strictest action, the category of
// an argument-checked syscall) so the programs return at once for
// syscalls and categories no sandbox cares about. Order, so a reload
// opens no gap: the per-sandbox entries first, then the arrays (a gate
// never opens onto a missing entry), stale per-sandbox entries last.
func (b *Backstop) setSyscalls(r backstoprules.Rules) error {
	every, err := sandboxTableOf(r.SandboxRules)
	if err != nil {
		return err
	}
	want := map[backstopSbRuleKey]backstopCategoryRule{}
	for what, rule := range every {
		want[backstopSbRuleKey{What: what}] = backstopCategoryRule{Action: rule.Action, RuleId: rule.ID}
	}
	gate := maps.Clone(every) // strictest action per key, over every set
	for sid, sr := range r.Sandboxes {
		if sid == 0 {
			return errors.New("backstop rules: sandbox id 0 in Sandboxes (the every-sandbox set is Rules' own)")
		}
		t, err := sandboxTableOf(sr)
		if err != nil {
			return fmt.Errorf("sandbox %d: %w", sid, err)
		}
		for what, rule := range t {
			want[backstopSbRuleKey{SandboxId: sid, What: what}] = backstopCategoryRule{Action: rule.Action, RuleId: rule.ID}
			if rule.Action > gate[what].Action {
				gate[what] = rule
			}
		}
		// An allow entry, so the every-sandbox rule does not apply.
		for what := range every {
			if _, own := t[what]; !own {
				want[backstopSbRuleKey{SandboxId: sid, What: what}] = backstopCategoryRule{}
			}
		}
	}
	m := b.maps("bs_sb_rules")
	if n := uint32(len(want)); n > m.MaxEntries() {
		return fmt.Errorf("backstop rules: %d per-sandbox syscall and category entries, the map holds %d", n, m.MaxEntries())
	}
	if err := enforce.PutAll(m, want); err != nil {
		return fmt.Errorf("set backstop sandbox rules: %w", err)
	}

	table := make([]backstopSyscallRule, maxSyscalls)
	table32 := make([]backstopSyscallRule, maxSyscalls)
	catTable := make([]backstopCategoryRule, catMax)
	for what, rule := range gate {
		if what&sbrCap != 0 {
			continue // per sandbox only, behind the capability-used category
		}
		n := what &^ (sbrSyscall32 | sbrCategory)
		// The strictest rule's id too: what an agent from before the
		// per-sandbox rules decided by (see adoptHostWide).
		v := backstopSyscallRule{Action: rule.Action, RuleId: rule.ID}
		switch what &^ n {
		case sbrSyscall:
			table[n] = v
		case sbrSyscall32:
			table32[n] = v
		case sbrCategory:
			catTable[n] = backstopCategoryRule{Action: rule.Action, RuleId: rule.ID}
		}
	}
	for name, cats := range categorySyscalls {
		for _, cat := range cats {
			if catTable[cat].Action != enforce.ActionAllow {
				table[Syscalls[name]].Category = cats[0]
			}
		}
	}
	// Categories first: a syscall entry pointing at a category must find
	// the category's gate already open.
	keys := make([]uint32, catMax)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := b.maps("bs_categories").BatchUpdate(keys, catTable, nil); err != nil {
		return fmt.Errorf("set backstop categories: %w", err)
	}
	skeys := make([]uint32, maxSyscalls)
	for i := range skeys {
		skeys[i] = uint32(i)
	}
	if _, err := b.maps("bs_syscall_rules").BatchUpdate(skeys, table, nil); err != nil {
		return fmt.Errorf("set backstop syscall rules: %w", err)
	}
	if _, err := b.maps("bs_syscall_rules32").BatchUpdate(skeys, table32, nil); err != nil {
		return fmt.Errorf("set backstop i386 syscall rules: %w", err)
	}
	if err := enforce.PruneMap(m, func(k backstopSbRuleKey) bool { _, ok := want[k]; return ok }); err != nil {
		return fmt.Errorf("prune backstop sandbox rules: %w", err)
	}
	return nil
}

const maxSyscalls = 512

func checkAction(a uint32) error {
	if a > enforce.ActionKill {
		return fmt.Errorf("invalid action %d", a)
	}
	return nil
}

// ruleOpsLimit is the longest path a rule can hold (LPM data is 256 bytes,
// 4 of them the sandbox id).
const rulePathLen = 252

func pathKey(p backstoprules.PathRule) (backstopPathKey, error) {
	if len(p.Path) == 0 || p.Path[0] != '/' {
		return backstopPathKey{}, fmt.Errorf("backstop path rule %q: not absolute", p.Path)
	}
	n := len(p.Path)
	if !p.Prefix {
		n++ // the NUL makes the match exact
	}
	if n > rulePathLen {
		return backstopPathKey{}, fmt.Errorf("backstop path rule %q: longer than %d bytes", p.Path, rulePathLen-1)
	}
	k := backstopPathKey{Prefixlen: uint32(4+n) * 8, SandboxId: p.SandboxID}
	for i := 0; i < len(p.Path); i++ {
		k.Path[i] = int8(p.Path[i])
	}
	return k, nil
}

func (b *Backstop) setPaths(rules []backstoprules.PathRule) error {
	wantPaths := map[backstopPathKey]backstopPathRule{}
	wantInodes := map[backstopInodeKey]backstopPathRule{}
	for _, p := range rules {
		if err := checkAction(p.Action); err != nil {
			return fmt.Errorf("backstop path rule %q: %w", p.Path, err)
		}
		if p.Ops == 0 || p.Ops&^(backstoprules.OpRead|backstoprules.OpWrite|backstoprules.OpExec) != 0 {
			return fmt.Errorf("backstop path rule %q: invalid ops %#x", p.Path, p.Ops)
		}
		k, err := pathKey(p)
		if err != nil {
			return err
		}
		v := backstopPathRule{Action: p.Action, RuleId: p.ID, Ops: uint32(p.Ops)}
		wantPaths[k] = v
		if p.Prefix {
			continue
		}
		id, err := enforce.IdentifyFile(p.Path, true)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // nothing to hard-link to (yet)
			}
			return fmt.Errorf("backstop path rule %q: %w", p.Path, err)
		}
		if id.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			continue
		}
		// The entry names this file (its generation), not whatever file
		// gets the number once it is deleted.
		v.Generation = id.Generation
		wantInodes[backstopInodeKey{Ino: id.Ino, Dev: devOf(id.Dev), SandboxId: p.SandboxID}] = v
	}
	if err := treeInodes(rules, wantInodes); err != nil {
		return err
	}
	if err := enforce.SyncMap(b.maps("bs_path_rules"), wantPaths); err != nil {
		return fmt.Errorf("backstop path rules: %w", err)
	}
	if err := enforce.SyncMap(b.maps("bs_inode_rules"), wantInodes); err != nil {
		return fmt.Errorf("backstop inode rules: %w", err)
	}
	return nil
}

// treeInodes gives the files below prefix rules that judge reads inode
// entries too (enforce.TreeInodes), each with the rule its own path gets
// (the longest rule of its sandbox), as the files are now; exact rules'
// entries win.
func treeInodes(rules []backstoprules.PathRule, want map[backstopInodeKey]backstopPathRule) error {
	budget := enforce.MaxTreeInodes
	for _, p := range rules {
		if !p.Prefix || p.Ops&backstoprules.OpRead == 0 || p.Action == 0 || p.Path == "/" {
			continue
		}
		_, err := enforce.TreeInodes(strings.TrimSuffix(p.Path, "/"), &budget, func(path string, id *enforce.FileID) {
			dir := id.Mode&unix.S_IFMT == unix.S_IFDIR
			if dir && id.Magic == enforce.OverlayfsMagic {
				// Its number may be a file's there too (enforce.OverlayfsMagic);
				// an entry holds no type to tell them apart. Its path rule
				// still judges it.
				return
			}
			r := longestRule(rules, p.SandboxID, path, dir)
			ik := backstopInodeKey{Ino: id.Ino, Dev: devOf(id.Dev), SandboxId: p.SandboxID}
			if _, exact := want[ik]; r == nil || r.Action == 0 || exact {
				return
			}
			want[ik] = backstopPathRule{Action: r.Action, RuleId: r.ID, Ops: uint32(r.Ops), Generation: id.Generation}
		})
		if err != nil {
			return fmt.Errorf("backstop inodes below %q: %w", p.Path, err)
		}
	}
	return nil
}

// longestRule is the rule of sandbox sid the kernel's longest prefix
// match picks for path (a directory also as path + "/").
func longestRule(rules []backstoprules.PathRule, sid uint32, path string, dir bool) *backstoprules.PathRule {
	var best *backstoprules.PathRule
	bestLen := -1
	for i := range rules {
		r := &rules[i]
		if r.SandboxID != sid {
			continue
		}
		if !r.Prefix {
			if r.Path == path {
				return r
			}
			continue
		}
		if len(r.Path) > bestLen && (strings.HasPrefix(path, r.Path) || (dir && strings.HasPrefix(path+"/", r.Path))) {
			best, bestLen = r, len(r.Path)
		}
	}
	return best
}

// SyscallNames lists the known syscall names, sorted.
func SyscallNames() []string {
	out := make([]string, 0, len(Syscalls))
	for n := range Syscalls {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// mountedSB is the sandbox id of the bs_dirs entries naming the
// filesystems the rules were resolved on (DIR_MOUNTED_SB).
const mountedSB = 0xffffffff

// mountedDevs lists the devices of the filesystems mounted in this
// process's mount namespace, where Dirs' paths were resolved.
func mountedDevs() ([]uint32, error) {
	mounts, err := cgroupfs.ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("backstop dir rules: %w", err)
	}
	seen := map[uint32]bool{}
	var out []uint32
	for _, m := range mounts {
		d := m.Major<<20 | m.Minor
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}
