package lsm

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// Processes and sockets: task_alloc's CLONE_FILES check, socket_create
// for the families cgroup/sock_create never sees, and unix peers judged on
// the socket the kernel found.

// sockNum packs socket(2)'s arguments into opSpec.Num.
func sockNum(family, typ, proto int) uint64 {
	return uint64(family)<<32 | uint64(typ)<<16 | uint64(proto)
}

type cloneArgs3 struct {
	Flags, Pidfd, ChildTID, ParentTID, ExitSignal, Stack, StackSize, TLS, SetTID, SetTIDSize, Cgroup uint64
}

// rawClone forks with clone(2) (nr = SYS_CLONE, a = flags) or clone3(2)
// (nr = SYS_CLONE3, a = *clone_args); the child exits at once. Returns the
// child's pid in the parent.
//
//go:nosplit
//go:norace
func rawClone(nr, a, size uintptr) (uintptr, syscall.Errno) {
	r1, _, e := syscall.RawSyscall(nr, a, size, 0)
	if e != 0 {
		return 0, e
	}
	if r1 == 0 {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	return r1, 0
}

func reap(pid uintptr) {
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
}

// doTaskSockOp runs the operations of this file; false for other kinds.
func doTaskSockOp(op opSpec) (string, bool) {
	switch op.Kind {
	case "clone_files":
		pid, e := rawClone(unix.SYS_CLONE, unix.CLONE_FILES|uintptr(unix.SIGCHLD), 0)
		if e == 0 {
			reap(pid)
			return "OK", true
		}
		return errnoResult(e), true
	case "clone3_files":
		args := &cloneArgs3{Flags: unix.CLONE_FILES, ExitSignal: uint64(unix.SIGCHLD)}
		pid, e := rawClone(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args))
		if e == 0 {
			reap(pid)
			return "OK", true
		}
		return errnoResult(e), true
	case "socket":
		fd, err := unix.Socket(int(op.Num>>32), int(op.Num>>16&0xffff), int(op.Num&0xffff))
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err), true
	case "unix_connect", "unix_sendto":
		typ := unix.SOCK_STREAM
		if op.Kind == "unix_sendto" {
			typ = unix.SOCK_DGRAM
		}
		fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "ERR: socket: " + err.Error(), true
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrUnix{Name: op.Path}
		if op.Kind == "unix_sendto" {
			return errnoResult(unix.Sendto(fd, []byte("x"), 0, sa)), true
		}
		return errnoResult(unix.Connect(fd, sa)), true
	case "unix_socketpair":
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return errnoResult(err), true
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		_, err = unix.Write(fds[0], []byte("x"))
		return errnoResult(err), true
	}
	return "", false
}

// TestCloneFilesRefused: a second process sharing the file table is
// refused at task_alloc on the flags the kernel copied (clone and clone3);
// a plain fork and the helper's own threads (CLONE_THREAD|CLONE_FILES)
// work, and outside the sandbox the same clone works.
func TestCloneFilesRefused(t *testing.T) {
	eng, l := setup(t)
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Ops: map[lsmrules.Op]lsmrules.Decision{lsmrules.OpCloneFiles: {Action: enforce.ActionBlock, RuleID: 501}}})
	ops := []opSpec{
		{Name: "clone_files", Kind: "clone_files"},
		{Name: "clone3_files", Kind: "clone3_files"},
		{Name: "fork", Kind: "fork"},
	}
	for _, where := range []string{sb.root, sb.nested} {
		res, pid := runOps(t, where, ops)
		for _, name := range []string{"clone_files", "clone3_files"} {
			if res[name] != "EPERM" {
				t.Errorf("%s: %s: %s, want EPERM", where, name, res[name])
				continue
			}
			ev := waitEvent(t, name, func(ev audit.Event) bool {
				return ev.Kind == audit.KindOperation && ev.Process.TGID == uint32(pid) && ev.Message == "clone_files"
			})
			if ev.Verdict != audit.VerdictDenied || ev.Rule != "rule-501" {
				t.Errorf("%s event: verdict %s rule %q", name, ev.Verdict, ev.Rule)
			}
		}
		if res["fork"] != "OK" {
			t.Errorf("%s: plain fork: %s, want OK", where, res["fork"])
		}
	}
	res, _ := runOps(t, "", ops)
	for _, op := range ops {
		if res[op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", op.Name, res[op.Name])
		}
	}
}

