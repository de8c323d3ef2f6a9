// Package recorder records what sandboxed processes do with tracepoints (which
// load on every kernel watcher supports, BPF LSM or not): exec and exit
// events with the parent chain, attempts to load kernel code, an optional
// sampled stream of all syscalls with exact per-sandbox totals, and the
// refusals of the seccomp filter and Landlock ruleset that `watcher exec`
// applies (which act before any LSM hook or sys_enter program sees the
// operation, so nothing else records them): with fexit programs where
// they load (denialprogs.go), else with sys_enter and sys_exit.
package recorder

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/tracerules"
)

// Group is the name of this hook group (link pin directory).
const Group = "trace"

// Mechanism is the audit mechanism of the events.
const Mechanism = "tracepoint"

// Mechanisms of the recorded refusals.
const (
	MechanismSeccomp  = tracerules.MechanismSeccomp
	MechanismLandlock = tracerules.MechanismLandlock
)

// Program names, as in bpf/recorder.c.
const (
	ProgSysEnter = "trace_sys_enter"
	ProgSysExit  = "trace_sys_exit"
	ProgExec     = "trace_exec"
	ProgExit     = "trace_exit"
)

// Config selects what is recorded: tracerules.Config.
type Config = tracerules.Config

// DefaultSeccompSyscalls are the syscalls the launcher's seccomp filter
// refuses (always, or for some arguments): internal/launch's list.
var DefaultSeccompSyscalls = []string{
	"ptrace",
	"mount", "umount2", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree",
	"open_tree_attr", "mount_setattr", "pivot_root", "chroot",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"keyctl", "add_key", "request_key",
	"open_by_handle_at", "name_to_handle_at",
	"process_vm_readv", "process_vm_writev", "pidfd_getfd",
	"unshare", "setns", "clone",
	"reboot", "socket",
}

// OpenSyscalls are the syscalls whose EACCES/EPERM is recorded with the
// path argument (bpf/recorder.c knows where each keeps its path and flags):
// the open family and exec, and the path operations Landlock also refuses
// (creating, removing, linking and renaming entries, truncate), recorded
// as writes of the path that needed the right.
var OpenSyscalls = []string{"open", "openat", "openat2", "creat", "execve", "execveat",
	"mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2",
	"link", "linkat", "symlink", "symlinkat", "mknod", "mknodat", "truncate"}

// pathWrites are the OpenSyscalls that change the tree rather than open.
var pathWrites = map[string]bool{"mkdir": true, "mkdirat": true, "rmdir": true, "unlink": true, "unlinkat": true,
	"rename": true, "renameat": true, "renameat2": true, "link": true, "linkat": true, "symlink": true,
	"symlinkat": true, "mknod": true, "mknodat": true, "truncate": true}

// watchSize is WATCH_NRS in bpf/recorder.c.
const watchSize = 512

// watchKeys are the indexes of the watch array, for BatchUpdate.
var watchKeys = func() (k [watchSize]uint32) {
	for i := range k {
		k[i] = uint32(i)
	}
	return k
}()

// denialWatch builds the per-syscall watch array.
func denialWatch(c Config) ([watchSize]uint32, error) {
	var w [watchSize]uint32
	if !c.RecordDenials {
		return w, nil
	}
	names := c.SeccompSyscalls
	if names == nil {
		names = DefaultSeccompSyscalls
	}
	set := func(name string, bit recorderDenialWatch) error {
		nr, ok := arch.X86_64.SyscallNames[name]
		if !ok || nr < 0 || nr >= watchSize {
			return fmt.Errorf("unknown x86_64 syscall %q", name)
		}
		w[nr] |= uint32(bit)
		return nil
	}
	for _, n := range names {
		if err := set(n, recorderDenialWatchDW_SECCOMP); err != nil {
			return w, err
		}
	}
	for _, n := range OpenSyscalls {
		if err := set(n, recorderDenialWatchDW_OPEN); err != nil {
			return w, err
		}
	}
	return w, nil
}

// Recorder holds the loaded recording programs.
type Recorder struct {
	pinDir   string
	objs     objects
	fexit    *fexitPrograms // nil where fexit does not load (fexitErr says why)
	fexitErr error
	mu       sync.Mutex
	links    *enforce.PinnedLinks // attached here, by program
}

