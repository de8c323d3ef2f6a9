package backstop_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// TestRulesPerSandbox: syscall and category rules are each sandbox's own.
// Sandbox "block" kills chroot (a plain rule, also by its i386 number),
// io_uring_setup, socket(AF_PACKET) (categories at sys_enter) and a
// write-open of a cgroupfs file (a category at open's return); its
// neighbour "ops",
// whose set allows them, runs the same operations unharmed (before the
// fix, one host-wide action per syscall killed it too); "trial", in
// record mode with block's rules and 32-bit calls refused, gets recorded
// events and survives. Every sandbox listed also overrides the
// every-sandbox set (DefaultRules, which kills chroot and io_uring). A
// reload that swaps the sets flips the outcomes and leaves no stale map
// entry; a sandbox dropped from the sets has no entry left.
func TestRulesPerSandbox(t *testing.T) {
	const chrootID, uringID, packetID, compatID, cgwriteID = 101, 102, 103, 104, 105
	kill := func(id uint32) backstoprules.Rule { return backstoprules.Rule{Action: enforce.ActionKill, ID: id} }
	blocks := backstoprules.SandboxRules{
		Syscalls: []backstoprules.SyscallRule{{Name: "chroot", Rule: kill(chrootID)}},
		IOUring:  kill(uringID), PacketSocket: kill(packetID),
		CgroupWrite: kill(cgwriteID), // judged at open's return
	}
	blocks32 := blocks
	blocks32.Compat = kill(compatID)
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.Sandboxes = map[uint32]backstoprules.SandboxRules{1: blocks, 2: {}, 3: blocks32}
		// DefaultRules' path rule on writes below /sys/ would kill the
		// cgroupfs write-open in every sandbox: the category decides here.
		r.Paths = slices.DeleteFunc(r.Paths, func(p backstoprules.PathRule) bool { return p.Path == "/sys/" })
	})
	ops := enforcetest.Cgroup(t, "ops")
	opsCG, err := f.eng.AddSandbox(ops, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	trial := enforcetest.Cgroup(t, "trial")
	trialCG, err := f.eng.AddSandbox(trial, 3, enforce.SandboxRecordOnly)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "ring-data")
	if err := os.WriteFile(data, []byte("uring-ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type op struct {
		row  string // the subtest's name
		name string
		args []string
		rule uint32
		ok   string // output of a run that survives
		ia32 bool   // an i386 call through int 0x80
	}
	chroot := op{"chroot", "chroot", nil, chrootID, "result: <nil>", false}
	uring := op{"uring", "uring", []string{"", data}, uringID, "uring read: uring-ok", false}
	packet := op{"packet", "socket", []string{"packet"}, packetID, "result: <nil>", false}
	chroot32 := op{"chroot32", "int80", []string{"61", "/"}, chrootID, "result: <nil>", true}
	getpid32 := op{"getpid32", "int80", []string{"20"}, compatID, "result: <nil>", true}
	cgwrite := op{"cgwrite", "openwrite", []string{filepath.Join(f.outside, "cgroup.procs")}, cgwriteID, "result: <nil>", false}
	// row runs check as a subtest, skipped for an i386 op where this
	// kernel runs no 32-bit calls.
	row := func(t *testing.T, name string, o op, check func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if o.ia32 {
				need32(t)
			}
			check(t)
		})
	}

	killed := func(t *testing.T, cg string, sandboxCG uint64, o op) {
		t.Helper()
		r := f.run(t, cg, o.name, o.args...)
		if !r.killed {
			t.Fatalf("%s %v not killed in its sandbox: err %v\n%s", o.name, o.args, r.err, r.out)
		}
		ev, ok := f.waitEvent(t, r.pid, func(ev audit.Event) bool { return ev.Verdict == audit.VerdictKilled })
		if !ok {
			t.Fatalf("%s %v: no killed event; events %+v", o.name, o.args, f.eventsOf(r.pid))
		}
		if ev.Sandbox.CgroupID != sandboxCG || ev.Rule != fmt.Sprintf("rule-%d", o.rule) {
			t.Errorf("%s %v: event sandbox %d rule %q, want %d rule-%d", o.name, o.args, ev.Sandbox.CgroupID, ev.Rule, sandboxCG, o.rule)
		}
	}
	survives := func(t *testing.T, cg string, o op) {
		t.Helper()
		r := f.run(t, cg, o.name, o.args...)
		if r.killed || !strings.Contains(r.out, o.ok) {
			t.Fatalf("%s %v in a sandbox allowing it: killed=%v err=%v\n%s", o.name, o.args, r.killed, r.err, r.out)
		}
		if evs := f.eventsOf(r.pid); len(evs) != 0 {
			t.Errorf("%s %v allowed, yet events %+v", o.name, o.args, evs)
		}
	}
	recorded := func(t *testing.T, cg string, sandboxCG uint64, o op) {
		t.Helper()
		r := f.run(t, cg, o.name, o.args...)
		if r.killed || !strings.Contains(r.out, o.ok) {
			t.Fatalf("%s %v in a record-mode sandbox: killed=%v err=%v\n%s", o.name, o.args, r.killed, r.err, r.out)
		}
		ev, ok := f.waitEvent(t, r.pid, func(ev audit.Event) bool { return ev.Verdict == audit.VerdictRecorded })
		if !ok {
			t.Fatalf("%s %v: no recorded event; events %+v", o.name, o.args, f.eventsOf(r.pid))
		}
		if ev.Sandbox.CgroupID != sandboxCG || ev.Rule != fmt.Sprintf("rule-%d", o.rule) {
			t.Errorf("%s %v: event sandbox %d rule %q, want %d rule-%d", o.name, o.args, ev.Sandbox.CgroupID, ev.Rule, sandboxCG, o.rule)
		}
	}

	t.Run("first", func(t *testing.T) {
		for _, o := range []op{chroot, uring, packet, chroot32, cgwrite} {
			row(t, o.row, o, func(t *testing.T) {
				killed(t, f.sandbox, f.sbID, o)
				killed(t, f.nested, f.sbID, o) // a nested cgroup is its sandbox's
				survives(t, ops, o)
			})
		}
		// block lets 32-bit calls run (its i386 chroot rule decides).
		row(t, "getpid32_allowed", getpid32, func(t *testing.T) {
			survives(t, f.sandbox, getpid32)
			survives(t, ops, getpid32)
		})
		for _, o := range []op{chroot, getpid32} {
			row(t, o.row+"_recorded", o, func(t *testing.T) { recorded(t, trial, trialCG, o) })
		}
	})
	entries, err := f.bs.SandboxRuleEntries()
	if err != nil {
		t.Fatal(err)
	}
	every := entries[0]
	if every[backstop.SBRSyscall|161].Action != enforce.ActionKill {
		t.Fatalf("every-sandbox set lacks DefaultRules' chroot: %+v", every)
	}
	// ops' set is empty: an allow entry for each every-sandbox rule.
	if len(entries[2]) != len(every) {
		t.Errorf("ops: %d entries, want %d allow entries: %+v", len(entries[2]), len(every), entries[2])
	}

	// Reload: ops gets the blocking set (and refuses 32-bit calls), block
	// the empty one; trial leaves the per-sandbox sets.
	rules := f.rules
	rules.Sandboxes = map[uint32]backstoprules.SandboxRules{1: {}, 2: blocks32}
	if err := f.bs.SetRules(rules); err != nil {
		t.Fatal(err)
	}
	t.Run("swapped", func(t *testing.T) {
		for _, o := range []op{chroot, uring, packet, cgwrite} {
			row(t, o.row, o, func(t *testing.T) {
				killed(t, ops, opsCG, o)
				survives(t, f.sandbox, o)
			})
		}
		// compat refused: killed before its own rule
		row(t, "getpid32_killed", getpid32, func(t *testing.T) { killed(t, ops, opsCG, getpid32) })
		row(t, "chroot32_allowed", chroot32, func(t *testing.T) { survives(t, f.sandbox, chroot32) })
	})
	entries, err = f.bs.SandboxRuleEntries()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries[3]) != 0 {
		t.Errorf("trial left the sets, yet %d entries remain: %+v", len(entries[3]), entries[3])
	}
	for what, r := range entries[1] {
		if r.Action != enforce.ActionAllow {
			t.Errorf("block: stale entry %#x %+v after its set was emptied", what, r)
		}
		if _, ok := every[what]; !ok {
			t.Errorf("block: entry %#x overrides nothing", what)
		}
	}
	if len(entries[1]) != len(every) {
		t.Errorf("block: %d entries, want %d (one allow per every-sandbox rule)", len(entries[1]), len(every))
	}
	want := map[uint32]backstoprules.Rule{
		// No i386 numbers: its compat rule decides every 32-bit call.
		backstop.SBRSyscall | 161:                  kill(chrootID),
		backstop.SBRCategory | backstop.CatIOUring: kill(uringID),
		backstop.SBRCategory | backstop.CatPacket:  kill(packetID), backstop.SBRCategory | backstop.CatCompat: kill(compatID),
		backstop.SBRCategory | backstop.CatCgroupWrite: kill(cgwriteID),
	}
	for what, r := range entries[2] {
		if w, ok := want[what]; ok {
			if r != w {
				t.Errorf("ops: entry %#x %+v, want %+v", what, r, w)
			}
			continue
		}
		if r.Action != enforce.ActionAllow {
			t.Errorf("ops: unexpected entry %#x %+v", what, r)
		}
	}
	for what := range want {
		if _, ok := entries[2][what]; !ok {
			t.Errorf("ops: entry %#x missing", what)
		}
	}
}

