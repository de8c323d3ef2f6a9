package backstop

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// Kernel event kinds of this group (enum event_kind_backstop in common.h).
const (
	EvKillFile    uint32 = 32
	EvKillSyscall uint32 = 33
	EvKillCgroup  uint32 = 34
)

// RetUnknown is the return value of an event whose syscall never returned
// (RET_UNKNOWN in bpf/backstop.c).
const RetUnknown = -(int64(1) << 62)

// FileEvent, SyscallEvent and CgroupEvent are the kernel's event structs.
type (
	FileEvent    = backstopFileEvent
	SyscallEvent = backstopSyscallEvent
	CgroupEvent  = backstopCgroupEvent
)

// MountKill describes a mount-family syscall of a killed (or recorded)
// process, for the agent to undo (see UndoMount).
type MountKill struct {
	Op     string // mount, move_mount, ...
	PID    uint32 // thread id of the caller
	TGID   uint32
	MntNS  uint64 // mount namespace inode of the caller
	Target string // absolute mount point as seen in that namespace
	Ret    int64  // syscall return value (RetUnknown if not seen)
	Killed bool
	// SandboxCgroup and CgroupID identify where the caller ran.
	SandboxCgroup, CgroupID uint64
}

// Handlers are the agent's handlers of backstop events. They run on the
// reader's goroutine: they must not block (hand the work to another goroutine).
type Handlers struct {
	// OnMount is called for every mount-family event.
	OnMount func(MountKill)
}

// Register registers the backstop's decoders with r.
func Register(r *enforce.Reader) { RegisterWithHandlers(r, Handlers{}) }

// RegisterWithHandlers registers the decoders and the agent's handlers.
func RegisterWithHandlers(r *enforce.Reader, h Handlers) {
	r.Register(EvKillFile, audit.KindFileOpen, backstoprules.Mechanism, decodeFile)
	r.Register(EvKillSyscall, audit.KindSyscall, backstoprules.Mechanism, func(raw []byte, ev *audit.Event) error {
		return decodeSyscall(raw, ev, h)
	})
	r.Register(EvKillCgroup, audit.KindEscape, backstoprules.Mechanism, decodeCgroup)
}

// Messages are built with these appends, not fmt: decoders run once per
// kernel event on the reader's goroutine. Each adds one space-separated note.