// Load loads the programs with the engine's shared maps: the tracepoint
// programs, and the fexit programs that record refusals where they load.
func Load(eng *enforce.Engine) (*Recorder, error) {
	t := &Recorder{pinDir: eng.PinDir(), links: enforce.NewPinnedLinks(eng.PinDir(), Group)}
	spec, err := loadRecorder()
	if err != nil {
		return nil, fmt.Errorf("load trace programs: %w", err)
	}
	if err := spec.LoadAndAssign(&t.objs, eng.CollectionOptions()); err != nil {
		return nil, fmt.Errorf("load trace programs: %w", err)
	}
	t.fexit, t.fexitErr = loadFexit(spec, eng.CollectionOptions())
	return t, nil
}

// Probe reports whether each program loads here (nil) or why not. The
// fexit programs (FexitPrograms) are optional: sys_enter and sys_exit
// stand in where they do not load.
func Probe(eng *enforce.Engine) map[string]error {
	out := map[string]error{}
	spec, err := loadRecorder()
	if err != nil {
		return map[string]error{ProgSysEnter: err, ProgSysExit: err, ProgExec: err, ProgExit: err}
	}
	for name, err := range enforce.ProbeEach(spec, *eng.CollectionOptions()) {
		out[name] = err
	}
	return out
}

// SetConfig sets what is recorded (pinned: it survives agent restarts).
func (t *Recorder) SetConfig(c Config) error {
	watch, err := denialWatch(c)
	if err != nil {
		return fmt.Errorf("set trace config: denial watch: %w", err)
	}
	v := recorderTraceConfig{SampleEvery: c.SampleEvery, ModuleRuleId: c.ModuleRuleID}
	if c.ModuleAlerts {
		v.ModuleAlerts = 1
	}
	if c.RecordDenials {
		v.RecordDenials = 1
	}
	putWatch := func() error {
		// One system call for the array (the agent writes it every
		// second), entry by entry where batches are not supported.
		if _, err := t.objs.TrDenialWatch.BatchUpdate(watchKeys[:], watch[:], nil); err == nil {
			return nil
		} else if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("set trace config: denial watch: %w", err)
		}
		for nr, bits := range watch {
			if err := t.objs.TrDenialWatch.Put(uint32(nr), bits); err != nil {
				return fmt.Errorf("set trace config: denial watch: %w", err)
			}
		}
		return nil
	}
	// sys_enter marks watched syscalls only while record_denials is set:
	// fill the watch array before turning marks on, clear it after
	// turning them off, so sys_exit never sees a watched syscall whose
	// entry was not marked.
	if c.RecordDenials {
		if err := putWatch(); err != nil {
			return err
		}
	}
	if err := t.objs.TrConfig.Put(uint32(0), v); err != nil {
		return fmt.Errorf("set trace config: %w", err)
	}
	if !c.RecordDenials {
		return putWatch()
	}
	return nil
}

// AttachOptions choose the programs to attach. sched_process_exec and
// sched_process_exit are always attached; sys_enter when Syscalls is set;
// the refusal programs (DenialPrograms) when Denials is set.
type AttachOptions struct {
	// Syscalls attaches sys_enter (module alerts, the syscall stream).
	// Any syscall tracepoint puts every task of the host on the kernel's
	// syscall slow path (see bench/syscall), so it is optional.
	Syscalls bool
	// Denials attaches the programs that record seccomp and Landlock
	// refusals (Config.RecordDenials): the fexit programs where they
	// load; elsewhere sys_exit, where the refusals are seen, and sys_enter,
	// whose marks tell a seccomp refusal (the syscall never entered) from
	// an EPERM the kernel returned itself.
	Denials bool
}

// Attach attaches and pins the programs under enforce.LinkPinDir(pinDir,
// "trace"); links pinned by a previous agent are replaced after the new
// ones are attached (overlap, no gap). The syscall tracepoints opts does
// not ask for are detached, a predecessor's pins included.
func (t *Recorder) Attach(opts AttachOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.links.Attach(ProgExec, t.objs.TraceExec); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := t.links.Attach(ProgExit, t.objs.TraceExit); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return t.setSyscallsLocked(opts)
}

// SetSyscalls attaches or detaches sys_enter and sys_exit to match opts
// (sched_process_exec/exit stay), so the host pays for syscall tracepoints
// only while something records through them: the syscall stream, or the
// refusals of a running `watcher exec` command. Turning denials on: call
// SetConfig with RecordDenials after it; off: before it.
func (t *Recorder) SetSyscalls(opts AttachOptions) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setSyscallsLocked(opts)
}

