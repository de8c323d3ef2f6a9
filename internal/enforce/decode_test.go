package enforce

import (
	"testing"
	"unsafe"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestDecodeIsPure: the reader turns a kernel record into an event with
// the ids the kernel wrote and names nothing (the pipeline's enrich stage
// does, once); a rule id reads "rule-N" until then. Refusals that differ
// only in their rule or sandbox id are not folded into one burst.
func TestDecodeIsPure(t *testing.T) {
	r := (*Engine)(nil).NewReader(ReaderOptions{QueueSize: 8})
	const kind = 3
	r.Register(kind, audit.KindFileOpen, "kill", func(raw []byte, ev *audit.Event) error { return nil })
	record := func(sandbox, rule uint32) []byte {
		h := EventHeader{Kind: kind, SandboxId: sandbox, RuleId: rule, SandboxCg: 4242, Tgid: 7, Pid: 7, Verdict: 2}
		copy(h.Comm[:], "cat")
		return unsafe.Slice((*byte)(unsafe.Pointer(&h)), EventHeaderSize)
	}
	r.handle(record(2, 31))
	r.handle(record(2, 32))          // another rule: its own record
	r.handle(record(3, 31))          // another sandbox id: its own record
	r.handle(record(0, 0))           // no sandbox, no rule
	if got := len(r.out); got != 4 { // batches of one: each alert is handed over at once
		t.Fatalf("%d events delivered, want 4 (ids differ, nothing to fold)", got)
	}
	want := []struct {
		sandbox, rule uint32
		name          string
	}{{2, 31, "rule-31"}, {2, 32, "rule-32"}, {3, 31, "rule-31"}, {0, 0, ""}}
	for _, w := range want {
		ev := (<-r.out)[0] // an alert is handed over at once, in its own batch
		if ev.Sandbox.ID != w.sandbox || ev.RuleID != w.rule || ev.Rule != w.name || ev.Sandbox.Name != "" ||
			ev.Sandbox.CgroupID != 4242 || ev.Process.Comm != "cat" || ev.Verdict == audit.VerdictAllowed {
			t.Errorf("decoded %+v, want sandbox id %d, rule id %d named %q, no sandbox name", ev, w.sandbox, w.rule, w.name)
		}
	}
}
