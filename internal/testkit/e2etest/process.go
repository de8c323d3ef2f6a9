package e2etest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long Stop waits for the agent before it kills it.
const stopGrace = 30 * time.Second

// Process is an agent (or any long-running helper) a test started. One
// goroutine waits for it, so Exited answers at any time; Stop ends it.
type Process struct {
	Cmd *exec.Cmd
	// Log is what the process wrote where Start was told to collect it.
	Log *SafeBuffer

	done chan struct{}
}

// Start starts cmd. Unless the caller set them, its stdout and stderr go to
// Log. The process is stopped with SIGTERM at cleanup if still running
// (registered after New, so before the world's cgroups and pins go).
func Start(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{Cmd: cmd, Log: &SafeBuffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = p.Log
	}
	if cmd.Stderr == nil {
		cmd.Stderr = p.Log
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.Stop(syscall.SIGTERM) {
			t.Errorf("%s did not stop on SIGTERM in %v:\n%s", cmd.Path, stopGrace, p.Log)
		}
	})
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Exited says the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop sends sig (nil: none), then SIGCONT (a stopped process acts on sig
// once continued), and waits for the process to end; after 30 s it kills
// it and says so (false). Stopping an ended process returns true.
func (p *Process) Stop(sig os.Signal) bool {
	if p.Exited() {
		return true
	}
	if sig != nil {
		p.Cmd.Process.Signal(sig)
	}
	p.Cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
		return true
	case <-time.After(stopGrace):
		p.Kill()
		return false
	}
}

// Kill kills the process and waits for it.
func (p *Process) Kill() {
	p.Cmd.Process.Kill()
	<-p.done
}

// WaitReady polls ready every 100 ms until it returns true. It fails when
// the process ends first or timeout passes; on a timeout it first asks
// the process for a goroutine dump (SIGQUIT, which a Go program answers on
// stderr) and kills it, so the error shows where it hung.
func (p *Process) WaitReady(timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready:\n%s", p.Cmd.Path, p.Log)
		}
		if time.Now().After(deadline) {
			p.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				p.Kill()
			}
			return fmt.Errorf("%s not ready after %v:\n%s", p.Cmd.Path, timeout, p.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// SafeBuffer is a bytes.Buffer that a process writes while the test
// reads it.
type SafeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SafeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *SafeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
