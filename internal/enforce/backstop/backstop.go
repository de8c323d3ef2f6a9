// Package backstop is the kill backstop: where no blocking hook can load
// (BPF LSM refused or absent), tracepoint programs decide and send SIGKILL to
// the sandboxed process performing a dangerous operation.
//
// The operation may already have happened when the process dies (a mount
// stays mounted), so events carry VerdictKilled and the syscall's return
// value, and UndoMount reverts mounts in the sandbox's mount namespace.
//
// Holes closed here, each with a reproducer test:
//   - a partner sharing the file table (clone CLONE_FILES without
//     CLONE_THREAD) could read a descriptor after the opener is killed:
//     such clones are refused in sandboxes (the cloner is killed at
//     sys_enter, and a pending SIGKILL makes clone fail, so the partner is
//     never created);
//   - io_uring fixed-file opens never return a descriptor: io_uring_setup
//     is refused in sandboxes, and when a policy allows io_uring, open
//     requests are killed at submission (io_uring_submit_req);
//   - a root process writing its pid to a parent cgroup's cgroup.procs:
//     write-opens of cgroupfs files are killed, and any move of a sandbox
//     task out of its sandbox (cgroup_attach_task) is an alert;
//   - process_vm_readv/writev, pidfd_getfd and /proc/PID/mem, besides ptrace.
//
// Residual window: a file opened by the killed process exists between the
// open's return in the kernel and the kill's delivery; a thread of the same
// process can use it in that window (a few microseconds), its partners in
// other processes cannot (refused clones, killed pidfd_getfd). Only BPF LSM
// closes that window.
package backstop

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
)

// Group is the name of this hook group (link pin directory, mechanism).
const Group = "backstop"

// Program names, as in bpf/backstop.c.
const (
	ProgSysEnter      = "backstop_sys_enter"
	ProgSysExit       = "backstop_sys_exit"
	ProgPrepareExec   = "backstop_prepare_exec"
	ProgIOUringSubmit = "backstop_io_uring_submit"
	ProgFork          = "backstop_fork"
	ProgCgroupAttach  = "backstop_cgroup_attach"
	ProgCtimeSet      = "backstop_ctime_set"
	ProgCtimeXchg     = "backstop_ctime_xchg"
	ProgCtimeSkip     = "backstop_ctime_skip"
	ProgSignal        = "backstop_signal"
	ProgCapCapable    = "backstop_cap_capable"
)

// optionalPrograms need tracepoints that older kernels lack (6.1 has
// neither sched_prepare_exec nor this io_uring_submit_req signature).
var optionalPrograms = map[string]string{
	ProgPrepareExec:   "sched_prepare_exec",
	ProgIOUringSubmit: "io_uring_submit_req",
	// Inode change tracepoints (Linux >= 6.13, with multigrain timestamps);
	// older kernels leave changes made without a write-open to the LSM.
	ProgCtimeSet:  "inode_set_ctime_to_ts",
	ProgCtimeXchg: "ctime_ns_xchg",
	ProgCtimeSkip: "ctime_xchg_skip",
	// Capabilities used (Linux >= 6.14): CapUse rules, after the fact.
	ProgCapCapable: "cap_capable",
}

// syscallPrograms are the programs on the raw syscall tracepoints. Any
// program there puts every task of the host, sandboxed or not, on the
// kernel's syscall slow path (bench/syscall), so they are attached only
// while the rules need them (Rules.NeedsSyscallTracepoints). sys_enter
// first: sys_exit completes the events sys_enter leaves.
var syscallPrograms = []string{ProgSysEnter, ProgSysExit}

func isSyscallProgram(name string) bool { return name == ProgSysEnter || name == ProgSysExit }

// Backstop holds the loaded programs and their rule maps.
type Backstop struct {
	pinDir  string
	coll    *ebpf.Collection
	missing map[string]error

	mu       sync.Mutex
	links    *enforce.PinnedLinks // attached by this Backstop, by program
	attached bool                 // Attach ran: SetRules keeps the syscall programs in step
	// needSyscalls: the rules last set need sys_enter/sys_exit. Until
	// SetRules runs it is true: the adopted rule maps may need them.
	needSyscalls bool
	// cacheForced: SetVerdictCache turned the verdict cache on.
	cacheForced bool
}

