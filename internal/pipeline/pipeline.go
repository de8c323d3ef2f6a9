// Package pipeline is the one path every event takes inside the agent,
// written as one ordered list of named stages, each in its own file
// (stage_*.go) with its own test, as blocky and CoreDNS write their
// chains:
//
//	decode   kernel samples become audit.Events (enforce.Reader): ids,
//	         the kernel's verdict and the severity it implies; the DNS
//	         proxy, the egress hooks' notifier and the agent itself build
//	         their events directly
//	fold     Fold (stage_fold.go): identical alerts become one burst
//	         record; the kernel reader runs it before its queue, which a
//	         flood must not fill
//	enrich   Enrich (stage_enrich.go): time, severity, mechanism, then
//	         the agent's names (sandbox, rule, labels): set once
//	redact   Redact (stage_redact.go): secrets replaced by "***"
//	         (audit.Redact), once, before anyone sees the event
//	classify the escape watch's sink classifies each event once
//	         (escape.Classify) and scores only those with a signal
//	sample   Sampler (stage_sample.go): the ledger keeps 1 in N routine
//	         events per sandbox and kind; the ledger runs it under its
//	         lock, for every path that appends, and its counts become
//	         summary records of the chain; the other sinks see every event
//	fan-out  every sink in order (stage_fanout.go): ledger (LedgerSink,
//	         which appends without redacting again), tail, metrics (the
//	         one count of events and losses: /metrics and `watcher
//	         status` read it), escape watch, log
//	export   the ledger's tap (ledger.Tap) feeds the OTLP exporters
//	         (internal/otlpexport) every record it appends, in sequence
//	         order with its leaf hash; they queue and never wait
//
// Sinks never call back into the pipeline. A sink that wants something
// done returns a Decision (the escape watch: "freeze this leaf"); the
// pipeline hands it to the Decide function, and the events Decide returns
// (the escape alert) run through the pipeline from the start, after the
// current event, so the ledger keeps cause before effect. A sink that fails
// is removed and its removal becomes a loss event the same way.
package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// Stage changes an event in place; it returns false to drop it (counted).
type Stage struct {
	Name string
	Run  func(*audit.Event) bool
}

// Decision is what a sink asks for, carried out by Pipeline's Decide.
// Kind names it; Value is the sink's own description (the escape watch's
// *escape.Decision).
type Decision struct {
	Sink  string
	Kind  string
	Value any
}

// Sink consumes events. Consume must not keep ev (copy what it keeps) and
// must not block for long: it runs on the producer's goroutine. It may
// return a Decision (Kind empty: none). A non-nil error removes the sink.
type Sink interface {
	Name() string
	Consume(ev *audit.Event) (Decision, error)
	Close() error
}

// Pipeline runs events through its stages and sinks. Emit is safe for
// concurrent use; sinks see events from several goroutines.
type Pipeline struct {
	stages []Stage
	// Decide carries out sink decisions; the events it returns are
	// emitted after the current one.
	Decide func(Decision) []audit.Event

	mu      sync.RWMutex
	sinks   []*entry
	removed []Removed

	emitted atomic.Uint64
	dropped []atomic.Uint64 // per stage
	closed  atomic.Bool
}

// entry holds a sink; removal finds it by this pointer, since sinks may
// not be comparable.
type entry struct{ Sink }

// Removed records a sink dropped after an error.
type Removed struct {
	Name string
	Err  error
	At   time.Time
}

// New returns a pipeline with stages in order and sinks in order.
func New(stages []Stage, sinks ...Sink) *Pipeline {
	p := &Pipeline{stages: stages, dropped: make([]atomic.Uint64, len(stages))}
	for _, s := range sinks {
		p.sinks = append(p.sinks, &entry{s})
	}
	return p
}

// Add appends a sink.
func (p *Pipeline) Add(s Sink) {
	p.mu.Lock()
	p.sinks = append(p.sinks, &entry{s})
	p.mu.Unlock()
}

// Names lists the stages and sinks in order, for documentation and status.
func (p *Pipeline) Names() (stages, sinks []string) {
	for _, s := range p.stages {
		stages = append(stages, s.Name)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, s := range p.sinks {
		sinks = append(sinks, s.Name())
	}
	return stages, sinks
}

// maxFollowUps bounds the events decisions may add per emitted event (a
// decision whose alert triggers another decision, and so on).
const maxFollowUps = 16

// Emit runs ev through every stage and sink, then the events that sink
// decisions produced.
func (p *Pipeline) Emit(ev *audit.Event) {
	if p.closed.Load() {
		return
	}
	more := p.run(ev, nil)
	for i := 0; i < len(more) && i < maxFollowUps; i++ {
		more = p.run(&more[i], more)
	}
}

// run passes ev through the stages and sinks and returns more with the
// events of decisions and sink removals appended.
func (p *Pipeline) run(ev *audit.Event, more []audit.Event) []audit.Event {
	for i := range p.stages {
		if !p.stages[i].Run(ev) {
			p.dropped[i].Add(1)
			return more
		}
	}
	p.emitted.Add(1)
	p.mu.RLock()
	var failed []*entry
	var errs []error
	var decisions []Decision
	for _, s := range p.sinks {
		d, err := s.Consume(ev)
		if err != nil {
			failed = append(failed, s)
			errs = append(errs, err)
			continue
		}
		if d.Kind != "" {
			d.Sink = s.Name()
			decisions = append(decisions, d)
		}
	}
	p.mu.RUnlock()
	for i, e := range failed {
		more = append(more, p.remove(e, errs[i])...)
	}
	if p.Decide != nil {
		for _, d := range decisions {
			more = append(more, p.Decide(d)...)
		}
	}
	return more
}

// remove drops a sink and returns the loss event saying so (none when
// another goroutine removed it first).
func (p *Pipeline) remove(e *entry, err error) []audit.Event {
	p.mu.Lock()
	i := slices.Index(p.sinks, e)
	if i < 0 {
		p.mu.Unlock()
		return nil
	}
	s := e.Sink
	p.sinks = slices.Delete(slices.Clone(p.sinks), i, i+1)
	p.removed = append(p.removed, Removed{Name: s.Name(), Err: err, At: time.Now()})
	p.mu.Unlock()
	s.Close()
	return []audit.Event{{Kind: audit.KindLoss, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Mechanism: "agent", Loss: &audit.LossDetail{Stage: "sink:" + s.Name()},
		Message: "sink removed after an error: " + err.Error()}}
}

// Removed returns the sinks dropped so far.
func (p *Pipeline) Removed() []Removed {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]Removed(nil), p.removed...)
}

// Stats counts events that passed every stage, and drops per stage.
func (p *Pipeline) Stats() (emitted uint64, dropped map[string]uint64) {
	dropped = map[string]uint64{}
	for i, s := range p.stages {
		if n := p.dropped[i].Load(); n > 0 {
			dropped[s.Name] = n
		}
	}
	return p.emitted.Load(), dropped
}

// Close closes every sink in order; later Emits are ignored.
func (p *Pipeline) Close() error {
	p.closed.Store(true)
	p.mu.Lock()
	sinks := p.sinks
	p.sinks = nil
	p.mu.Unlock()
	var errs []error
	for _, s := range sinks {
		if err := s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close sink %s: %w", s.Name(), err))
		}
	}
	return errors.Join(errs...)
}
