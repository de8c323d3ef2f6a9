package lsm

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// TestSyscallsJudgedInTheirContext: the entries of the one dangerous list
// without a hook of their own are refused with EPERM before any effect by
// what the syscall asks the kernel first, judged while the task is in that
// syscall: the capability (iopl, ioperm, acct, swapon, swapoff, reboot,
// open_by_handle_at, delete_module, mount_setattr) or the key permission
// (keyctl, add_key, request_key); those that ask nothing (personality,
// name_to_handle_at, io_uring) are killed at their own entry point. Each is
// recorded; outside the sandbox the same calls pass the check (and fail
// later on their harmless arguments, or work), and inside, the harmless
// variants (lowering iopl, turning ports off, CAP_SYS_ADMIN for another
// syscall) work.
func TestSyscallsJudgedInTheirContext(t *testing.T) {
	eng, l := setup(t)
	block := func(id uint32) lsmrules.Decision { return lsmrules.Decision{Action: enforce.ActionBlock, RuleID: id} }
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Ops: map[lsmrules.Op]lsmrules.Decision{
		lsmrules.OpKernelIface: block(501), lsmrules.OpKeyring: block(502), lsmrules.OpMount: block(503), lsmrules.OpKernelLoadData: block(504), lsmrules.OpIOUring: block(505),
	}})
	refused := []struct {
		op  opSpec
		msg string
	}{
		{opSpec{Name: "iopl_raise", Kind: "iopl", Num: 3}, "iopl: kernel_interface (CAP_SYS_RAWIO)"},
		{opSpec{Name: "ioperm_on", Kind: "ioperm", Num: 1}, "ioperm: kernel_interface (CAP_SYS_RAWIO)"},
		{opSpec{Name: "acct", Kind: "acct"}, "acct: kernel_interface (CAP_SYS_PACCT)"},
		{opSpec{Name: "swapon", Kind: "swapon"}, "swapon: kernel_interface (CAP_SYS_ADMIN)"},
		{opSpec{Name: "swapoff", Kind: "swapoff"}, "swapoff: kernel_interface (CAP_SYS_ADMIN)"},
		{opSpec{Name: "reboot", Kind: "reboot"}, "reboot: kernel_interface (CAP_SYS_BOOT)"},
		{opSpec{Name: "open_by_handle_at", Kind: "open_by_handle_at"}, "open_by_handle_at: kernel_interface (CAP_DAC_READ_SEARCH)"},
		{opSpec{Name: "delete_module", Kind: "delete_module"}, "delete_module: kernel_load_data (CAP_SYS_MODULE)"},
		{opSpec{Name: "mount_setattr", Kind: "mount_setattr"}, "mount_setattr: mount (CAP_SYS_ADMIN)"},
		{opSpec{Name: "keyctl_user_keyring", Kind: "keyctl_user_keyring"}, "keyctl: key_alloc"},
		{opSpec{Name: "add_key_user", Kind: "add_key_user"}, "add_key: key_alloc"},
		{opSpec{Name: "request_key", Kind: "request_key"}, "request_key: key_alloc"},
	}
	benign := []opSpec{
		{Name: "iopl_same", Kind: "iopl", Num: 0},
		{Name: "ioperm_off", Kind: "ioperm", Num: 0},
		{Name: "sethostname_same", Kind: "sethostname_same"},
	}
	var specs []opSpec
	for _, r := range refused {
		specs = append(specs, r.op)
	}
	// Outside first: the key calls find root's user keyring there.
	out, outPID := runOps(t, "", append(specs, benign...))
	res, pid := runOps(t, sb.root, append(specs, benign...))
	for _, r := range refused {
		if got := out[r.op.Name]; got == "EPERM" {
			t.Errorf("outside: %s: EPERM, want the kernel's own answer", r.op.Name)
		}
		// A keyring search the key permission refuses reads as "no
		// such key" (the kernel skips keyrings it may not search).
		got := res[r.op.Name]
		if got != "EPERM" && !(got == "ENOKEY" && strings.HasSuffix(r.msg, "key_alloc")) {
			t.Errorf("sandbox: %s: %s, want EPERM (outside: %s)", r.op.Name, got, out[r.op.Name])
			continue
		}
		ev := waitEvent(t, r.op.Name, func(ev audit.Event) bool {
			return ev.Kind == audit.KindOperation && ev.Process.TGID == uint32(pid) && ev.Message == r.msg
		})
		if ev.Kind != "" && (ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t) || ev.Sandbox.CgroupID != sb.rootID) {
			t.Errorf("%s: verdict %s mechanism %s sandbox %d", r.op.Name, ev.Verdict, ev.Mechanism, ev.Sandbox.CgroupID)
		}
		t.Logf("%s: outside %s, sandbox %s (%s)", r.op.Name, out[r.op.Name], got, r.msg)
	}
	for _, b := range benign {
		if res[b.Name] != "OK" || out[b.Name] != "OK" {
			t.Errorf("benign %s: sandbox %s, outside %s, want OK", b.Name, res[b.Name], out[b.Name])
		}
	}
	for _, ev := range eventsFrom(outPID) {
		t.Errorf("outside the sandbox: event %s %q", ev.Kind, ev.Message)
	}

	// No check at all: killed at the syscall's entry, one process each.
	// io_uring_setup: refused with EPERM where the ring gets a secure
	// anonymous inode (inode_init_security_anon), else killed on return.
	for _, k := range []struct {
		op  opSpec
		msg string
	}{
		{opSpec{Name: "personality_query", Kind: "personality_query"}, "personality: kernel_interface"},
		{opSpec{Name: "name_to_handle_at", Kind: "name_to_handle_at"}, "name_to_handle_at: kernel_interface"},
		{opSpec{Name: "io_uring_setup", Kind: "io_uring_setup"}, "io_uring_setup: io_uring_setup"},
	} {
		if got, _ := runOps(t, "", []opSpec{k.op}); got[k.op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", k.op.Name, got[k.op.Name])
		}
		pid, results := runOpsKilled(t, sb.root, k.op)
		if k.op.Kind == "io_uring_setup" && strings.Contains(results, `"res":"EPERM"`) {
			ev := waitEvent(t, k.op.Name, func(ev audit.Event) bool {
				return ev.Kind == audit.KindOperation && ev.Process.TGID == uint32(pid) && ev.Message == "io_uring_setup"
			})
			if ev.Kind != "" && (ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t)) {
				t.Errorf("%s: verdict %s mechanism %s", k.op.Name, ev.Verdict, ev.Mechanism)
			}
			t.Logf("%s: outside OK, sandbox EPERM (inode_init_security_anon: the ring's secure anonymous inode)", k.op.Name)
			continue
		}
		if results != "" {
			t.Errorf("sandbox: %s: not killed, reported %s", k.op.Name, results)
			continue
		}
		ev := waitEvent(t, k.op.Name, func(ev audit.Event) bool {
			return ev.Kind == audit.KindOperation && ev.Process.TGID == uint32(pid) && ev.Message == k.msg
		})
		if ev.Kind != "" && (ev.Verdict != audit.VerdictKilled || ev.Mechanism != lsmrules.MechFentry) {
			t.Errorf("%s: verdict %s mechanism %s, want killed by %s", k.op.Name, ev.Verdict, ev.Mechanism, lsmrules.MechFentry)
		}
		t.Logf("%s: outside OK, sandbox killed in the syscall (%s)", k.op.Name, k.msg)
	}
}

// runOpsKilled runs op in a child in cgPath that must die of SIGKILL
// before it reports; it returns the child's pid and whatever it reported.
func runOpsKilled(t *testing.T, cgPath string, op opSpec) (int, string) {
	t.Helper()
	b, err := json.Marshal([]opSpec{op})
	if err != nil {
		t.Fatal(err)
	}
	cmd := enforcetest.SelfCommand(t, cgPath, "TestLSMHelper", "ops", helperEnv+"="+string(b))
	outb, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return cmd.Process.Pid, "exit without a signal: " + string(outb)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return cmd.Process.Pid, "exit " + ee.String() + ": " + string(outb)
	}
	return cmd.Process.Pid, ""
}
