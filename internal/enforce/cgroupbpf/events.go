package cgroupbpf

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

// Mechanism is the audit mechanism name of this group's events.

// Kernel event types generated from bpf/cgroup.c.
type (
	DeviceEvent = cgroupDevEvent
	SysctlEvent = cgroupSysctlEvent
	SocketEvent = cgroupSockEvent
)

// Register adds the decoders of this group's event kinds to r.
func Register(r *enforce.Reader) {
	r.Register(enforce.EvDevice, audit.KindDevice, cgrouprules.Mechanism, decodeDevice)
	r.Register(enforce.EvSysctl, audit.KindSysctl, cgrouprules.Mechanism, decodeSysctl)
	r.Register(enforce.EvSocket, audit.KindSocket, cgrouprules.Mechanism, decodeSocket)
	r.Register(enforce.EvListen, audit.KindNet, cgrouprules.Mechanism, decodeListen)
}

// fillPPID completes the header: these programs cannot read task_struct
// (see cg_fill_hdr in bpf/cgroup.c), so the parent comes from /proc while
// the process still exists.
func fillPPID(ev *audit.Event) {
	if ev.Process.PPID != 0 || ev.Process.TGID == 0 {
		return
	}
	data, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(ev.Process.TGID), 10) + "/stat")
	if err != nil {
		return
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return
	}
	f := strings.Fields(s[i+1:])
	if len(f) >= 2 {
		if p, err := strconv.ParseUint(f[1], 10, 32); err == nil {
			ev.Process.PPID = uint32(p)
		}
	}
}

func decodeDevice(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[DeviceEvent](raw)
	if err != nil {
		return err
	}
	fillPPID(ev)
	mode := uint32(unix.S_IFCHR)
	kind := "char"
	if cgrouprules.DeviceType(e.DevType) == cgrouprules.BlockDevice {
		mode, kind = unix.S_IFBLK, "block"
	}
	acc := cgrouprules.DeviceAccess(e.Access)
	ev.File = &audit.FileDetail{
		Mode:  mode,
		Dev:   e.Major<<20 | e.Minor,
		Write: acc&cgrouprules.AccessWrite != 0,
	}
	ev.Message = fmt.Sprintf("%s device %d:%d %s", kind, e.Major, e.Minor, acc)
	return nil
}

func decodeSysctl(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[SysctlEvent](raw)
	if err != nil {
		return err
	}
	fillPPID(ev)
	name := enforce.CString(int8Bytes(e.Name[:]))
	ev.File = &audit.FileDetail{Path: "/proc/sys/" + name, Write: e.Write != 0}
	if e.Write != 0 {
		n := min(int(e.ValueLen), len(e.Value))
		val := strings.TrimRight(string(int8Bytes(e.Value[:n])), "\x00\n")
		ev.Message = fmt.Sprintf("write %q to /proc/sys/%s", val, name)
	} else {
		ev.Message = "read /proc/sys/" + name
	}
	return nil
}

func decodeSocket(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[SocketEvent](raw)
	if err != nil {
		return err
	}
	fillPPID(ev)
	ev.Net = &audit.NetDetail{
		Op: "sock_create", Family: uint16(e.Family), Type: uint16(e.Type), Protocol: uint16(e.Protocol),
		Reason: socketName(e.Family, e.Type, e.Protocol),
	}
	return nil
}

func int8Bytes(b []int8) []byte {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b))
}

var familyNames = map[uint32]string{
	unix.AF_UNIX: "unix", unix.AF_INET: "inet", unix.AF_INET6: "inet6", unix.AF_NETLINK: "netlink",
	unix.AF_PACKET: "packet", unix.AF_VSOCK: "vsock", unix.AF_BLUETOOTH: "bluetooth", unix.AF_CAN: "can",
	unix.AF_ALG: "alg", unix.AF_XDP: "xdp", unix.AF_KEY: "key", unix.AF_TIPC: "tipc", unix.AF_RDS: "rds",
}

var typeNames = map[uint32]string{
	unix.SOCK_STREAM: "stream", unix.SOCK_DGRAM: "dgram", unix.SOCK_RAW: "raw",
	unix.SOCK_SEQPACKET: "seqpacket", unix.SOCK_RDM: "rdm", unix.SOCK_PACKET: "packet",
}

// socketName describes a socket, e.g. "packet/raw proto 768".
func socketName(family, typ, proto uint32) string {
	f, ok := familyNames[family]
	if !ok {
		f = fmt.Sprintf("family %d", family)
	}
	t, ok := typeNames[typ]
	if !ok {
		t = fmt.Sprintf("type %d", typ)
	}
	return fmt.Sprintf("%s/%s proto %d", f, t, proto)
}
