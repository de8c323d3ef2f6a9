package lsm

import (
	"fmt"
	"unsafe"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// Mechanism names this group's BPF LSM programs in events; fmod_ret
// programs report MechFmodRet.
const Mechanism = lsmrules.MechLSM

// evFmodRet is added to an event kind by the fmod_ret programs
// (EV_FMOD_RET in bpf/include/lsm_hook.h).
const evFmodRet = 64

// evFentry is added by the fentry programs killing at a syscall's entry
// (EV_FENTRY in bpf/include/lsm_hook.h).
const evFentry = 128

// Register sets the reader's decoders for the event kinds this group
// emits (file_open, ptrace, signal, capability, bpf, mount and module),
// under both mechanisms.
func Register(r *enforce.Reader) {
	for _, k := range []struct {
		kind uint32
		ak   audit.Kind
		dec  enforce.Decoder
	}{
		{enforce.EvFileOpen, audit.KindFileOpen, decodeFile},
		{enforce.EvPtrace, audit.KindPtrace, decodeTask},
		{enforce.EvSignal, audit.KindSignal, decodeTask},
		{enforce.EvCapability, audit.KindCapability, decodeTask},
		{enforce.EvBPF, audit.KindBPF, decodeTask},
		{enforce.EvMount, audit.KindMount, decodeMount},
		{enforce.EvModule, audit.KindModule, decodeModule},
		{enforce.EvFileOp, audit.KindFileOp, decodeFile},
		{enforce.EvOperation, audit.KindOperation, decodeTask},
		{enforce.EvLSMSocket, audit.KindSocket, decodeSock},
		{enforce.EvLSMUnix, audit.KindNet, decodeSock},
	} {
		r.Register(k.kind, k.ak, lsmrules.MechLSM, k.dec)
		r.Register(k.kind+evFmodRet, k.ak, lsmrules.MechFmodRet, k.dec)
	}
	r.Register(enforce.EvOperation+evFentry, audit.KindOperation, lsmrules.MechFentry, decodeTask)
}

// cstr converts a NUL-terminated C char array (int8 in Go) to a string.
func cstr(b []int8) string {
	return enforce.CString(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), len(b)))
}

// File match tables (enum file_match).
var matchNames = [...]string{"none", "path", "inode", "filesystem", "device", "proc_mem", "exec", "fileless exec",
	"other_ipc", "notify_mark", "other_tty", "other_process"}

// Own-subtree matches (MATCH_OTHER_IPC, MATCH_NOTIFY in bpf/include/lsm_rules.h); a
// notify event's flags are the mark's object type.
const (
	matchOtherIPC = 8
	matchNotify   = 9
	matchOtherTTY = 10
	matchOtherPID = 11
	fsnotifyObjSB = 2
)

const (
	sIFMT  = 0o170000
	sIFBLK = 0o060000
	sIFCHR = 0o020000
)

func decodeFile(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[lsmFileEvent](raw)
	if err != nil {
		return err
	}
	d := &audit.FileDetail{
		Path:  cstr(e.Path[:]),
		Flags: e.Flags,
		Mode:  e.I_mode,
		Dev:   e.Dev,
		Write: e.Fflags&1 != 0,
	}
	// A device node is judged (and reported) by the device it names.
	if t := e.I_mode & sIFMT; t == sIFBLK || t == sIFCHR {
		d.Dev = e.Rdev
	}
	ev.File = d
	match := "unknown"
	if int(e.Match) < len(matchNames) {
		match = matchNames[e.Match]
	}
	ev.Message = "matched by " + match + " rule"
	switch e.Match {
	case matchOtherIPC:
		ev.Message = lsmrules.OpOtherIPC.String() + ": a POSIX message queue created outside the sandbox"
	case matchOtherPID:
		ev.Message = lsmrules.OpOtherTask.String() + ": the open descriptors of a process outside the sandbox (/proc/PID/fd, fdinfo)"
	case matchOtherTTY:
		ev.Message = lsmrules.OpTTYInject.String() + ": open of a terminal controlled by a session outside the sandbox"
	case matchNotify:
		ev.Message = lsmrules.OpNotifyMark.String() + ": a mark outside the sandbox's workspaces"
		if e.Flags == fsnotifyObjSB {
			ev.Message = lsmrules.OpNotifyMark.String() + ": a filesystem-wide mark"
		}
	}
	if e.Op != 0 && e.Match != matchNotify && e.Match != matchOtherIPC && e.Match != matchOtherTTY && e.Match != matchOtherPID {
		d.Op = PathOp(e.Op).String()
		ev.Message = d.Op + ": " + ev.Message
	}
	if e.Fflags&2 != 0 {
		ev.Message += "; path truncated"
	}
	return nil
}

