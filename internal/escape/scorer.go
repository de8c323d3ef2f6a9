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
}

// Evidence is one event that contributed to a score.
type Evidence struct {
	At     time.Time   `json:"at"`
	Signal Signal      `json:"signal"`
	Score  float64     `json:"score"`
	Event  audit.Event `json:"event"`
}

// Decision reports a sandbox whose score crossed its threshold.
type Decision struct {
	Sandbox   string        `json:"sandbox"`
	CgroupID  uint64        `json:"cgroup_id,omitempty"`
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
	return fmt.Sprintf("escape score %.0f >= %.0f within %v in sandbox %s (%d events: %v)",
		d.Score, d.Threshold, d.Window, d.Sandbox, len(d.Evidence), sigs)
}

// Scorer keeps a sliding-window score per sandbox. It is safe for
// concurrent use.
type Scorer struct {
	cfg     Config
	weights map[Signal]Weight

	mu    sync.Mutex
	boxes map[string]*box
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
	return &Scorer{cfg: cfg, weights: w, boxes: map[string]*box{}}
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
	key := SandboxKey(&ev)
	if key == "" {
		return nil
	}
	sig, mult, ok := Classify(&ev)
	if !ok {
		return nil
	}
	threshold, window, enabled := s.limits(key)
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
	list := append(b.bySignal[sig], Evidence{At: now, Signal: sig, Score: score, Event: ev})
	if len(list) > s.cfg.MaxEvidence {
		list = list[len(list)-s.cfg.MaxEvidence:]
	}
	b.bySignal[sig] = list
	total, per := s.total(b)
	if b.tripped || total < threshold {
		return nil
	}
	b.tripped = true
	d := &Decision{Sandbox: key, CgroupID: b.cgroupID, Score: total, Threshold: threshold, Window: window, At: now, Signals: per}
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

// Score returns a sandbox's current score (signals in the window).
func (s *Scorer) Score(sandbox string) float64 {
	_, window, _ := s.limits(sandbox)
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[sandbox]
	if b == nil {
		return 0
	}
	s.expire(b, s.cfg.Now(), window)
	if len(b.bySignal) == 0 && !b.tripped {
		// Nothing in the window: forget the sandbox, so sandboxes that
		// come and go do not accumulate.
		delete(s.boxes, sandbox)
		return 0
	}
	t, _ := s.total(b)
	return t
}

// Tripped reports whether a decision was made for the sandbox and not yet
// Reset.
func (s *Scorer) Tripped(sandbox string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[sandbox]
	return b != nil && b.tripped
}

// Reset clears a sandbox's score and re-arms it (after an operator thaws
// it).
func (s *Scorer) Reset(sandbox string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.boxes, sandbox)
}

// Scores returns every sandbox's current score, for the
// watcher_escape_score gauge.
func (s *Scorer) Scores() map[string]float64 {
	s.mu.Lock()
	names := make([]string, 0, len(s.boxes))
	for n := range s.boxes {
		names = append(names, n)
	}
	s.mu.Unlock()
	out := make(map[string]float64, len(names))
	for _, n := range names {
		out[n] = s.Score(n)
	}
	return out
}