// TestAdoptHostWideRules: an agent from before the per-sandbox rules left
// its actions in the host-wide arrays only (bs_sb_rules is new, so
// empty). A restarted agent that attaches before setting rules (the
// adopted set is in force) keeps enforcing them for every sandbox: Load
// copies them into the every-sandbox set, rule ids included.
func TestAdoptHostWideRules(t *testing.T) {
	f := newFixture(t, func(r *backstoprules.Rules) {
		*r = backstoprules.Rules{SandboxRules: backstoprules.SandboxRules{
			Syscalls:     []backstoprules.SyscallRule{{Name: "chroot", Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: 55}}},
			PacketSocket: backstoprules.Rule{Action: enforce.ActionKill, ID: 56},
		}}
	})
	if err := f.bs.ClearSandboxRules(); err != nil {
		t.Fatal(err)
	}
	f.bs.Close()
	again, err := enforce.Open(enforce.Options{PinDir: f.eng.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	b2, err := backstop.Load(again)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	entries, err := b2.SandboxRuleEntries()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]backstoprules.Rule{
		backstop.SBRSyscall | 161:                 {Action: enforce.ActionKill, ID: 55},
		backstop.SBRSyscall32 | 61:                {Action: enforce.ActionKill, ID: 55},
		backstop.SBRCategory | backstop.CatPacket: {Action: enforce.ActionKill, ID: 56},
	}
	if len(entries) != 1 || fmt.Sprint(entries[0]) != fmt.Sprint(want) {
		t.Fatalf("adopted entries %+v, want every-sandbox %+v", entries, want)
	}
	if err := b2.Attach(); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		row  string
		args []string
		ia32 bool // an i386 call through int 0x80
	}{{"chroot", []string{"chroot"}, false}, {"packet", []string{"socket", "packet"}, false}, {"chroot32", []string{"int80", "61", "/"}, true}} {
		t.Run(o.row, func(t *testing.T) {
			if o.ia32 {
				need32(t)
			}
			r := f.run(t, f.sandbox, o.args[0], o.args[1:]...)
			if !r.killed {
				t.Errorf("%v after adoption: not killed (err %v)\n%s", o.args, r.err, r.out)
			}
		})
	}
	r := f.run(t, f.sandbox, "socket", "udp")
	expectSurvived(t, r)
}