var capNames = [...]string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// CapName returns the CAP_* name of a capability number.
func CapName(c int) string {
	if c >= 0 && c < len(capNames) {
		return capNames[c]
	}
	return fmt.Sprintf("CAP_%d", c)
}

var bpfCmds = [...]string{
	"BPF_MAP_CREATE", "BPF_MAP_LOOKUP_ELEM", "BPF_MAP_UPDATE_ELEM", "BPF_MAP_DELETE_ELEM",
	"BPF_MAP_GET_NEXT_KEY", "BPF_PROG_LOAD", "BPF_OBJ_PIN", "BPF_OBJ_GET", "BPF_PROG_ATTACH",
	"BPF_PROG_DETACH", "BPF_PROG_TEST_RUN", "BPF_PROG_GET_NEXT_ID", "BPF_MAP_GET_NEXT_ID",
	"BPF_PROG_GET_FD_BY_ID", "BPF_MAP_GET_FD_BY_ID", "BPF_OBJ_GET_INFO_BY_FD", "BPF_PROG_QUERY",
	"BPF_RAW_TRACEPOINT_OPEN", "BPF_BTF_LOAD", "BPF_BTF_GET_FD_BY_ID", "BPF_TASK_FD_QUERY",
	"BPF_MAP_LOOKUP_AND_DELETE_ELEM", "BPF_MAP_FREEZE", "BPF_BTF_GET_NEXT_ID",
	"BPF_MAP_LOOKUP_BATCH", "BPF_MAP_LOOKUP_AND_DELETE_BATCH", "BPF_MAP_UPDATE_BATCH",
	"BPF_MAP_DELETE_BATCH", "BPF_LINK_CREATE", "BPF_LINK_UPDATE", "BPF_LINK_GET_FD_BY_ID",
	"BPF_LINK_GET_NEXT_ID", "BPF_ENABLE_STATS", "BPF_ITER_CREATE", "BPF_LINK_DETACH",
	"BPF_PROG_BIND_MAP",
}

func decodeTask(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[lsmTaskEvent](raw)
	if err != nil {
		return err
	}
	t := &audit.TargetDetail{
		PID:  e.TargetPid,
		Comm: enforce.CString(e.TargetComm[:]),
		Mode: e.Mode,
	}
	if e.Hdr.Kind&^(evFmodRet|evFentry) == enforce.EvOperation && e.Mode&syscallTag != 0 {
		// A dangerous syscall judged in its own context (its capability,
		// its key permission, its entry).
		ev.Message = syscallName(e.Mode&^syscallTag) + ": " + lsmrules.Op(e.Op).String()
		if e.Cap >= 0 {
			ev.Message += " (" + CapName(int(e.Cap)) + ")"
			t.Capability = e.Cap
		}
		ev.Target = t
		return nil
	}
	switch e.Hdr.Kind &^ evFmodRet {
	case enforce.EvCapability:
		t.Capability = e.Cap
		ev.Message = CapName(int(e.Cap))
		if e.Mode&mmapAddrMode != 0 {
			ev.Message = mmapAddrMessage(e.Mode)
		}
	case enforce.EvBPF:
		if int(e.Mode) < len(bpfCmds) {
			ev.Message = "bpf(" + bpfCmds[e.Mode] + ")"
		} else {
			ev.Message = fmt.Sprintf("bpf(%d)", e.Mode)
		}
	case enforce.EvSignal:
		ev.Message = fmt.Sprintf("signal %d to the agent", e.Mode)
		if lsmrules.Op(e.Op) == lsmrules.OpOtherTask {
			ev.Message = fmt.Sprintf("%s: signal %d to pid %d (%s), outside the sandbox", lsmrules.OpOtherTask, e.Mode, e.TargetPid, t.Comm)
		}
	default:
		ev.Message = lsmrules.Op(e.Op).String()
	}
	switch lsmrules.Op(e.Op) {
	case lsmrules.OpOtherTask:
		if e.Hdr.Kind&^evFmodRet != enforce.EvSignal {
			ev.Message = fmt.Sprintf("%s: %s pid %d (%s), outside the sandbox", lsmrules.OpOtherTask, otherTaskWhat(e), e.TargetPid, t.Comm)
		}
	case lsmrules.OpOtherIPC:
		ev.Message = otherIPCMessage(e)
		t.PID, t.Mode = 0, e.Mode
	case lsmrules.OpTTYInject:
		ev.Message = fmt.Sprintf("%s: ioctl %#x (TIOCSTI/TIOCLINUX)", lsmrules.OpTTYInject, e.Mode)
	}
	ev.Target = t
	return nil
}