// Load loads the programs (not yet attached) with the engine's shared maps.
// Programs on tracepoints this kernel lacks are left out; Missing says which.
func Load(eng *enforce.Engine) (*Backstop, error) {
	spec, err := loadBackstop()
	if err != nil {
		return nil, fmt.Errorf("load backstop spec: %w", err)
	}
	return loadSpec(eng, spec)
}

// LoadObject is Load from another build of bpf/backstop.c (an ELF file),
// so bench/syscall can measure main's object beside this tree's in one
// run. The object must use the map layouts of this package's.
func LoadObject(eng *enforce.Engine, path string) (*Backstop, error) {
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Errorf("load backstop object %s: %w", path, err)
	}
	return loadSpec(eng, spec)
}

func loadSpec(eng *enforce.Engine, spec *ebpf.CollectionSpec) (*Backstop, error) {
	missing := dropMissingTracepoints(spec)
	coll, err := ebpf.NewCollectionWithOptions(spec, *eng.CollectionOptions())
	if err != nil {
		return nil, fmt.Errorf("load backstop programs: %w", err)
	}
	b := &Backstop{pinDir: eng.PinDir(), coll: coll, missing: missing, links: enforce.NewPinnedLinks(eng.PinDir(), Group), needSyscalls: true}
	if err := b.writeMmapMinAddr(); err != nil {
		coll.Close()
		return nil, err
	}
	if err := b.adoptHostWide(); err != nil {
		coll.Close()
		return nil, err
	}
	return b, nil
}

// adoptHostWide: rule maps pinned by an agent from before the per-sandbox
// rules hold the syscall and category actions in the host-wide arrays
// only (bs_sb_rules is new, so empty). Until SetRules writes this agent's
// rules, those actions apply to every sandbox, as they did then: copied
// into the every-sandbox set (sandbox id 0), so adopting the old pins
// never weakens what is enforced.
func (b *Backstop) adoptHostWide() error {
	m := b.maps("bs_sb_rules")
	var k backstopSbRuleKey
	var v backstopCategoryRule
	if m.Iterate().Next(&k, &v) {
		return nil // this layout's own rules
	}
	want := map[backstopSbRuleKey]backstopCategoryRule{}
	for _, t := range []struct {
		name string
		what uint32
	}{{"bs_syscall_rules", sbrSyscall}, {"bs_syscall_rules32", sbrSyscall32}} {
		var nr uint32
		var r backstopSyscallRule
		it := b.maps(t.name).Iterate()
		for it.Next(&nr, &r) {
			if r.Action != enforce.ActionAllow && r.Category == 0 {
				want[backstopSbRuleKey{What: t.what | nr}] = backstopCategoryRule{Action: r.Action, RuleId: r.RuleId}
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("adopt backstop %s: %w", t.name, err)
		}
	}
	var cat uint32
	var c backstopCategoryRule
	it := b.maps("bs_categories").Iterate()
	for it.Next(&cat, &c) {
		if c.Action != enforce.ActionAllow {
			want[backstopSbRuleKey{What: sbrCategory | cat}] = c
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("adopt backstop categories: %w", err)
	}
	if err := enforce.PutAll(m, want); err != nil {
		return fmt.Errorf("adopt host-wide backstop rules: %w", err)
	}
	return nil
}

// dropMissingTracepoints removes optional programs whose tracepoint is not in
// the kernel's BTF and returns why.
func dropMissingTracepoints(spec *ebpf.CollectionSpec) map[string]error {
	missing := map[string]error{}
	kspec, err := btf.LoadKernelSpec()
	for prog, tp := range optionalPrograms {
		if err != nil {
			missing[prog] = fmt.Errorf("kernel BTF: %w", err)
			delete(spec.Programs, prog)
			continue
		}
		var td *btf.Typedef
		if e := kspec.TypeByName("btf_trace_"+tp, &td); e != nil {
			missing[prog] = fmt.Errorf("tracepoint %s not in this kernel", tp)
			delete(spec.Programs, prog)
		}
	}
	return missing
}

// Missing lists the optional programs this kernel cannot run, with the reason.
func (b *Backstop) Missing() map[string]error { return b.missing }

// Probe loads each program on its own and reports the error (nil: it loads
// here), so the agent can say which mechanism enforces each rule.
func Probe(eng *enforce.Engine) map[string]error {
	spec, err := loadBackstop()
	out := map[string]error{}
	if err != nil {
		for name := range optionalPrograms {
			out[name] = err
		}
		return out
	}
	missing := dropMissingTracepoints(spec)
	for name, e := range missing {
		out[name] = e
	}
	for name, err := range enforce.ProbeEach(spec, *eng.CollectionOptions()) {
		out[name] = err
	}
	return out
}

// Attach attaches the loaded programs and pins their links under
// enforce.LinkPinDir(pinDir, "backstop"): the event tracepoints (fork,
// cgroup moves, exec, inode changes, signals) always, the raw syscall
// tracepoints only when the rules set last need them (all of them when no
// rules were set: the adopted rule maps decide then); from then on SetRules
// attaches and detaches those as the rules change. Links pinned by a
// previous agent are replaced only after the new ones are attached: the two
// overlap, there is no window without enforcement. Set the rules before
// attaching (the rule maps are pinned by name, so an adopted set is already
// in force).
func (b *Backstop) Attach() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(b.coll.Programs)) {
		if isSyscallProgram(name) {
			continue
		}
		if err := b.attachLocked(name); err != nil {
			return err
		}
	}
	b.attached = true
	if err := b.syncSyscallsLocked(); err != nil {
		return err
	}
	return b.advanceRulesGen(b.cacheReadyLocked())
}

