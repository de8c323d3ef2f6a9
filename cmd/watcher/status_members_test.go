package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/control"
)

// Pod and container names come from labels anyone creating a container
// sets: printMembers escapes them, and prints nothing without members.
func TestPrintMembers(t *testing.T) {
	var b bytes.Buffer
	printMembers(&b, &control.Status{Sandboxes: []control.SandboxStatus{{Name: "plain"}}})
	if b.Len() != 0 {
		t.Fatalf("members table without members: %q", b.String())
	}
	printMembers(&b, &control.Status{Sandboxes: []control.SandboxStatus{{Name: "ai", Member: map[string]string{
		"container.id": "0123456789abcdef0123", "k8s.pod.name": "coder-0\x1b[2J", "k8s.namespace.name": "agents", "k8s.container.name": "agent"}}}})
	out := b.String()
	if strings.Contains(out, "\x1b") || !strings.Contains(out, "pod agents/coder-0") || !strings.Contains(out, "0123456789ab") ||
		strings.Contains(out, "0123456789abc") {
		t.Fatalf("members table:\n%q", out)
	}
}