func decodeMount(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[lsmMountEvent](raw)
	if err != nil {
		return err
	}
	ev.Mount = &audit.MountDetail{
		Op:     lsmrules.Op(e.Op).String(),
		Source: cstr(e.Source[:]),
		Target: cstr(e.Target[:]),
		FSType: cstr(e.Fstype[:]),
		Flags:  e.Flags,
	}
	return nil
}

// kernel_read_file_id and kernel_load_data_id share their order.
var kernelFileIDs = [...]string{"unknown", "firmware", "module", "kexec_image", "kexec_initramfs", "policy", "x509_certificate"}

func decodeModule(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[lsmModuleEvent](raw)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("id %d", e.Id)
	if int(e.Id) < len(kernelFileIDs) {
		what = kernelFileIDs[e.Id]
	}
	ev.Message = lsmrules.Op(e.Op).String() + ": " + what
	if p := cstr(e.Path[:]); p != "" {
		ev.File = &audit.FileDetail{Path: p}
	}
	return nil
}

// Operations of socket events (enum sock_op).
var sockOps = [...]string{"", "sock_create", "connect", "sendmsg"}

// Why a unix peer was refused (UNIX_PEER_* in bpf/include/lsm_socket.h).
var unixReasons = [...]string{"", "unix socket outside the sandbox's socket paths (judged on the socket the kernel found)",
	"abstract unix socket (the host's namespace)"}

func decodeSock(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[lsmSockEvent](raw)
	if err != nil {
		return err
	}
	n := &audit.NetDetail{Family: uint16(e.Family), Type: uint16(e.Type), Protocol: uint16(e.Protocol)}
	if int(e.Op) < len(sockOps) {
		n.Op = sockOps[e.Op]
	}
	if int(e.Reason) < len(unixReasons) {
		n.Reason = unixReasons[e.Reason]
	}
	n.Addr = cstr(e.Path[:])
	if e.Fflags&2 != 0 {
		n.Reason += "; path truncated"
	}
	ev.Net = n
	if n.Op == "sock_create" {
		ev.Message = fmt.Sprintf("socket(%d, %d, %d)", e.Family, e.Type, e.Protocol)
	} else {
		ev.Message = n.Reason
	}
	return nil
}

// Sub-operations of other-process events outside the signal and ptrace
// hooks (OTHER_* in bpf/include/lsm_task.h): task_event.mode is tag | detail.
const (
	otherSetrlimit = 0x01000000
	otherSetnice   = 0x02000000
	otherSched     = 0x03000000
	otherIoprio    = 0x04000000
	otherMovemem   = 0x05000000
)

var rlimitNames = [...]string{"RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_RSS",
	"RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_LOCKS", "RLIMIT_SIGPENDING",
	"RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO", "RLIMIT_RTTIME"}

// otherTaskWhat names what an other-process event did to its target.
func otherTaskWhat(e *lsmTaskEvent) string {
	if e.Hdr.Kind&^evFmodRet == enforce.EvPtrace {
		if e.Mode&2 != 0 {
			return "ptrace attach to"
		}
		return "ptrace-mode read (/proc/PID/environ, maps, fd, ns...) of"
	}
	detail := e.Mode & 0xffffff
	switch e.Mode &^ 0xffffff {
	case otherSetrlimit:
		name := fmt.Sprintf("resource %d", detail)
		if int(detail) < len(rlimitNames) {
			name = rlimitNames[detail]
		}
		return "setrlimit/prlimit " + name + " of"
	case otherSetnice:
		return fmt.Sprintf("setpriority (nice %d) of", int8(detail))
	case otherSched:
		return "sched_setscheduler/setattr/setaffinity of"
	case otherIoprio:
		return fmt.Sprintf("ioprio_set (%#x) of", detail)
	case otherMovemem:
		return "migrate_pages/move_pages of"
	}
	return fmt.Sprintf("operation %#x on", e.Mode)
}

// Other-IPC events (IPC_TAG in bpf/include/lsm_ipc.h): mode is tag | what << 16 |
// detail, target_pid the object's id, cap its key.
const (
	ipcTag      = 0x20000000
	ipcWhatPerm = 1
	ipcWhatCtl  = 2
)

func otherIPCMessage(e *lsmTaskEvent) string {
	what := "access"
	switch (e.Mode &^ ipcTag) >> 16 {
	case ipcWhatPerm:
		what = fmt.Sprintf("access (mode %#o)", e.Mode&0xffff)
	case ipcWhatCtl:
		what = fmt.Sprintf("ctl command %d", e.Mode&0xffff)
	}
	return fmt.Sprintf("%s: %s of System V object id %d key %#x, created outside the sandbox", lsmrules.OpOtherIPC, what, e.TargetPid, uint32(e.Cap))
}
