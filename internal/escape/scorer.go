package escape

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// Config configures a Scorer. Per-sandbox thresholds and windows come from
// the policy through Limits.
type Config struct {
	// Threshold and Window apply to sandboxes Limits does not know.
	Threshold float64
	Window    time.Duration
	// Limits, when set, returns a sandbox's threshold and window (the
	// policy's escape settings); enabled false means the sandbox is not
	// watched.
	Limits func(sandbox string) (threshold float64, window time.Duration, enabled bool)
	// Weights overrides DefaultWeights.
	Weights map[Signal]Weight
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
	// MaxEvidence bounds the events kept per signal and sandbox; 0 means 16.
	MaxEvidence int
	// Leaf, when set, names the part of the sandbox an event's score
	// belongs to (a cgroup id: the `watcher exec` run or the container);
	// each leaf is scored on its own and a decision names it. 0, or no
	// Leaf, scores the whole sandbox as one.
	Leaf func(ev *audit.Event) uint64
}

// Evidence is one event that contributed to a score.
type Evidence struct {
	At     time.Time   `json:"at"`
	Signal Signal      `json:"signal"`
	Score  float64     `json:"score"`
	Event  audit.Event `json:"event"`
}

// Decision reports a sandbox (or one leaf of it) whose score crossed its
// threshold.
type Decision struct {
	Sandbox  string `json:"sandbox"`
	CgroupID uint64 `json:"cgroup_id,omitempty"`
	// Leaf is the cgroup id of the leaf that earned the score (Config.Leaf);
	// 0 when the sandbox is scored as a whole.
	Leaf      uint64        `json:"leaf,omitempty"`
	Score     float64       `json:"score"`
	Threshold float64       `json:"threshold"`
	Window    time.Duration `json:"window"`
	At        time.Time     `json:"at"`
	// Signals is each signal's capped contribution.
	Signals map[Signal]float64 `json:"signals"`
	// Evidence lists the events in the window that contributed, oldest
	// first.
	Evidence []Evidence `json:"evidence"`
}

// Summary is a one-line description for alerts and the ledger.
func (d *Decision) Summary() string {
	sigs := make([]string, 0, len(d.Signals))
	for s := range d.Signals {
		sigs = append(sigs, string(s))
	}
	sort.Strings(sigs)
	where := "sandbox " + d.Sandbox
	if d.Leaf != 0 {
		where = fmt.Sprintf("cgroup %d of sandbox %s", d.Leaf, d.Sandbox)
	}
	return fmt.Sprintf("escape score %.0f >= %.0f within %v in %s (%d events: %v)",
		d.Score, d.Threshold, d.Window, where, len(d.Evidence), sigs)
}

// Scorer keeps a sliding-window score per sandbox. It is safe for
// concurrent use.
type Scorer struct {
	cfg     Config
	weights map[Signal]Weight

	mu    sync.Mutex
	boxes map[boxKey]*box
}

// boxKey is what one score is kept for: a sandbox, or one leaf of it.
type boxKey struct {
	sandbox string
	leaf    uint64
}

type box struct {
	// bySignal holds recent contributing events per signal, oldest first,
	// at most MaxEvidence each (older ones past the cap no longer add).
	bySignal map[Signal][]Evidence
	cgroupID uint64
	// tripped latches after a decision until Reset, so a frozen sandbox
	// raises one alert, not one per event.
	tripped bool
}

// New returns a scorer.
func New(cfg Config) *Scorer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxEvidence <= 0 {
		cfg.MaxEvidence = 16
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = 100
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	w := cfg.Weights
	if w == nil {
		w = DefaultWeights()
	}
	return &Scorer{cfg: cfg, weights: w, boxes: map[boxKey]*box{}}
}

// SandboxKey is the key events are scored under: the sandbox name, or its
// cgroup id when the event has no name. Events from outside any sandbox
// have no key.
func SandboxKey(ev *audit.Event) string {
	if ev.Sandbox.Name != "" {
		return ev.Sandbox.Name
	}
	if ev.Sandbox.CgroupID != 0 {
		return fmt.Sprintf("cgroup:%d", ev.Sandbox.CgroupID)
	}
	return ""
}

func (s *Scorer) limits(sb string) (float64, time.Duration, bool) {
	if s.cfg.Limits != nil {
		return s.cfg.Limits(sb)
	}
	return s.cfg.Threshold, s.cfg.Window, true
}

// Observe scores one event. It returns a decision when the event takes its
// sandbox's score to the threshold or above, once until Reset.
func (s *Scorer) Observe(ev audit.Event) *Decision {
	sig, mult, ok := Classify(&ev)
	if !ok {
		return nil
	}
	return s.ObserveClassified(&ev, sig, mult)
}

