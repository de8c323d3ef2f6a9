package pipeline

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/watcherhq/watcher/internal/audit"
)

// sampleKey is what routine events are sampled per.
type sampleKey struct {
	sandbox string
	kind    audit.Kind
}

// sampleCounter counts one sandbox and kind.
type sampleCounter struct {
	offset  uint64 // phase of the 1-in-N pattern, from the seed
	routine uint64 // routine events seen so far (drives the pattern)
	seen    uint64 // since the last summary, alerts included
	kept    uint64 // since the last summary, alerts included
}

// Sampler is the sample stage: it keeps alerts and 1 in every N routine
// events per sandbox and kind. Which routine events are kept depends only
// on the seed and on the order of events within their sandbox and kind,
// so a run can be reproduced. The ledger runs it, under its lock, on
// every event any path appends (the other sinks see every event), and
// writes its counts as sample_summary records; it is not safe for
// concurrent use.
type Sampler struct {
	every    uint64
	seed     uint64
	counters map[sampleKey]*sampleCounter
	// The counter of the last event's sandbox and kind: a stream of
	// events of one process skips the key and the map lookup.
	lastName string
	lastCg   uint64
	lastKind audit.Kind
	last     *sampleCounter
}

// NewSampler returns a sample stage keeping 1 in every routine events (0
// or 1: all), in the pattern seed fixes.
func NewSampler(every, seed uint64) *Sampler {
	return &Sampler{every: max(every, 1), seed: seed, counters: map[sampleKey]*sampleCounter{}}
}

// sandboxLabel names a sandbox in sampling keys and summaries.
func sandboxLabel(s *audit.Sandbox) string {
	if s.Name != "" {
		return s.Name
	}
	if s.CgroupID != 0 {
		return "cgroup:" + strconv.FormatUint(s.CgroupID, 10)
	}
	return ""
}

// Offer counts e (an alert when alert) and reports whether it is kept.
func (s *Sampler) Offer(e *audit.Event, alert bool) bool {
	c := s.last
	if c == nil || e.Sandbox.Name != s.lastName || e.Sandbox.CgroupID != s.lastCg || e.Kind != s.lastKind {
		k := sampleKey{sandboxLabel(&e.Sandbox), e.Kind}
		c = s.counters[k]
		if c == nil {
			c = &sampleCounter{offset: s.phase(k)}
			s.counters[k] = c
		}
		s.last, s.lastName, s.lastCg, s.lastKind = c, e.Sandbox.Name, e.Sandbox.CgroupID, e.Kind
	}
	c.seen++
	keep := alert
	if !alert {
		keep = (c.routine+c.offset)%s.every == 0
		c.routine++
	}
	if keep {
		c.kept++
	}
	return keep
}

func (s *Sampler) phase(k sampleKey) uint64 {
	if s.every == 1 {
		return 0
	}
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], s.seed)
	h.Write(b[:])
	h.Write([]byte(k.sandbox))
	h.Write([]byte{0})
	h.Write([]byte(k.kind))
	return h.Sum64() % s.every
}

// Rows returns the counts since the last Reset, sorted by sandbox and
// kind.
func (s *Sampler) Rows() []audit.SampleRow {
	var rows []audit.SampleRow
	for k, c := range s.counters {
		if c.seen == 0 {
			continue
		}
		rows = append(rows, audit.SampleRow{Sandbox: k.sandbox, Kind: k.kind, Seen: c.seen, Kept: c.kept})
	}
	slices.SortFunc(rows, func(a, b audit.SampleRow) int {
		return cmp.Or(cmp.Compare(a.Sandbox, b.Sandbox), cmp.Compare(a.Kind, b.Kind))
	})
	return rows
}

// maxIdleCounters bounds the Sampler's memory: beyond this many sandbox and
// kind pairs, pairs idle for a whole summary period are forgotten (their
// 1-in-N pattern restarts if they come back, which is the only way sampling
// can depend on timing).
const maxIdleCounters = 4096

// Reset starts a new summary period.
func (s *Sampler) Reset() {
	s.last = nil // reset may forget it
	prune := len(s.counters) > maxIdleCounters
	for k, c := range s.counters {
		if c.seen == 0 && prune {
			delete(s.counters, k)
			continue
		}
		c.seen, c.kept = 0, 0
	}
}