func (t *Recorder) setSyscallsLocked(opts AttachOptions) error {
	progs := map[string]*ebpf.Program{ProgSysEnter: t.objs.TraceSysEnter, ProgSysExit: t.objs.TraceSysExit}
	want := map[string]bool{ProgSysEnter: opts.Syscalls}
	// Attach what is wanted before detaching what is not (a predecessor's
	// sys_exit is replaced by fexit programs with an overlap, not a gap),
	// in this order: sys_enter before sys_exit on, sys_exit before
	// sys_enter off: a sys_exit without the marks of sys_enter would take
	// the kernel's own EPERMs for seccomp's.
	order := []string{ProgSysEnter, ProgSysExit}
	if t.fexit != nil {
		for name, p := range t.fexit.byName() {
			progs[name] = p
			want[name] = opts.Denials
		}
		order = append(slices.Clone(FexitPrograms), order...)
	} else {
		want[ProgSysEnter] = opts.Syscalls || opts.Denials
		want[ProgSysExit] = opts.Denials
	}
	for _, name := range order {
		if want[name] {
			if err := t.links.Attach(name, progs[name]); err != nil {
				return fmt.Errorf("trace: %w", err)
			}
		}
	}
	// Pins of programs not wanted go, a predecessor's too.
	for _, name := range slices.Backward(order) {
		if !want[name] {
			if err := t.links.Detach(name); err != nil {
				return fmt.Errorf("trace: %w", err)
			}
		}
	}
	return nil
}

// denialProgram is the program whose link says refusals are recorded.
func (t *Recorder) denialProgram() string {
	if t.fexit != nil {
		return ProgSeccompExit
	}
	return ProgSysExit
}

// DenialsAttached reports whether the refusal programs are attached.
func (t *Recorder) DenialsAttached() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.links.Held(t.denialProgram())
}

// DenialsPinned reports whether a refusal program's link is pinned (by
// this Recorder or a previous agent's, fexit or sys_exit).
func (t *Recorder) DenialsPinned() bool {
	for _, name := range []string{ProgSysExit, ProgSeccompExit} {
		if _, err := os.Stat(filepath.Join(enforce.LinkPinDir(t.pinDir, Group), name)); err == nil {
			return true
		}
	}
	return false
}

// ProgramIDs returns the kernel ids of the programs by name (tests match
// them against enforce.LinkedPrograms), the fexit ones where they loaded.
func (t *Recorder) ProgramIDs() (map[string]ebpf.ProgramID, error) {
	progs := map[string]*ebpf.Program{ProgSysEnter: t.objs.TraceSysEnter, ProgSysExit: t.objs.TraceSysExit,
		ProgExec: t.objs.TraceExec, ProgExit: t.objs.TraceExit}
	if t.fexit != nil {
		maps.Copy(progs, t.fexit.byName())
	}
	return enforce.ProgramIDs(progs)
}

// Detach removes this group's pinned links.
func Detach(pinDir string) error { return enforce.DetachGroup(pinDir, Group, "trace") }

// Close releases descriptors; pinned links keep recording.
func (t *Recorder) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.links.Close()
	t.links = enforce.NewPinnedLinks(t.pinDir, Group)
	if t.fexit != nil {
		t.fexit.Close()
	}
	return t.objs.Close()
}

// CountKey identifies a syscall total.
type CountKey struct {
	SandboxCgroup uint64
	Nr            uint32
}

// Counts returns the exact number of syscalls per sandbox and syscall seen
// while the stream was on, summed over CPUs.
func (t *Recorder) Counts() (map[CountKey]uint64, error) {
	out := map[CountKey]uint64{}
	var k recorderCountKey
	var per []uint64
	it := t.objs.TrSyscallCounts.Iterate()
	for it.Next(&k, &per) {
		var s uint64
		for _, v := range per {
			s += v
		}
		out[CountKey{SandboxCgroup: k.SandboxCg, Nr: k.Nr}] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read syscall counts: %w", err)
	}
	return out, nil
}

// ExecEvent, ExitEvent and SyscallEvent are the kernel's event structs.
type (
	ExecEvent    = recorderExecEvent
	ExitEvent    = recorderExitEvent
	SyscallEvent = recorderSyscallEvent
)

