package agent

import (
	"net"
	"path/filepath"
	"slices"
	"testing"
)

// TestProbeSocketsAbsent: the nscd paths glibc probes on every lookup are
// reported absent (left connectable by the planner) only while no socket
// exists there; a host socket at one of them (a running nscd, which
// resolves any name) keeps both refused.
func TestProbeSocketsAbsent(t *testing.T) {
	dir := t.TempDir()
	absent := []string{filepath.Join(dir, "var-run-nscd"), filepath.Join(dir, "run-nscd")}
	if got := absentSockets(absent); !slices.Equal(got, absent) {
		t.Errorf("no socket there: %v, want %v", got, absent)
	}
	ln, err := net.Listen("unix", absent[1])
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := absentSockets(absent); got != nil {
		t.Errorf("a socket listens at %s but %v are left connectable", absent[1], got)
	}
}
