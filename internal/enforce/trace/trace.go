// Package trace records what sandboxed processes do with tracepoints (which
// load on every kernel watcher supports, BPF LSM or not): exec and exit
// events with the parent chain, attempts to load kernel code, and an
// optional sampled stream of all syscalls with exact per-sandbox totals.
package trace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
)

// Group is the name of this hook group (link pin directory).
const Group = "trace"

// Mechanism is the audit mechanism of the events.
const Mechanism = "tracepoint"

// Program names, as in bpf/trace.c.
const (
	ProgSysEnter = "trace_sys_enter"
	ProgExec     = "trace_exec"
	ProgExit     = "trace_exit"
)

// Config selects what is recorded.
type Config struct {
	// SampleEvery turns on the syscall stream: 1 in SampleEvery syscalls of
	// each sandbox (per CPU) is sent as an event; totals are counted exactly
	// (Counts). 0 disables it, 1 sends every syscall.
	SampleEvery uint32
	// ModuleAlerts records init_module, finit_module, kexec_load and
	// kexec_file_load attempts as alerts.
	ModuleAlerts bool
	// ModuleRuleID is the policy rule id reported with module alerts.
	ModuleRuleID uint32
}

// Tracer holds the loaded recording programs.
type Tracer struct {
	pinDir string
	objs   traceObjects
	links  []link.Link
}

// Load loads the programs with the engine's shared maps.
func Load(eng *enforce.Engine) (*Tracer, error) {
	t := &Tracer{pinDir: eng.PinDir()}
	if err := loadTraceObjects(&t.objs, eng.CollectionOptions()); err != nil {
		return nil, fmt.Errorf("load trace programs: %w", err)
	}
	return t, nil
}

// Probe reports whether each program loads here (nil) or why not.
func Probe(eng *enforce.Engine) map[string]error {
	out := map[string]error{}
	spec, err := loadTrace()
	if err != nil {
		return map[string]error{ProgSysEnter: err, ProgExec: err, ProgExit: err}
	}
	for name := range spec.Programs {
		one := spec.Copy()
		for other := range one.Programs {
			if other != name {
				delete(one.Programs, other)
			}
		}
		coll, err := ebpf.NewCollectionWithOptions(one, *eng.CollectionOptions())
		if err == nil {
			coll.Close()
		}
		out[name] = err
	}
	return out
}

// SetConfig sets what is recorded (pinned: it survives agent restarts).
func (t *Tracer) SetConfig(c Config) error {
	v := traceTraceConfig{SampleEvery: c.SampleEvery, ModuleRuleId: c.ModuleRuleID}
	if c.ModuleAlerts {
		v.ModuleAlerts = 1
	}
	if err := t.objs.TrConfig.Put(uint32(0), v); err != nil {
		return fmt.Errorf("set trace config: %w", err)
	}
	return nil
}

// AttachOptions choose the programs to attach.
type AttachOptions struct {
	// Syscalls attaches sys_enter (module alerts, the syscall stream).
	// Any syscall tracepoint puts every task of the host on the kernel's
	// syscall slow path (see bench/syscall), so it is optional.
	Syscalls bool
}

// Attach attaches and pins the programs under enforce.LinkPinDir(pinDir,
// "trace"); links pinned by a previous agent are replaced after the new
// ones are attached (overlap, no gap).
func (t *Tracer) Attach(opts AttachOptions) error {
	dir := enforce.LinkPinDir(t.pinDir, Group)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("trace link dir: %w", err)
	}
	progs := map[string]*ebpf.Program{ProgExec: t.objs.TraceExec, ProgExit: t.objs.TraceExit}
	if opts.Syscalls {
		progs[ProgSysEnter] = t.objs.TraceSysEnter
	} else if err := os.Remove(filepath.Join(dir, ProgSysEnter)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detach %s: %w", ProgSysEnter, err)
	}
	for name, prog := range progs {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			return fmt.Errorf("attach %s: %w", name, err)
		}
		if err := replacePin(l, filepath.Join(dir, name)); err != nil {
			l.Close()
			return fmt.Errorf("pin %s: %w", name, err)
		}
		t.links = append(t.links, l)
	}
	return nil
}

func replacePin(l link.Link, path string) error {
	old, err := link.LoadPinnedLink(path, nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		if rmErr := os.Remove(path); rmErr != nil {
			return fmt.Errorf("replace %s: %w", path, err)
		}
		old = nil
	}
	if old != nil {
		defer old.Close()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin old link: %w", err)
		}
	}
	return l.Pin(path)
}

// Detach removes this group's pinned links.
func Detach(pinDir string) error {
	if err := os.RemoveAll(enforce.LinkPinDir(pinDir, Group)); err != nil {
		return fmt.Errorf("detach trace: %w", err)
	}
	return nil
}

// Close releases descriptors; pinned links keep recording.
func (t *Tracer) Close() error {
	for _, l := range t.links {
		l.Close()
	}
	t.links = nil
	return t.objs.Close()
}

// CountKey identifies a syscall total.
type CountKey struct {
	SandboxCgroup uint64
	Nr            uint32
}

// Counts returns the exact number of syscalls per sandbox and syscall seen
// while the stream was on, summed over CPUs.
func (t *Tracer) Counts() (map[CountKey]uint64, error) {
	out := map[CountKey]uint64{}
	var k traceCountKey
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
	ExecEvent    = traceExecEvent
	ExitEvent    = traceExitEvent
	SyscallEvent = traceSyscallEvent
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

func decodeSyscall(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[SyscallEvent](raw)
	if err != nil {
		return err
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
func (t *Tracer) AttachLinks() ([]link.Link, error) {
	var out []link.Link
	for _, p := range []*ebpf.Program{t.objs.TraceSysEnter, t.objs.TraceExec, t.objs.TraceExit} {
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
