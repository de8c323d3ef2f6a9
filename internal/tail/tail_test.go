package tail

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

func waitClients(t *testing.T, s *Server, n int) {
	t.Helper()
	for i := 0; i < 200 && s.Clients() != n; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if s.Clients() != n {
		t.Fatalf("clients = %d, want %d", s.Clients(), n)
	}
}

func TestFilteredStream(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.sock")
	s, err := Listen(path, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := Dial(path, Filter{Kinds: []audit.Kind{audit.KindFileOpen}, Verdicts: []audit.Verdict{audit.VerdictDenied}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitClients(t, s, 1)
	s.Notify(audit.Event{Kind: audit.KindExec, Verdict: audit.VerdictAllowed})
	s.Notify(audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded})
	s.Notify(audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictDenied, File: &audit.FileDetail{Path: "/etc/shadow"}})
	m, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	if m.Event == nil || m.Event.File == nil || m.Event.File.Path != "/etc/shadow" {
		t.Fatalf("first message %+v, want the denied /etc/shadow open", m)
	}
}

func TestSlowClientDroppedWithoutBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.sock")
	s, err := Listen(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := Dial(path, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitClients(t, s, 1)
	// The client reads nothing: Notify must still return promptly.
	big := make([]string, 2000)
	for i := range big {
		big[i] = "argument-that-fills-the-socket-buffer"
	}
	start := time.Now()
	for i := 0; i < 20000; i++ {
		s.Notify(audit.Event{Kind: audit.KindExec, Process: audit.Process{Args: big}})
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Notify blocked on a slow client for %v", d)
	}
	if s.DroppedClients() != 1 {
		t.Fatalf("dropped clients = %d, want 1", s.DroppedClients())
	}
	// The client eventually sees the notice after the events it got.
	for {
		m, err := st.Next()
		if err != nil {
			t.Fatalf("stream ended without a drop notice: %v", err)
		}
		if m.Notice != "" {
			break
		}
	}
}

func TestDialNoAgent(t *testing.T) {
	_, err := Dial(filepath.Join(t.TempDir(), "none.sock"), Filter{})
	if !errors.Is(err, ErrAgentNotRunning) {
		t.Fatalf("err = %v, want ErrAgentNotRunning", err)
	}
}