// Register registers the decoders of exec, exit and syscall events.
func Register(r *enforce.Reader) {
	r.Register(enforce.EvExec, audit.KindExec, Mechanism, decodeExec)
	r.Register(enforce.EvExit, audit.KindExit, Mechanism, decodeExit)
	r.Register(enforce.EvSyscall, audit.KindSyscall, Mechanism, decodeSyscall)
}

type ancestor = struct {
	Pid  uint32
	Comm [16]uint8
}

// parentChain formats the ancestors as "pid(comm) < pid(comm) ...",
// nearest first.
func parentChain(anc []ancestor) string {
	var parts []string
	for _, a := range anc {
		if a.Pid == 0 {
			break
		}
		parts = append(parts, fmt.Sprintf("%d(%s)", a.Pid, enforce.CString(a.Comm[:])))
	}
	return strings.Join(parts, " < ")
}

func decodeExec(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[ExecEvent](raw)
	if err != nil {
		return err
	}
	ev.Process.Exe = cstr(e.Exe[:])
	n := min(int(e.ArgsLen), len(e.Args))
	args := make([]byte, n)
	for i := 0; i < n; i++ {
		args[i] = byte(e.Args[i])
	}
	s := strings.TrimRight(string(args), "\x00")
	if s != "" {
		ev.Process.Args = strings.Split(s, "\x00")
	}
	anc := make([]ancestor, len(e.Ancestors))
	for i, a := range e.Ancestors {
		anc[i] = ancestor{Pid: a.Pid, Comm: a.Comm}
	}
	ev.Message = "parents: " + parentChain(anc)
	if int(e.ArgsTotal) > n {
		ev.Message += fmt.Sprintf(" (argv truncated: %d of %d bytes)", n, e.ArgsTotal)
	}
	return nil
}

func decodeExit(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[ExitEvent](raw)
	if err != nil {
		return err
	}
	anc := make([]ancestor, len(e.Ancestors))
	for i, a := range e.Ancestors {
		anc[i] = ancestor{Pid: a.Pid, Comm: a.Comm}
	}
	status := ""
	if sig := e.ExitCode & 0x7f; sig != 0 {
		status = fmt.Sprintf("killed by signal %d", sig)
	} else {
		status = fmt.Sprintf("exit code %d", (e.ExitCode>>8)&0xff)
	}
	ev.Syscall = &audit.SyscallDetail{Nr: 231, Name: "exit_group", Ret: int64(e.ExitCode)}
	ev.Message = status + "; parents: " + parentChain(anc)
	return nil
}

var moduleNames = map[int64]string{175: "init_module", 313: "finit_module", 246: "kexec_load", 320: "kexec_file_load"}

// syscallSampleSize is the length of a sample of the syscall stream, sent
// without its path (SYSCALL_SAMPLE_SIZE in bpf/recorder.c).
const syscallSampleSize = int(unsafe.Offsetof(SyscallEvent{}.Path))

func decodeSyscall(raw []byte, ev *audit.Event) error {
	var whole SyscallEvent
	e, err := enforce.CastPrefix(raw, &whole, syscallSampleSize)
	if err != nil {
		return err
	}
	switch recorderDenial(e.Denial) {
	case recorderDenialDENIAL_SECCOMP:
		decodeSeccompDenial(e, ev)
		return nil
	case recorderDenialDENIAL_OPEN:
		decodeOpenDenial(e, ev)
		return nil
	}
	ev.Syscall = &audit.SyscallDetail{Nr: e.Nr, Name: moduleNames[e.Nr], Count: e.Count}
	if name, ok := moduleNames[e.Nr]; ok && ev.Verdict != audit.VerdictAllowed {
		ev.Kind = audit.KindModule
		ev.Severity = audit.SeverityAlert
		if p := cstr(e.Path[:]); p != "" {
			ev.File = &audit.FileDetail{Path: p}
		}
		ev.Message = name + " attempt"
	}
	return nil
}

func has(flags uint32, f recorderDenyFlag) bool { return flags&uint32(f) != 0 }

// syscallName names nr in the x86_64 table, or in the i386 one.
func syscallName(nr int64, ia32 bool) string {
	table := arch.X86_64
	if ia32 {
		table = arch.I386
	}
	if n, ok := table.SyscallNumbers[int(nr)]; ok {
		return n
	}
	return fmt.Sprintf("syscall_%d", nr)
}