// TestSocketFamiliesRefused: AF_PACKET and a refused netlink protocol get
// EPERM at socket_create (cgroup/sock_create never runs for them); a UDP
// socket and NETLINK_ROUTE work in the sandbox, AF_PACKET works outside.
func TestSocketFamiliesRefused(t *testing.T) {
	eng, l := setup(t)
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Sockets: []lsmrules.SocketRule{
		{Family: unix.AF_PACKET, Type: lsmrules.AnySocket, Protocol: lsmrules.AnySocket, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 511}},
		{Family: unix.AF_NETLINK, Type: lsmrules.AnySocket, Protocol: unix.NETLINK_AUDIT, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 512}},
	}})
	packet := opSpec{Name: "packet", Kind: "socket", Num: sockNum(unix.AF_PACKET, unix.SOCK_RAW, 0x0300 /* htons(ETH_P_ALL) */)}
	packetDgram := opSpec{Name: "packet_dgram", Kind: "socket", Num: sockNum(unix.AF_PACKET, unix.SOCK_DGRAM, 0)}
	audit9 := opSpec{Name: "netlink_audit", Kind: "socket", Num: sockNum(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)}
	udp := opSpec{Name: "udp", Kind: "socket", Num: sockNum(unix.AF_INET, unix.SOCK_DGRAM, 0)}
	route := opSpec{Name: "netlink_route", Kind: "socket", Num: sockNum(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)}
	ops := []opSpec{packet, packetDgram, audit9, udp, route}
	for _, where := range []string{sb.root, sb.nested} {
		res, pid := runOps(t, where, ops)
		for _, c := range []struct {
			op     opSpec
			family uint16
			rule   string
		}{{packet, unix.AF_PACKET, "rule-511"}, {packetDgram, unix.AF_PACKET, "rule-511"}, {audit9, unix.AF_NETLINK, "rule-512"}} {
			if res[c.op.Name] != "EPERM" {
				t.Errorf("%s: %s: %s, want EPERM", where, c.op.Name, res[c.op.Name])
				continue
			}
			ev := waitEvent(t, c.op.Name, func(ev audit.Event) bool {
				return ev.Kind == audit.KindSocket && ev.Process.TGID == uint32(pid) && ev.Net != nil && ev.Net.Family == c.family && ev.Rule == c.rule
			})
			if ev.Verdict != audit.VerdictDenied || ev.Net == nil || ev.Net.Op != "sock_create" {
				t.Errorf("%s event: %+v", c.op.Name, ev)
			}
		}
		for _, op := range []opSpec{udp, route} {
			if res[op.Name] != "OK" {
				t.Errorf("%s: %s: %s, want OK", where, op.Name, res[op.Name])
			}
		}
	}
	res, _ := runOps(t, "", ops)
	for _, op := range ops {
		if res[op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", op.Name, res[op.Name])
		}
	}
}

// TestUnixPeerResolved: a sandbox that may reach unix sockets only in its
// workspace connects through a symlink in the workspace to a host socket:
// refused, judged on the socket the kernel found (the host path is in the
// event); so are a direct connect, a datagram through a symlink and an
// abstract name. A socket in the workspace, a symlink in the workspace to
// it and a socketpair work; outside the sandbox the symlink works.
func TestUnixPeerResolved(t *testing.T) {
	eng, l := setup(t)
	base := t.TempDir()
	ws, host := filepath.Join(base, "ws"), filepath.Join(base, "host")
	for _, d := range []string{ws, host} {
		must(t, os.MkdirAll(d, 0o755))
	}
	listen := func(network, path string) {
		if network == "unixgram" {
			c, err := net.ListenUnixgram(network, &net.UnixAddr{Name: path, Net: network})
			must(t, err)
			t.Cleanup(func() { c.Close() })
			return
		}
		ln, err := net.Listen(network, path)
		must(t, err)
		t.Cleanup(func() { ln.Close() })
	}
	hostSock, hostDgram, wsSock := filepath.Join(host, "h.sock"), filepath.Join(host, "d.sock"), filepath.Join(ws, "w.sock")
	abstract := "@watcher-lsmtest-" + randHex()
	listen("unix", hostSock)
	listen("unixgram", hostDgram)
	listen("unix", wsSock)
	listen("unix", abstract)
	must(t, os.Symlink(hostSock, filepath.Join(ws, "link")))
	must(t, os.Symlink(hostDgram, filepath.Join(ws, "dglink")))
	must(t, os.Symlink(wsSock, filepath.Join(ws, "oklink")))

	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{
		Ops:       map[lsmrules.Op]lsmrules.Decision{lsmrules.OpUnixConnect: {Action: enforce.ActionBlock, RuleID: 521}},
		UnixPaths: []string{ws + "/"},
	})
	refused := []struct {
		op   opSpec
		addr string
	}{
		{opSpec{Name: "symlink_to_host", Kind: "unix_connect", Path: filepath.Join(ws, "link")}, hostSock},
		{opSpec{Name: "host_direct", Kind: "unix_connect", Path: hostSock}, hostSock},
		{opSpec{Name: "dgram_symlink_to_host", Kind: "unix_sendto", Path: filepath.Join(ws, "dglink")}, hostDgram},
		{opSpec{Name: "abstract", Kind: "unix_connect", Path: abstract}, ""},
	}
	benign := []opSpec{
		{Name: "ws_socket", Kind: "unix_connect", Path: wsSock},
		{Name: "ws_symlink_to_ws", Kind: "unix_connect", Path: filepath.Join(ws, "oklink")},
		{Name: "socketpair", Kind: "unix_socketpair"},
	}
	var ops []opSpec
	for _, c := range refused {
		ops = append(ops, c.op)
	}
	ops = append(ops, benign...)
	for _, where := range []string{sb.root, sb.nested} {
		res, pid := runOps(t, where, ops)
		for _, c := range refused {
			if res[c.op.Name] != "EPERM" {
				t.Errorf("%s: %s: %s, want EPERM", where, c.op.Name, res[c.op.Name])
				continue
			}
			ev := waitEvent(t, c.op.Name, func(ev audit.Event) bool {
				return ev.Kind == audit.KindNet && ev.Process.TGID == uint32(pid) && ev.Net != nil && ev.Net.Addr == c.addr && ev.Rule == "rule-521"
			})
			if ev.Verdict != audit.VerdictDenied || ev.Net == nil || ev.Net.Family != unix.AF_UNIX {
				t.Errorf("%s event: %+v", c.op.Name, ev)
			}
		}
		for _, op := range benign {
			if res[op.Name] != "OK" {
				t.Errorf("%s: %s: %s, want OK", where, op.Name, res[op.Name])
			}
		}
	}
	res, _ := runOps(t, "", ops)
	for _, op := range ops {
		if res[op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", op.Name, res[op.Name])
		}
	}
}
