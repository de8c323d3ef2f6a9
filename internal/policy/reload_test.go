package policy

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const goodPolicy = `version: 1
sandboxes:
  - name: a
    select: {cgroups: [/a]}
    preset: restricted
    escape:
      threshold: %s
`

func policyText(threshold string) string { return strings.Replace(goodPolicy, "%s", threshold, 1) }

// atomicWrite replaces the file the way editors and config managers do:
// write a temporary file and rename it over the old one.
func atomicWrite(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestReloadKeepsOldPolicyOnBadInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyText("50")), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := NewReloader(path)
	if err != nil {
		t.Fatal(err)
	}
	first := r.Current()

	// Unchanged content: no change reported.
	if p, changed, err := r.Reload(); err != nil || changed || p != first {
		t.Fatalf("unchanged reload: %v %v", changed, err)
	}
	// A bad policy is refused with its line and the old one stays.
	os.WriteFile(path, []byte(policyText("50")+"    bogus: true\n"), 0o600)
	p, changed, err := r.Reload()
	if err == nil || changed || p != first || r.Current() != first {
		t.Fatalf("bad policy: changed=%v err=%v", changed, err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line != 8 || fe.Field != "sandboxes[0].bogus" {
		t.Fatalf("refusal does not locate the problem: %v", err)
	}
	// A missing file is refused too.
	os.Remove(path)
	if _, _, err := r.Reload(); err == nil || r.Current() != first {
		t.Fatalf("missing file: %v", err)
	}
	// A good change is taken.
	os.WriteFile(path, []byte(policyText("70")), 0o600)
	p, changed, err = r.Reload()
	if err != nil || !changed || p.Sandbox("a").Escape.Threshold != 70 || r.Current() != p {
		t.Fatalf("good change: %v %v", changed, err)
	}
}

type reloadEvents struct {
	reloads chan *Policy
	errs    chan error
}

func (e *reloadEvents) waitReload(t *testing.T) *Policy {
	t.Helper()
	select {
	case p := <-e.reloads:
		return p
	case err := <-e.errs:
		t.Fatalf("expected a reload, got error %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no reload")
	}
	return nil
}

func (e *reloadEvents) waitError(t *testing.T) error {
	t.Helper()
	select {
	case p := <-e.reloads:
		t.Fatalf("expected a refusal, got a reload to %s", p.Hash)
	case err := <-e.errs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal reported")
	}
	return nil
}

func TestReloaderWatchesFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	os.WriteFile(path, []byte(policyText("50")), 0o600)
	r, err := NewReloader(path)
	if err != nil {
		t.Fatal(err)
	}
	ev := &reloadEvents{reloads: make(chan *Policy, 10), errs: make(chan error, 10)}
	r.OnReload = func(old, new *Policy) {
		if old == new {
			t.Error("OnReload with the same policy")
		}
		ev.reloads <- new
	}
	r.OnError = func(err error) { ev.errs <- err }
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	r.Signals = hup
	r.Debounce = 20 * time.Millisecond

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	time.Sleep(50 * time.Millisecond) // let Run add its watch

	// A file change is picked up (rename over the file, as editors do).
	atomicWrite(t, path, policyText("60"))
	if p := ev.waitReload(t); p.Sandbox("a").Escape.Threshold != 60 {
		t.Fatalf("threshold %v after reload", p.Sandbox("a").Escape.Threshold)
	}
	good := r.Current()

	// A broken policy is refused; the old one stays in force.
	atomicWrite(t, path, policyText("60")+"    egress:\n      allow:\n        - cidr: 300.1.1.0/24\n")
	err = ev.waitError(t)
	if !strings.Contains(err.Error(), path+":10:") || !strings.Contains(err.Error(), "cidr") {
		t.Fatalf("refusal %v does not name the line and field", err)
	}
	if r.Current() != good {
		t.Fatal("bad policy replaced the good one")
	}

}

func TestReloaderSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(path, []byte(policyText("50")), 0o600)
	r, err := NewReloader(path)
	if err != nil {
		t.Fatal(err)
	}
	ev := &reloadEvents{reloads: make(chan *Policy, 10), errs: make(chan error, 10)}
	r.OnReload = func(old, new *Policy) { ev.reloads <- new }
	r.OnError = func(err error) { ev.errs <- err }
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	r.Signals = hup
	// File events wait far longer than the test: only SIGHUP reloads here.
	r.Debounce = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	os.WriteFile(path, []byte(policyText("80")+"    mode: yes-please\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	if err := ev.waitError(t); !strings.Contains(err.Error(), path+":8:") {
		t.Fatalf("refusal %v does not name the line", err)
	}
	if r.Current().Sandbox("a").Escape.Threshold != 50 {
		t.Fatal("refused policy took effect")
	}
	os.WriteFile(path, []byte(policyText("80")), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	p := ev.waitReload(t)
	if p.Sandbox("a").Escape.Threshold != 80 || r.Current() != p {
		t.Fatalf("threshold %v after SIGHUP", p.Sandbox("a").Escape.Threshold)
	}
	// Another SIGHUP with the same content changes nothing.
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	select {
	case p := <-ev.reloads:
		t.Fatalf("second reload for the same content: %s", p.Hash)
	case err := <-ev.errs:
		t.Fatalf("unexpected error %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}