func errnoName(ret int64) string {
	if ret < 0 {
		if n := unix.ErrnoName(unix.Errno(-ret)); n != "" {
			return n
		}
	}
	return fmt.Sprint(ret)
}

func decodeSeccompDenial(e *SyscallEvent, ev *audit.Event) {
	ia32 := has(e.Flags, recorderDenyFlagDENY_F_IA32)
	name := syscallName(e.Nr, ia32)
	ev.Mechanism = MechanismSeccomp
	ev.Kind = audit.KindSyscall
	ev.Syscall = &audit.SyscallDetail{Nr: e.Nr, Name: name, Ret: e.Ret, Count: 1}
	what := name
	switch {
	case ia32:
		what = fmt.Sprintf("i386 syscall %d (%s, through int 0x80)", e.Nr, name)
	case name == "socket":
		what = fmt.Sprintf("socket(family %d, type %#x, protocol %d)", e.Args[0], e.Args[1], e.Args[2])
	case name == "clone" || name == "unshare":
		what = fmt.Sprintf("%s(flags %#x)", name, e.Args[0])
	case name == "setns":
		what = fmt.Sprintf("setns(fd %d, nstype %#x)", int32(e.Args[0]), e.Args[1])
	}
	ev.Message = fmt.Sprintf("%s refused by the seccomp filter (%s)", what, errnoName(e.Ret))
}

func decodeOpenDenial(e *SyscallEvent, ev *audit.Event) {
	name := syscallName(e.Nr, false)
	ev.Kind = audit.KindFileOpen
	ev.Syscall = &audit.SyscallDetail{Nr: e.Nr, Name: name, Ret: e.Ret, Count: 1}
	flags := e.OpenFlags
	write := flags&unix.O_ACCMODE != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0 || pathWrites[name]
	ev.File = &audit.FileDetail{Path: cstr(e.Path[:]), Flags: uint32(flags), Write: write}

	var b strings.Builder
	fmt.Fprintf(&b, "%s refused with %s", name, errnoName(e.Ret))
	if e.Ret == -int64(unix.EACCES) {
		// Landlock answers EACCES; so do file modes, unless the task
		// had CAP_DAC_OVERRIDE.
		ev.Mechanism = MechanismLandlock
		b.WriteString(" under the Landlock ruleset")
		// Seen leaving a security_* function (fexit): the LSMs answered it, not file modes.
		if !has(e.Flags, recorderDenyFlagDENY_F_DAC_OVERRIDE) && !has(e.Flags, recorderDenyFlagDENY_F_LSM_HOOK) {
			b.WriteString(" (the task lacked CAP_DAC_OVERRIDE: file permissions may have refused it instead)")
		}
	} else {
		// Landlock never answers EPERM: another LSM or the kernel did.
		ev.Mechanism = Mechanism
		b.WriteString(" (not Landlock, which answers EACCES)")
	}
	b.WriteString("; path is the string the caller passed, not the resolved file")
	// The directory descriptor of the recorded path, for the *at calls.
	dirArg := map[string]int{"openat": 0, "openat2": 0, "execveat": 0, "mkdirat": 0, "mknodat": 0, "unlinkat": 0,
		"symlinkat": 1, "renameat": 2, "renameat2": 2, "linkat": 2}
	if i, ok := dirArg[name]; ok {
		if dirfd := int32(e.Args[i]); dirfd != unix.AT_FDCWD {
			fmt.Fprintf(&b, " (relative to dirfd %d)", dirfd)
		}
	}
	switch {
	case has(e.Flags, recorderDenyFlagDENY_F_PATH_UNREADABLE):
		b.WriteString("; the path could not be read")
	case has(e.Flags, recorderDenyFlagDENY_F_PATH_TRUNCATED):
		fmt.Fprintf(&b, "; path truncated to %d bytes", len(e.Path)-1)
	}
	ev.Message = b.String()
}

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

// AttachLinks attaches every program without pinning and returns the links
// (benchmarks attach and detach repeatedly).
func (t *Recorder) AttachLinks() ([]link.Link, error) {
	var out []link.Link
	for _, p := range []*ebpf.Program{t.objs.TraceSysEnter, t.objs.TraceSysExit, t.objs.TraceExec, t.objs.TraceExit} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			for _, l := range out {
				l.Close()
			}
			return nil, fmt.Errorf("attach: %w", err)
		}
		out = append(out, l)
	}
	return out, nil
}
