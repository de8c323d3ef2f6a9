package cgroupbpf_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/cgroupbpf"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

const (
	ruleDev    = 101
	ruleSysctl = 102
	ruleSock   = 103
	sandboxID  = 5
)

// TestHelper performs one operation when run as a child by the tests below
// (WATCHER_TEST_HELPER=op:args...) and prints "ok" or the errno number.
func TestHelper(t *testing.T) {
	mode := os.Getenv("WATCHER_TEST_HELPER")
	if mode == "" {
		t.Skip("helper process mode only")
	}
	parts := strings.Split(mode, ":")
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	var err error
	switch parts[0] {
	case "open":
		var fd int
		fd, err = unix.Open(parts[1], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
	case "sysctl-write":
		err = os.WriteFile("/proc/sys/"+parts[1], []byte(parts[2]), 0)
	case "sysctl-read":
		_, err = os.ReadFile("/proc/sys/" + parts[1])
	case "ping":
		// An unconnected ICMP ping socket: sendto names the address.
		var fd int
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
		if err == nil {
			echo := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'w', 't'}
			err = unix.Sendto(fd, echo, 0, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
			if err == nil {
				buf := make([]byte, 64)
				unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
				var k int
				if k, _, err = unix.Recvfrom(fd, buf, 0); err == nil && (k < 1 || buf[0] != 0) {
					err = fmt.Errorf("no echo reply: % x", buf[:k])
				}
			}
			unix.Close(fd)
		}
	case "socket":
		var fd int
		fd, err = unix.Socket(atoi(parts[1]), atoi(parts[2]), atoi(parts[3]))
		if err == nil {
			unix.Close(fd)
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	printResult(err)
}

// printResult ends a helper process: "result=ok", the errno, or the error.
func printResult(err error) {
	var errno syscall.Errno
	switch {
	case err == nil:
		fmt.Println("result=ok")
	case errors.As(err, &errno):
		fmt.Printf("result=%d\n", int(errno))
	default:
		fmt.Printf("result=error %v\n", err)
	}
	os.Exit(0)
}

// runOp runs the helper in cgPath and returns nil or the errno it saw.
func runOp(t *testing.T, cgPath, op string) error {
	t.Helper()
	cmd := enforcetest.SelfCommand(t, cgPath, "TestHelper", op)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper %s: %v\n%s", op, err, out)
	}
	return parseResult(t, op, string(out))
}

// parseResult reads the helper's "result=" line: nil or the errno.
func parseResult(t *testing.T, op, s string) error {
	t.Helper()
	out := s
	i := strings.Index(s, "result=")
	if i < 0 {
		t.Fatalf("helper %s: no result:\n%s", op, out)
	}
	res := strings.TrimSpace(strings.SplitN(s[i+len("result="):], "\n", 2)[0])
	if res == "ok" {
		return nil
	}
	n, err := strconv.Atoi(res)
	if err != nil {
		t.Fatalf("helper %s: %s", op, res)
	}
	return syscall.Errno(n)
}

// deviceDir returns a directory on a filesystem that honours device nodes.
func deviceDir(t *testing.T) string {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Flags&unix.ST_NODEV == 0 {
		return dir
	}
	dir, err := os.MkdirTemp("/dev", "watcher-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func mknod(t *testing.T, path string, mode uint32, major, minor uint32) {
	t.Helper()
	if err := unix.Mknod(path, mode|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
}

// openableBlockDevice makes a node in dir for a block device of this host
// that opens outside any sandbox (some hosts refuse their root disk to
// everyone; loop devices open without a backing file).
func openableBlockDevice(t *testing.T, dir string) (string, uint32, uint32) {
	t.Helper()
	ents, _ := os.ReadDir("/sys/dev/block")
	for i, e := range ents {
		var maj, min uint32
		if _, err := fmt.Sscanf(e.Name(), "%d:%d", &maj, &min); err != nil {
			continue
		}
		p := filepath.Join(dir, fmt.Sprintf("disk%d", i))
		mknod(t, p, unix.S_IFBLK, maj, min)
		if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			unix.Close(fd)
			return p, maj, min
		}
		os.Remove(p)
	}
	t.Skip("no block device on this host opens even outside a sandbox")
	return "", 0, 0
}

type fixture struct {
	eng     *enforce.Engine
	hooks   *cgroupbpf.Programs
	sandbox string
	child   string
	outside string
	sbCg    uint64
	events  <-chan audit.Event
}

func setup(t *testing.T) *fixture {
	t.Helper()
	eng := enforcetest.Engine(t)
	hooks, err := cgroupbpf.Load(eng)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { hooks.Close() })
	f := &fixture{eng: eng, hooks: hooks}
	f.sandbox = enforcetest.Cgroup(t, "sandbox")
	f.child = enforcetest.Child(t, f.sandbox, "child")
	f.outside = enforcetest.Cgroup(t, "outside")
	if f.sbCg, err = eng.AddSandbox(f.sandbox, sandboxID, 0); err != nil {
		t.Fatal(err)
	}
	cg, err := hooks.Attach(f.sandbox)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if cg != f.sbCg {
		t.Fatalf("attach returned cgroup %d, want %d", cg, f.sbCg)
	}
	t.Cleanup(func() {
		if err := hooks.Detach(cg); err != nil {
			t.Errorf("detach: %v", err)
		}
	})
	if err := hooks.SetDeviceRules(cgroupbpf.DefaultDeviceRules(ruleDev)); err != nil {
		t.Fatal(err)
	}
	if err := hooks.SetSysctlRules(cgroupbpf.DefaultSysctlRules(ruleSysctl)); err != nil {
		t.Fatal(err)
	}
	if err := hooks.SetSocketRules(cgroupbpf.DefaultSocketRules(ruleSock)); err != nil {
		t.Fatal(err)
	}
	rd := eng.NewReader(enforce.ReaderOptions{PollInterval: 20 * time.Millisecond})
	cgroupbpf.Register(rd)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
	f.events = rd.Events()
	return f
}

// expectEvent waits for an event matching pred.
func (f *fixture) expectEvent(t *testing.T, what string, pred func(audit.Event) bool) audit.Event {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-f.events:
			if pred(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no event for %s", what)
		}
	}
}

func (f *fixture) checkCommon(t *testing.T, ev audit.Event, cgPath string, rule string) {
	t.Helper()
	cg, _ := cgroupfs.ID(cgPath)
	if ev.Process.CgroupID != cg || ev.Sandbox.CgroupID != f.sbCg {
		t.Errorf("event cgroup %d sandbox %d, want %d and %d", ev.Process.CgroupID, ev.Sandbox.CgroupID, cg, f.sbCg)
	}
	if ev.Verdict != audit.VerdictDenied || ev.Mechanism != cgrouprules.Mechanism || ev.Rule != rule {
		t.Errorf("event verdict %q mechanism %q rule %q", ev.Verdict, ev.Mechanism, ev.Rule)
	}
	if ev.Process.PID == 0 || ev.Process.Comm == "" {
		t.Errorf("event without process: %+v", ev.Process)
	}
}

func TestDevices(t *testing.T) {
	f := setup(t)
	dir := deviceDir(t)
	disk, bmaj, bmin := openableBlockDevice(t, dir)
	mem := filepath.Join(dir, "mem")
	kmsg := filepath.Join(dir, "kmsg")
	null := filepath.Join(dir, "null")
	mknod(t, mem, unix.S_IFCHR, 1, 1)
	mknod(t, kmsg, unix.S_IFCHR, 1, 11)
	mknod(t, null, unix.S_IFCHR, 1, 3)

	for _, cg := range []string{f.sandbox, f.child} {
		for _, dev := range []struct {
			path     string
			maj, min uint32
			block    bool
		}{{mem, 1, 1, false}, {kmsg, 1, 11, false}, {disk, bmaj, bmin, true}} {
			if err := runOp(t, cg, "open:"+dev.path); err != syscall.EPERM {
				t.Errorf("open %s in %s: %v, want EPERM", dev.path, filepath.Base(cg), err)
				continue
			}
			ev := f.expectEvent(t, "open "+dev.path, func(ev audit.Event) bool {
				return ev.Kind == audit.KindDevice && ev.File != nil && ev.File.Dev == dev.maj<<20|dev.min
			})
			f.checkCommon(t, ev, cg, "rule-101")
			wantMode := uint32(unix.S_IFCHR)
			if dev.block {
				wantMode = unix.S_IFBLK
			}
			if ev.File.Mode != wantMode || ev.File.Write {
				t.Errorf("device event %+v", ev.File)
			}
		}
		if err := runOp(t, cg, "open:"+null); err != nil {
			t.Errorf("open null in sandbox: %v", err)
		}
	}
	// Outside the sandbox the same opens reach the driver: kmsg and the
	// disk open; mem has no driver on kernels without CONFIG_DEVMEM
	// (ENXIO), but it is not refused.
	for _, p := range []string{kmsg, disk, null} {
		if err := runOp(t, f.outside, "open:"+p); err != nil {
			t.Errorf("open %s outside: %v", p, err)
		}
	}
	if err := runOp(t, f.outside, "open:"+mem); err == syscall.EPERM {
		t.Errorf("open mem outside: EPERM")
	}
}

func TestSysctl(t *testing.T) {
	f := setup(t)
	const name = "kernel/printk_ratelimit"
	cur, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Skipf("no %s: %v", name, err)
	}
	val := strings.TrimSpace(string(cur))
	for _, cg := range []string{f.sandbox, f.child} {
		if err := runOp(t, cg, "sysctl-write:"+name+":"+val); err != syscall.EPERM {
			t.Errorf("write %s in %s: %v, want EPERM", name, filepath.Base(cg), err)
			continue
		}
		ev := f.expectEvent(t, "sysctl write", func(ev audit.Event) bool { return ev.Kind == audit.KindSysctl })
		f.checkCommon(t, ev, cg, "rule-102")
		if ev.File == nil || ev.File.Path != "/proc/sys/"+name || !ev.File.Write || !strings.Contains(ev.Message, strconv.Quote(val)) {
			t.Errorf("sysctl event %+v %q", ev.File, ev.Message)
		}
		if err := runOp(t, cg, "sysctl-read:"+name); err != nil {
			t.Errorf("read %s in sandbox: %v", name, err)
		}
	}
	if err := runOp(t, f.outside, "sysctl-write:"+name+":"+val); err != nil {
		t.Errorf("write %s outside: %v", name, err)
	}
	// A per-sandbox rule for one name overrides the default.
	if err := f.hooks.SetSysctlRules(append(cgroupbpf.DefaultSysctlRules(ruleSysctl),
		cgrouprules.SysctlRule{Sandbox: sandboxID, Name: "kernel.printk_ratelimit", Write: true, Action: enforce.ActionAllow})); err != nil {
		t.Fatal(err)
	}
	if err := runOp(t, f.child, "sysctl-write:"+name+":"+val); err != nil {
		t.Errorf("write %s with an allow rule: %v", name, err)
	}
	if err := runOp(t, f.child, "sysctl-write:kernel/printk_ratelimit_burst:x"); err != syscall.EPERM {
		t.Errorf("write of another name with an allow rule for one: %v", err)
	}
}

