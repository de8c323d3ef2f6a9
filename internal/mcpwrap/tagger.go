package mcpwrap

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Tagger moves the server's processes into a leaf cgroup of their own for
// the calls in flight, so that every kernel event of the server carries
// (through the leaf's label) the call it happened in: LABEL.call-N while
// call N runs alone, LABEL.calls-N.M while calls overlap (the events say
// so: they could be either's), and the session leaf between calls. The
// leaves are siblings below the sandbox's exec cgroup, named as `watcher
// exec` names its leaves, so the agent labels their events the same way.
type Tagger struct {
	parent  string // the sandbox's exec cgroup
	label   string // the session's label
	mu      sync.Mutex
	session string // the session leaf (launch's)
	cur     string // where the processes are now
	flight  map[int]bool
}

// NewTagger tags below parent for the session label.
func NewTagger(parent, label string) *Tagger {
	return &Tagger{parent: parent, label: label, flight: map[int]bool{}}
}

// SetLeaf is the session's leaf cgroup, once the server is in it.
func (t *Tagger) SetLeaf(leaf string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.session, t.cur = leaf, leaf
}

var labelChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// CallLabel is the label the events of call seq alone carry.
func (t *Tagger) CallLabel(seq int) string { return t.labelFor([]int{seq}) }

// SessionLabel is the label of the events between calls.
func (t *Tagger) SessionLabel() string { return cleanLabel(t.label) }

func (t *Tagger) labelFor(seqs []int) string {
	if len(seqs) == 0 {
		return cleanLabel(t.label)
	}
	parts := make([]string, len(seqs))
	for i, s := range seqs {
		parts[i] = strconv.Itoa(s)
	}
	kind := ".call-"
	if len(seqs) > 1 {
		kind = ".calls-"
	}
	return cleanLabel(t.label + kind + strings.Join(parts, "."))
}

func cleanLabel(l string) string {
	l = labelChars.ReplaceAllString(l, "_")
	if len(l) > 64 {
		l = l[:64]
	}
	return l
}

// Begin moves the server into the leaf of the calls in flight with seq;
// it returns the label its events carry from now on.
func (t *Tagger) Begin(seq int) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flight[seq] = true
	return t.moveLocked()
}

// End moves the server on once call seq returned.
func (t *Tagger) End(seq int) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.flight, seq)
	return t.moveLocked()
}

// Close moves the server back to its session leaf (launch waits for and
// removes that one).
func (t *Tagger) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flight = map[int]bool{}
	_, err := t.moveLocked()
	return err
}

func (t *Tagger) moveLocked() (string, error) {
	var seqs []int
	for s := range t.flight {
		seqs = append(seqs, s)
	}
	sort.Ints(seqs)
	label := t.labelFor(seqs)
	if t.session == "" {
		return label, errors.New("tagger: the server has no leaf cgroup yet")
	}
	target := t.session
	if len(seqs) > 0 {
		b := make([]byte, 4)
		rand.Read(b)
		target = filepath.Join(t.parent, "exec-"+label+"-"+hex.EncodeToString(b))
		if err := os.Mkdir(target, 0o755); err != nil {
			return label, fmt.Errorf("tagger: %w", err)
		}
	}
	if target == t.cur {
		return label, nil
	}
	err := movePids(t.cur, target)
	old := t.cur
	t.cur = target
	if old != t.session {
		// Empty now (rmdir refuses otherwise, and keeps it).
		os.Remove(old)
	}
	return label, err
}

// movePids moves every process of cgroup from into to. A process forked
// while the list was read shows up on the next round.
func movePids(from, to string) error {
	for round := 0; round < 50; round++ {
		data, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("tagger: %w", err)
		}
		pids := strings.Fields(string(data))
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			// A process that exited meanwhile: ESRCH, nothing to move.
			os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(pid), 0)
		}
	}
	return fmt.Errorf("tagger: processes of %s kept appearing; some stay there", from)
}