func note(b []byte, parts ...string) []byte {
	if len(b) > 0 {
		b = append(b, ' ')
	}
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func noteInt(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(note(b, key), v, 10)
}

// noteUint adds key and v in base 10, or 16 with a 0x prefix (like %#x).
func noteUint(b []byte, key string, v uint64, base int) []byte {
	b = note(b, key)
	if base == 16 {
		b = append(b, "0x"...)
	}
	return strconv.AppendUint(b, v, base)
}

// cText converts a NUL-terminated C char array.
func cText(b []int8) string {
	u := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
	if i := bytes.IndexByte(u, 0); i >= 0 {
		u = u[:i]
	}
	return string(u)
}

func decodeFile(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[FileEvent](raw)
	if err != nil {
		return err
	}
	if e.Category == catUnixPeer {
		// A unix connect judged on the peer the kernel found: a network
		// event, as the LSM unix hooks report it.
		ev.Kind = audit.KindNet
		ev.Net = &audit.NetDetail{Family: unix.AF_UNIX, Op: "connect", Addr: cText(e.Path[:]),
			Reason: "unix peer outside the sandbox's socket paths (resolved)"}
		if e.PathFlags&1 != 0 {
			ev.Net.Reason += "; path truncated"
		}
		ev.Message = ev.Net.Reason
		return nil
	}
	ev.File = &audit.FileDetail{
		Path:  cText(e.Path[:]),
		Flags: e.F_flags,
		Mode:  e.I_mode,
		Dev:   e.Dev,
		Write: e.F_mode&2 != 0,
	}
	var buf [128]byte
	n := buf[:0]
	if c := categoryNames[e.Category]; c != "" {
		n = note(n, "category=", c)
	}
	if e.Nr == 59 {
		n = note(n, "op=exec")
	} else if name := openNames[e.Nr]; name != "" {
		n = note(n, "op=", name)
	}
	if e.TargetPid != 0 {
		ev.Target = &audit.TargetDetail{PID: e.TargetPid}
		n = noteUint(n, "target_pid=", uint64(e.TargetPid), 10)
	}
	if e.PathFlags&1 != 0 {
		n = note(n, "path_truncated")
	}
	if e.PathFlags&2 != 0 {
		n = note(n, "path_outside_root")
	}
	if e.PathFlags&4 != 0 {
		n = note(n, "path_disconnected")
	}
	n = noteUint(n, "ino=", e.Ino, 10)
	ev.Message = string(n)
	if e.Category == catNotifyMark {
		ev.Message = "notify_mark: an inotify mark outside the sandbox's writable places; " + ev.Message
	}
	if e.Category == catTTYInject {
		// The terminals rule: named as the LSM's event names it.
		ev.Message = "tty_inject: open of a terminal controlled by a session outside the sandbox; " + ev.Message
	}
	return nil
}

var openNames = map[int64]string{2: "open", 85: "creat", 257: "openat", 304: "open_by_handle_at", 437: "openat2"}

var mountOps = map[int64]string{
	165: "mount", 166: "umount", 429: "move_mount", 155: "pivot_root", 161: "chroot",
	430: "fsopen", 431: "fsconfig", 432: "fsmount", 433: "fspick", 428: "open_tree", 442: "mount_setattr",
}

var syscallKinds = map[int64]audit.Kind{
	101: audit.KindPtrace, 310: audit.KindPtrace, 311: audit.KindPtrace, 438: audit.KindPtrace,
	175: audit.KindModule, 176: audit.KindModule, 313: audit.KindModule, 246: audit.KindModule,
	320: audit.KindModule, 321: audit.KindBPF,
	62: audit.KindSignal, 200: audit.KindSignal, 234: audit.KindSignal, 129: audit.KindSignal,
	297: audit.KindSignal, 424: audit.KindSignal,
}

// syscallCompact is the length of a syscall event sent without its strings
// (SYSCALL_EVENT_COMPACT in bpf/backstop.c).
const syscallCompact = int(unsafe.Offsetof(SyscallEvent{}.Str))

// syscallNames is Syscalls by number, for SyscallName without a map walk.
var syscallNames = sync.OnceValue(func() map[int64]string {
	m := make(map[int64]string, len(Syscalls))
	for name, nr := range Syscalls {
		m[int64(nr)] = name
	}
	return m
})

func decodeSyscall(raw []byte, ev *audit.Event, h Handlers) error {
	var whole SyscallEvent
	e, err := enforce.CastPrefix(raw, &whole, syscallCompact)
	if err != nil {
		return err
	}
	var str, aux, fstype string
	if len(raw) > syscallCompact {
		str, aux, fstype = cText(e.Str[:]), cText(e.Aux[:]), cText(e.Fstype[:])
	}
	ev.Syscall = &audit.SyscallDetail{Nr: e.Nr, Name: syscallNames()[e.Nr], Ret: e.Ret}
	if e.Nr >= compatNRBase {
		ev.Syscall.Name = i386Name(e.Nr - compatNRBase)
	}
	if e.Ret == RetUnknown {
		ev.Syscall.Ret = 0
	}
	var buf [96]byte
	notes := buf[:0]
	if c := categoryNames[e.Category]; c != "" {
		notes = note(notes, "category=", c)
	}
	if e.Ret == RetUnknown {
		notes = note(notes, "ret=unknown")
	} else {
		notes = noteInt(notes, "ret=", e.Ret)
	}
	switch {
	case e.Category == catLowMapping:
		// As the LSM's mmap_addr hook reports it: a use of CAP_SYS_RAWIO.
		ev.Kind = audit.KindCapability
		ev.Target = &audit.TargetDetail{Capability: unix.CAP_SYS_RAWIO}
		notes = lowMappingNote(notes, e)
	case e.Category == catIOUringOpen:
		ev.Kind = audit.KindFileOpen
		notes = noteUint(notes, "io_uring_opcode=", e.Args[0], 10)
	case mountOps[e.Nr] != "":
		ev.Kind = audit.KindMount
		op := mountOps[e.Nr]
		target := str
		if target != "" && !strings.HasPrefix(target, "/") && aux != "" {
			target = strings.TrimSuffix(aux, "/") + "/" + target
		}
		ev.Mount = &audit.MountDetail{Op: op, Target: target, FSType: fstype}
		if e.Nr == 165 {
			ev.Mount.Source = aux
			ev.Mount.Flags = e.Args[3]
		} else if e.Nr == 166 {
			ev.Mount.Flags = e.Args[1]
		} else if e.Nr == 429 {
			ev.Mount.Source = aux
			ev.Mount.Flags = e.Args[4]
		}
		if h.OnMount != nil {
			h.OnMount(MountKill{
				Op: op, PID: e.Hdr.Pid, TGID: e.Hdr.Tgid, MntNS: e.MntNs, Target: target, Ret: e.Ret,
				Killed: e.Hdr.Verdict == 3, SandboxCgroup: e.Hdr.SandboxCg, CgroupID: e.Hdr.CgroupId,
			})
		}
	default:
		if k, ok := syscallKinds[e.Nr]; ok {
			ev.Kind = k
		}
		if e.TargetPid != 0 {
			ev.Target = &audit.TargetDetail{PID: e.TargetPid}
			if ev.Kind == audit.KindSignal {
				ev.Target.Mode = uint32(signalArg(e))
			}
		}
		if str != "" {
			notes = note(notes, "path=", str)
		}
		if aux != "" {
			notes = note(notes, "params=", aux)
		}
		if e.Nr == 321 {
			notes = noteUint(notes, "bpf_cmd=", e.Args[0], 10)
		}
		if e.Category == catCloneFiles {
			notes = noteUint(notes, "clone_flags=", e.Args[0], 16)
		}
	}
	ev.Message = string(notes)
	return nil
}

// signalArg returns the signal number argument of a kill-family syscall.
func signalArg(e *SyscallEvent) uint64 {
	switch e.Nr {
	case 62, 200, 129: // kill(pid, sig), tkill(tid, sig), rt_sigqueueinfo(tgid, sig, info)
		return e.Args[1]
	case 234, 297, 424: // tgkill(tgid, tid, sig), rt_tgsigqueueinfo(...), pidfd_send_signal(fd, sig, ...)
		if e.Nr == 424 {
			return e.Args[1]
		}
		return e.Args[2]
	}
	return 0
}

func decodeCgroup(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[CgroupEvent](raw)
	if err != nil {
		return err
	}
	ev.Target = &audit.TargetDetail{PID: e.MovedPid, Comm: enforce.CString(e.MovedComm[:])}
	ev.Message = fmt.Sprintf("task %d moved out of sandbox cgroup %d to cgroup %d (%s) by pid %d",
		e.MovedPid, e.FromSandbox, e.DstCgroup, cstr(e.DstPath[:]), e.MoverPid)
	ev.Severity = audit.SeverityAlert
	return nil
}

// i386Mappings names the i386 calls the low-mapping probe judges.
var i386Mappings = map[int64]string{90: "old_mmap", 117: "ipc", 163: "mremap", 192: "mmap2", 397: "shmat"}

// i386Name names an i386 syscall number ("i386:NR" when not in the list).
func i386Name(nr int64) string {
	if n, ok := i386Mappings[nr]; ok {
		return "i386:" + n
	}
	for _, o := range dangerous.Ops {
		if int64(o.NR32) == nr {
			return "i386:" + o.Name
		}
	}
	return fmt.Sprintf("i386:%d", nr)
}