func TestSocketCreate(t *testing.T) {
	f := setup(t)
	// A sandbox's own rule next to the defaults.
	if err := f.hooks.SetSocketRules(append(cgroupbpf.DefaultSocketRules(ruleSock), cgrouprules.SocketRule{
		Sandbox: sandboxID, Family: unix.AF_INET6, Type: unix.SOCK_DGRAM, Protocol: unix.IPPROTO_UDP,
		Action: enforce.ActionBlock, RuleID: ruleSock,
	})); err != nil {
		t.Fatal(err)
	}
	sock := func(fam, typ, proto int) string { return fmt.Sprintf("socket:%d:%d:%d", fam, typ, proto) }
	denied := []struct {
		name          string
		fam, typ, pro int
	}{
		{"raw icmp", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
		{"raw ip", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW},
		{"raw ipv6", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6},
		{"udp6 (per-sandbox rule)", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP},
	}
	for _, cg := range []string{f.sandbox, f.child} {
		for _, d := range denied {
			if err := runOp(t, cg, sock(d.fam, d.typ, d.pro)); err != syscall.EPERM {
				t.Errorf("%s socket in %s: %v, want EPERM", d.name, filepath.Base(cg), err)
				continue
			}
			ev := f.expectEvent(t, d.name, func(ev audit.Event) bool {
				return ev.Kind == audit.KindSocket && ev.Net != nil && int(ev.Net.Family) == d.fam && int(ev.Net.Protocol) == d.pro
			})
			f.checkCommon(t, ev, cg, "rule-103")
			if ev.Net.Op != "sock_create" || int(ev.Net.Type) != d.typ {
				t.Errorf("socket event %+v", ev.Net)
			}
		}
		for _, ok := range []string{
			sock(unix.AF_INET, unix.SOCK_STREAM, 0),
			sock(unix.AF_INET, unix.SOCK_DGRAM, 0),
			sock(unix.AF_INET6, unix.SOCK_STREAM, 0),
		} {
			if err := runOp(t, cg, ok); err != nil {
				t.Errorf("%s in sandbox: %v", ok, err)
			}
		}
	}
	for _, d := range denied {
		err := runOp(t, f.outside, sock(d.fam, d.typ, d.pro))
		if err != nil {
			t.Errorf("%s socket outside: %v", d.name, err)
		}
	}
}

func TestRecordOnlyAndUnregistered(t *testing.T) {
	f := setup(t)
	// Record-only sandbox: the operation succeeds and is recorded.
	if err := f.eng.AddSandboxID(f.sbCg, sandboxID, enforce.SandboxRecordOnly); err != nil {
		t.Fatal(err)
	}
	if err := runOp(t, f.child, fmt.Sprintf("socket:%d:%d:%d", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)); err != nil {
		t.Fatalf("raw socket in a record-only sandbox: %v", err)
	}
	ev := f.expectEvent(t, "recorded socket", func(ev audit.Event) bool { return ev.Kind == audit.KindSocket })
	if ev.Verdict != audit.VerdictRecorded {
		t.Errorf("verdict %q, want recorded", ev.Verdict)
	}
	// A cgroup with the programs attached but no longer a sandbox is left
	// alone.
	if err := f.eng.RemoveSandbox(f.sbCg); err != nil {
		t.Fatal(err)
	}
	if err := runOp(t, f.child, rawICMP); err != nil {
		t.Errorf("packet socket in an unregistered cgroup: %v", err)
	}
}

func TestReattachAdoptsPinsAndDetach(t *testing.T) {
	f := setup(t)
	pinDir := filepath.Join(enforce.LinkPinDir(f.eng.PinDir(), cgroupbpf.Group), strconv.FormatUint(f.sbCg, 10))
	before := linkIDs(t, pinDir)

	// A restarted agent: new programs, same pins; the links are updated
	// in place, so the link ids stay and enforcement never lapses.
	f.hooks.Close()
	again, err := cgroupbpf.Load(f.eng)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := runOp(t, f.child, rawICMP); err != syscall.EPERM {
		t.Fatalf("between agents: %v, want EPERM", err)
	}
	if _, err := again.Attach(f.sandbox); err != nil {
		t.Fatal(err)
	}
	after := linkIDs(t, pinDir)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("links replaced (%v -> %v), want updated in place", before, after)
	}
	got, err := again.Attached()
	if err != nil || len(got) != 1 || got[0] != f.sbCg {
		t.Errorf("attached %v %v, want [%d]", got, err, f.sbCg)
	}
	if err := runOp(t, f.child, rawICMP); err != syscall.EPERM {
		t.Fatalf("after re-attach: %v, want EPERM", err)
	}
	if err := again.Detach(f.sbCg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins left after detach: %v", err)
	}
	if err := runOp(t, f.child, rawICMP); err != nil {
		t.Errorf("after detach: %v, want allowed", err)
	}
}