// ObserveClassified is Observe for an event already classified (Classify
// returned sig, mult and true): a caller that classifies every event to
// find the few worth scoring does not classify them twice. It keeps a copy
// of ev, not ev.
func (s *Scorer) ObserveClassified(ev *audit.Event, sig Signal, mult float64) *Decision {
	if ev.Sandbox.Labels[audit.LabelCanary] != "" {
		// The canary's probes prove the cage; they are never an attack.
		return nil
	}
	name := SandboxKey(ev)
	if name == "" {
		return nil
	}
	threshold, window, enabled := s.limits(name)
	if !enabled {
		return nil
	}
	w, ok := s.weights[sig]
	if !ok || w.Per <= 0 {
		return nil
	}
	score := w.Per * mult
	if ev.Verdict == audit.VerdictDenied || ev.Verdict == audit.VerdictKilled {
		score *= RefusedFactor
	}
	now := s.cfg.Now()
	key := boxKey{sandbox: name}
	if s.cfg.Leaf != nil {
		key.leaf = s.cfg.Leaf(ev)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[key]
	if b == nil {
		b = &box{bySignal: map[Signal][]Evidence{}}
		s.boxes[key] = b
	}
	if ev.Sandbox.CgroupID != 0 {
		b.cgroupID = ev.Sandbox.CgroupID
	}
	s.expire(b, now, window)
	list := append(b.bySignal[sig], Evidence{At: now, Signal: sig, Score: score, Event: *ev})
	if len(list) > s.cfg.MaxEvidence {
		list = list[len(list)-s.cfg.MaxEvidence:]
	}
	b.bySignal[sig] = list
	total, per := s.total(b)
	if w.Decisive && total < threshold {
		total = threshold
	}
	if b.tripped || total < threshold {
		return nil
	}
	b.tripped = true
	d := &Decision{Sandbox: name, CgroupID: b.cgroupID, Leaf: key.leaf, Score: total, Threshold: threshold, Window: window, At: now, Signals: per}
	for _, l := range b.bySignal {
		d.Evidence = append(d.Evidence, l...)
	}
	sort.SliceStable(d.Evidence, func(i, j int) bool { return d.Evidence[i].At.Before(d.Evidence[j].At) })
	return d
}

func (s *Scorer) expire(b *box, now time.Time, window time.Duration) {
	cut := now.Add(-window)
	for sig, l := range b.bySignal {
		i := 0
		for i < len(l) && !l[i].At.After(cut) {
			i++
		}
		if i == len(l) {
			delete(b.bySignal, sig)
		} else if i > 0 {
			b.bySignal[sig] = append(l[:0:0], l[i:]...)
		}
	}
}

func (s *Scorer) total(b *box) (float64, map[Signal]float64) {
	per := map[Signal]float64{}
	var total float64
	for sig, l := range b.bySignal {
		var sum float64
		for _, e := range l {
			sum += e.Score
		}
		if c := s.weights[sig].Cap; c > 0 && sum > c {
			sum = c
		}
		per[sig] = sum
		total += sum
	}
	return total, per
}

// Score returns a sandbox's current score (signals in the window): the
// highest of its leaves when leaves are scored apart.
func (s *Scorer) Score(sandbox string) float64 {
	_, window, _ := s.limits(sandbox)
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var best float64
	for k, b := range s.boxes {
		if k.sandbox != sandbox {
			continue
		}
		s.expire(b, now, window)
		if len(b.bySignal) == 0 && !b.tripped {
			// Nothing in the window: forget it, so leaves and sandboxes
			// that come and go do not accumulate.
			delete(s.boxes, k)
			continue
		}
		if t, _ := s.total(b); t > best {
			best = t
		}
	}
	return best
}

// Tripped reports whether a decision was made for the sandbox (or a leaf
// of it) and not yet Reset.
func (s *Scorer) Tripped(sandbox string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, b := range s.boxes {
		if k.sandbox == sandbox && b.tripped {
			return true
		}
	}
	return false
}

// Reset clears a sandbox's scores, every leaf's, and re-arms them (after
// an operator thaws it).
func (s *Scorer) Reset(sandbox string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.boxes {
		if k.sandbox == sandbox {
			delete(s.boxes, k)
		}
	}
}

// Scores returns every sandbox's current score, for the
// watcher_escape_score gauge.
func (s *Scorer) Scores() map[string]float64 {
	s.mu.Lock()
	names := map[string]bool{}
	for k := range s.boxes {
		names[k.sandbox] = true
	}
	s.mu.Unlock()
	out := make(map[string]float64, len(names))
	for n := range names {
		out[n] = s.Score(n)
	}
	return out
}
