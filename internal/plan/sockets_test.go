package plan

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// advPolicy is a restricted sandbox with a protected directory.
const advPolicy = `version: 1
sandboxes:
  - name: adv
    select: {cgroups: [/x]}
    preset: restricted
    workspace: [/var/lib/ws]
    files:
      - {name: adv-secrets, path: /var/lib/sec/, match: prefix, access: any, action: block}
`

// TestIA32Decision: where every rule has an LSM or cgroup hook, 32-bit
// syscalls run and are judged like 64-bit ones (the backstop's compat
// category is off); where file rules fall to the backstop (keyed on x86_64
// numbers) they are killed at entry, with the reason in the layer table;
// ia32_syscalls: block kills them on every host.
func TestIA32Decision(t *testing.T) {
	line := func(plan *Plan) control.Layer {
		for _, l := range plan.Layers {
			if strings.HasSuffix(l.Rule, ": ia32_syscalls") {
				return l
			}
		}
		t.Fatal("no ia32_syscalls line")
		return control.Layer{}
	}
	plan, _ := compile(t, parse(t, advPolicy), Env{LSM: lsmEnv(t, nil)})
	if plan.Backstop.For(1).Compat.Action != rules.ActionAllow {
		t.Errorf("full LSM: compat %+v, want allowed", plan.Backstop.For(1).Compat)
	}
	if l := line(plan); l.Mechanism != MechNone || !strings.Contains(l.Note, "judged like 64-bit calls") {
		t.Errorf("full LSM: %+v", l)
	}
	plan, _ = compile(t, parse(t, advPolicy), Env{LSM: lsmEnv(t, errRefused)})
	if plan.Backstop.For(1).Compat.Action != rules.ActionKill {
		t.Errorf("no LSM: compat %+v, want kill", plan.Backstop.For(1).Compat)
	}
	if l := line(plan); l.Mechanism != MechKill || !strings.Contains(l.Note, "file rules judged at open by the backstop") {
		t.Errorf("no LSM: %+v", l)
	}
	p := parse(t, strings.Replace(advPolicy, "    files:", "    operations: {ia32_syscalls: block}\n    files:", 1))
	plan, _ = compile(t, p, Env{LSM: lsmEnv(t, nil)})
	if plan.Backstop.For(1).Compat.Action != rules.ActionKill {
		t.Errorf("ia32_syscalls block: compat %+v, want kill", plan.Backstop.For(1).Compat)
	}
	if l := line(plan); l.Mechanism != MechKill || !strings.Contains(l.Note, "every 32-bit syscall") {
		t.Errorf("ia32_syscalls block: %+v", l)
	}
}

// TestLSMSocketsAndClones: with the LSM socket, unix and task_alloc hooks,
// AF_PACKET and exec's socket list are the LSM's (no backstop packet
// kill), unix peers are judged on the workspace paths, CLONE_FILES is
// refused; without them the backstop keeps the AF_PACKET kill.
func TestLSMSocketsAndClones(t *testing.T) {
	plan, _ := compile(t, parse(t, advPolicy), Env{LSM: lsmEnv(t, nil)})
	if plan.Backstop.For(1).PacketSocket.Action != rules.ActionAllow {
		t.Errorf("backstop packet kill %+v although lsm socket_create runs", plan.Backstop.For(1).PacketSocket)
	}
	var lr lsmrules.Rules
	for _, r := range plan.LSM {
		lr = r
	}
	if !slices.ContainsFunc(lr.Sockets, func(s lsmrules.SocketRule) bool {
		return s.Family == unix.AF_PACKET && s.Action == rules.ActionBlock
	}) || !slices.ContainsFunc(lr.Sockets, func(s lsmrules.SocketRule) bool { return s.Family == unix.AF_VSOCK }) {
		t.Errorf("lsm socket rules %+v lack AF_PACKET or AF_VSOCK", lr.Sockets)
	}
	if lr.Ops[lsmrules.OpUnixConnect].Action != rules.ActionBlock || !slices.Contains(lr.UnixPaths, "/var/lib/ws/") {
		t.Errorf("unix peers: op %+v paths %v", lr.Ops[lsmrules.OpUnixConnect], lr.UnixPaths)
	}
	if lr.Ops[lsmrules.OpCloneFiles].Action != rules.ActionBlock {
		t.Errorf("clone files: %+v", lr.Ops[lsmrules.OpCloneFiles])
	}
	if plan.Backstop.For(1).UnixPeer.Action != rules.ActionAllow || len(plan.Backstop.UnixPaths) != 0 {
		t.Errorf("backstop unix peers %+v %v although the lsm unix hooks run", plan.Backstop.For(1).UnixPeer, plan.Backstop.UnixPaths)
	}
	plan, _ = compile(t, parse(t, advPolicy), Env{LSM: lsmEnv(t, errRefused)})
	if plan.Backstop.For(1).PacketSocket.Action != rules.ActionKill {
		t.Errorf("no LSM: backstop packet %+v, want kill", plan.Backstop.For(1).PacketSocket)
	}
	// Without the LSM unix hooks the backstop judges the peer connect(2)
	// reached, on the same paths, and says it acts after the fact.
	if plan.Backstop.For(1).UnixPeer.Action != rules.ActionKill || len(plan.Backstop.UnixPaths) != 1 ||
		plan.Backstop.UnixPaths[0].SandboxID != plan.SandboxIDs["adv"] || !slices.Contains(plan.Backstop.UnixPaths[0].Paths, "/var/lib/ws/") {
		t.Errorf("no LSM: backstop unix peers %+v %+v", plan.Backstop.For(1).UnixPeer, plan.Backstop.UnixPaths)
	}
	var peers control.Layer
	for _, l := range plan.Layers {
		if strings.HasSuffix(l.Rule, "egress: unix peers") {
			peers = l
		}
	}
	if peers.Mechanism != MechKill || !strings.Contains(peers.Note, "after the fact") {
		t.Errorf("no LSM: unix peers layer line %+v", peers)
	}
}