var rawICMP = fmt.Sprintf("socket:%d:%d:%d", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)

func linkIDs(t *testing.T, dir string) []link.ID {
	t.Helper()
	var ids []link.ID
	for _, name := range []string{"dev", "sysctl", "sock_create"} {
		l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
		if err != nil {
			t.Fatalf("pinned link %s: %v", name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	return ids
}

func TestProbe(t *testing.T) {
	enforcetest.RequireRoot(t)
	for name, err := range cgroupbpf.Probe() {
		if err != nil {
			t.Errorf("cgroup/%s does not load on this kernel: %v", name, err)
		}
	}
}

func TestRuleValidation(t *testing.T) {
	f := setup(t)
	bad := []error{
		f.hooks.SetDeviceRules([]cgrouprules.DeviceRule{{Type: 3, Major: 1, Minor: 1}}),
		f.hooks.SetDeviceRules([]cgrouprules.DeviceRule{{Type: cgrouprules.CharDevice, Major: cgrouprules.Any, Minor: 3}}),
		f.hooks.SetDeviceRules([]cgrouprules.DeviceRule{{Type: cgrouprules.CharDevice, Major: 1, Minor: 1, Action: 9}}),
		f.hooks.SetSysctlRules([]cgrouprules.SysctlRule{{Name: strings.Repeat("x", 200)}}),
		f.hooks.SetSocketRules([]cgrouprules.SocketRule{{Family: cgrouprules.Any, Type: cgrouprules.Any, Protocol: cgrouprules.Any}}),
		f.hooks.SetSocketRules([]cgrouprules.SocketRule{{Family: -5, Type: 1, Protocol: 0}}),
	}
	for i, err := range bad {
		if err == nil {
			t.Errorf("bad rule set %d accepted", i)
		}
	}
	// A rejected set leaves the old rules in force.
	if err := runOp(t, f.sandbox, rawICMP); err != syscall.EPERM {
		t.Errorf("after rejected rule sets: %v, want EPERM", err)
	}
}