func (b *Backstop) attachLocked(name string) error {
	prog, ok := b.coll.Programs[name]
	if !ok {
		return nil // optional, not on this kernel
	}
	if err := b.links.Attach(name, prog); err != nil {
		return fmt.Errorf("backstop: %w", err)
	}
	return nil
}

// syncSyscallsLocked attaches or detaches the raw syscall tracepoints to
// match the rules. Detaching removes the pin too, so a link a previous
// agent pinned goes with it.
func (b *Backstop) syncSyscallsLocked() error {
	if b.needSyscalls {
		for _, name := range syscallPrograms {
			if err := b.attachLocked(name); err != nil {
				return err
			}
		}
		return nil
	}
	for _, name := range slices.Backward(syscallPrograms) {
		if err := b.links.Detach(name); err != nil {
			return fmt.Errorf("backstop: %w", err)
		}
	}
	return nil
}

// SyscallTracepoints reports whether this Backstop holds sys_enter and
// sys_exit attached (enforce.LinkedPrograms asks the kernel).
func (b *Backstop) SyscallTracepoints() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.links.Held(ProgSysEnter)
}

// Detach removes this group's pinned links: the backstop stops.
func Detach(pinDir string) error { return enforce.DetachGroup(pinDir, Group, "backstop") }

// Close releases file descriptors; pinned links keep enforcing.
func (b *Backstop) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.links.Close() // the names stay: Attached still says what was attached
	b.coll.Close()
	return nil
}

// Attached lists the attached program names.
func (b *Backstop) Attached() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.links.Names()
}

// ProgramIDs returns the kernel ids of the loaded programs by name (tests
// match them against enforce.LinkedPrograms).
func (b *Backstop) ProgramIDs() (map[string]ebpf.ProgramID, error) {
	return enforce.ProgramIDs(b.coll.Programs)
}

// Program returns a loaded program by name (benchmarks attach selectively).
func (b *Backstop) Program(name string) *ebpf.Program { return b.coll.Programs[name] }

func (b *Backstop) maps(name string) *ebpf.Map { return b.coll.Maps[name] }

// devOf converts a stat device number to the kernel's internal dev_t.
func devOf(dev uint64) uint32 { return unix.Major(dev)<<20 | unix.Minor(dev) }

func cstr(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
