package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Reloader keeps the current policy of a file and replaces it when the file
// changes or on request (SIGHUP). A new policy that fails to load is
// refused: the error is reported and the current policy stays in force, so
// enforcement never runs without a valid policy.
type Reloader struct {
	path string
	cur  atomic.Pointer[Policy]
	mu   sync.Mutex // serialises reloads

	// OnReload is called after a changed, valid policy became current.
	OnReload func(old, new *Policy)
	// OnError is called when a reload was refused; the old policy stays.
	OnError func(err error)
	// Signals, when set, triggers a reload on every value received (pass a
	// channel given to signal.Notify for SIGHUP).
	Signals <-chan os.Signal
	// Debounce waits this long after a file event for further events
	// before reloading, so an editor's several writes make one reload;
	// 0 means 100 ms.
	Debounce time.Duration
	// Poll, when positive, also checks the file this often (for
	// filesystems without inotify, such as some network mounts).
	Poll time.Duration
}

// NewReloader loads the policy at path and returns a reloader holding it.
func NewReloader(path string) (*Reloader, error) {
	p, err := Load(path)
	if err != nil {
		return nil, err
	}
	r := &Reloader{path: path}
	r.cur.Store(p)
	return r, nil
}

// Current returns the policy in force. It is safe to call from any
// goroutine; the returned policy must not be modified.
func (r *Reloader) Current() *Policy { return r.cur.Load() }

// Reload reads the file again. It returns the policy in force afterwards
// and whether it changed. On error the old policy stays in force and is
// returned with the error; OnError is not called (the caller has the error).
func (r *Reloader) Reload() (*Policy, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	data, err := os.ReadFile(r.path)
	if err != nil {
		return old, false, fmt.Errorf("reload policy: %w (keeping the policy loaded from %s)", err, shortHash(old))
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) == old.Hash {
		return old, false, nil
	}
	p, err := Parse(r.path, data)
	if err != nil {
		return old, false, fmt.Errorf("reload policy: refused, keeping the policy with hash %s: %w", shortHash(old), err)
	}
	r.cur.Store(p)
	if r.OnReload != nil {
		r.OnReload(old, p)
	}
	return p, true, nil
}

func shortHash(p *Policy) string {
	if len(p.Hash) >= 12 {
		return p.Hash[:12]
	}
	return p.Hash
}

// Run watches the file (its directory, so editors' rename-over and
// Kubernetes ConfigMap symlink swaps are seen) and reloads on change, on
// Signals and on Poll ticks, until ctx ends. Refused reloads go to OnError.
func (r *Reloader) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch policy: %w", err)
	}
	defer fw.Close()
	dir := filepath.Dir(r.path)
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("watch policy directory %s: %w", dir, err)
	}
	debounce := r.Debounce
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	var poll <-chan time.Time
	if r.Poll > 0 {
		t := time.NewTicker(r.Poll)
		defer t.Stop()
		poll = t.C
	}
	sig := r.Signals
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	reload := func() {
		if _, _, err := r.Reload(); err != nil && r.OnError != nil {
			r.OnError(err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-fw.Events:
			if !ok {
				return fmt.Errorf("watch policy: watcher closed")
			}
			// Any change in the directory may be the file (a symlink
			// target swap changes other names); the hash check makes
			// unrelated events free.
			_ = ev
			timer.Reset(debounce)
		case err, ok := <-fw.Errors:
			if !ok {
				return fmt.Errorf("watch policy: watcher closed")
			}
			if r.OnError != nil {
				r.OnError(fmt.Errorf("watch policy: %w", err))
			}
			timer.Reset(debounce)
		case <-timer.C:
			reload()
		case <-poll:
			reload()
		case _, ok := <-sig:
			if !ok {
				sig = nil
				continue
			}
			reload()
		}
	}
}
