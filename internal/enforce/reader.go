package enforce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
)

// EventHeader is the common header of every kernel event (struct event_hdr
// in bpf/include/common.h).
type EventHeader = coreEventHdr

// EventHeaderSize is sizeof(struct event_hdr).
const EventHeaderSize = int(unsafe.Sizeof(EventHeader{}))

// Event kinds (enum event_kind in common.h).
const (
	EvFileOpen   uint32 = 1
	EvPtrace     uint32 = 2
	EvMount      uint32 = 3
	EvModule     uint32 = 4
	EvBPF        uint32 = 5
	EvCapability uint32 = 6
	EvSignal     uint32 = 7
	EvExec       uint32 = 8
	EvExit       uint32 = 9
	EvSyscall    uint32 = 10
	EvDevice     uint32 = 11
	EvSysctl     uint32 = 12
	EvSocket     uint32 = 13
	EvNet        uint32 = 14
	EvCgroupMove uint32 = 15
)

// Actions of policy rules (enum action in common.h).
const (
	ActionAllow  uint32 = 0
	ActionRecord uint32 = 1
	ActionBlock  uint32 = 2
	ActionKill   uint32 = 3
)

var verdicts = [...]audit.Verdict{audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled}

// Decoder fills ev's kind-specific fields from raw, the whole sample
// (header included). The reader has already filled the common fields.
type Decoder func(raw []byte, ev *audit.Event) error

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// QueueSize bounds the queue between the kernel reader and consumers.
	QueueSize int
	// PollInterval is the reader deadline: with batched wakeups, events
	// wait at most this long in the ring.
	PollInterval time.Duration
	// LossInterval is how often ring and queue drops are turned into loss
	// events.
	LossInterval time.Duration
	// SandboxName maps a sandbox id to its name (optional).
	SandboxName func(id uint32) string
	// RuleName maps a rule id to its name (optional).
	RuleName func(id uint32) string
}

// ReaderStats counts what the reader saw.
type ReaderStats struct {
	Read         uint64 // samples read from the rings
	Delivered    uint64 // events queued for consumers
	QueueDrops   uint64 // events dropped because the queue was full
	DecodeErrors uint64
	RingAlert    uint64 // failed reservations in the alert ring (kernel)
	RingRoutine  uint64 // failed reservations in the routine ring (kernel)
}

// Reader reads both ring buffers and turns samples into audit events.
type Reader struct {
	eng      *Engine
	opts     ReaderOptions
	decoders map[uint32]registered
	out      chan audit.Event
	bootOff  time.Duration

	read, delivered, queueDrops, decodeErrs atomic.Uint64
	reported                                [3]uint64 // last reported: ring alert, ring routine, queue
}

type registered struct {
	kind      audit.Kind
	mechanism string
	dec       Decoder
}

// NewReader prepares a reader; Register decoders, then Run.
func (e *Engine) NewReader(opts ReaderOptions) *Reader {
	if opts.QueueSize <= 0 {
		opts.QueueSize = 1 << 16
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 50 * time.Millisecond
	}
	if opts.LossInterval <= 0 {
		opts.LossInterval = time.Second
	}
	return &Reader{
		eng: e, opts: opts, decoders: map[uint32]registered{},
		out:     make(chan audit.Event, opts.QueueSize),
		bootOff: bootOffset(),
	}
}

// bootOffset is wall clock minus CLOCK_BOOTTIME, to date kernel events.
func bootOffset() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(time.Now().UnixNano() - ts.Nano())
}

// Register sets the decoder for a kernel event kind.
func (r *Reader) Register(kind uint32, ak audit.Kind, mechanism string, dec Decoder) {
	r.decoders[kind] = registered{kind: ak, mechanism: mechanism, dec: dec}
}

// Events is the bounded queue of decoded events.
func (r *Reader) Events() <-chan audit.Event { return r.out }

// Stats returns the reader's counters.
func (r *Reader) Stats() ReaderStats {
	s := ReaderStats{
		Read: r.read.Load(), Delivered: r.delivered.Load(),
		QueueDrops: r.queueDrops.Load(), DecodeErrors: r.decodeErrs.Load(),
	}
	s.RingAlert, s.RingRoutine, _ = r.eng.RingDrops()
	return s
}

// Run reads until ctx ends. It closes the Events channel on return.
func (r *Reader) Run(ctx context.Context) error {
	defer close(r.out)
	var rings []*ringbuf.Reader
	alertRd, err := ringbuf.NewReader(r.eng.AlertRing())
	if err != nil {
		return fmt.Errorf("open alert ring: %w", err)
	}
	routineRd, err := ringbuf.NewReader(r.eng.RoutineRing())
	if err != nil {
		alertRd.Close()
		return fmt.Errorf("open routine ring: %w", err)
	}
	rings = append(rings, alertRd, routineRd)
	defer func() {
		for _, rd := range rings {
			rd.Close()
		}
	}()

	var wg sync.WaitGroup
	errc := make(chan error, len(rings))
	for _, rd := range rings {
		wg.Add(1)
		go func(rd *ringbuf.Reader) {
			defer wg.Done()
			if err := r.readRing(ctx, rd); err != nil {
				errc <- err
			}
		}(rd)
	}
	tick := time.NewTicker(r.opts.LossInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, rd := range rings {
				rd.SetDeadline(time.Now())
			}
			wg.Wait()
			r.reportLosses() // a final account, best effort
			return nil
		case err := <-errc:
			for _, rd := range rings {
				rd.Close()
			}
			wg.Wait()
			return err
		case <-tick.C:
			r.reportLosses()
		}
	}
}

func (r *Reader) readRing(ctx context.Context, rd *ringbuf.Reader) error {
	var rec ringbuf.Record
	for ctx.Err() == nil {
		rd.SetDeadline(time.Now().Add(r.opts.PollInterval))
		for {
			err := rd.ReadInto(&rec)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if errors.Is(err, ringbuf.ErrClosed) {
					return nil
				}
				return fmt.Errorf("read ring: %w", err)
			}
			r.read.Add(1)
			r.handle(rec.RawSample)
		}
	}
	return nil
}

func (r *Reader) handle(raw []byte) {
	if len(raw) < EventHeaderSize {
		r.decodeErrs.Add(1)
		return
	}
	var hdr EventHeader
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), EventHeaderSize), raw)
	reg, ok := r.decoders[hdr.Kind]
	if !ok {
		r.decodeErrs.Add(1)
		return
	}
	ev := audit.Event{
		Time:      time.Unix(0, int64(hdr.TsNs)+int64(r.bootOff)),
		Kind:      reg.kind,
		Mechanism: reg.mechanism,
		Severity:  audit.SeverityRoutine,
		Sandbox:   audit.Sandbox{CgroupID: hdr.SandboxCg},
		Process: audit.Process{
			PID: hdr.Pid, TGID: hdr.Tgid, PPID: hdr.Ppid, UID: hdr.Uid,
			Comm: cString(hdr.Comm[:]), CgroupID: hdr.CgroupId,
		},
	}
	if int(hdr.Verdict) < len(verdicts) {
		ev.Verdict = verdicts[hdr.Verdict]
	}
	if ev.Verdict != audit.VerdictAllowed {
		ev.Severity = audit.SeverityAlert
	}
	if r.opts.SandboxName != nil {
		ev.Sandbox.Name = r.opts.SandboxName(hdr.SandboxId)
	}
	if hdr.RuleId != 0 {
		if r.opts.RuleName != nil {
			ev.Rule = r.opts.RuleName(hdr.RuleId)
		}
		if ev.Rule == "" {
			ev.Rule = fmt.Sprintf("rule-%d", hdr.RuleId)
		}
	}
	if err := reg.dec(raw, &ev); err != nil {
		r.decodeErrs.Add(1)
		return
	}
	r.deliver(ev)
}

func (r *Reader) deliver(ev audit.Event) {
	select {
	case r.out <- ev:
		r.delivered.Add(1)
	default:
		r.queueDrops.Add(1)
	}
}

// reportLosses turns new ring and queue drops into loss events. A loss
// event that does not fit the queue is retried on the next tick: the
// counters are cumulative, so nothing is forgotten.
func (r *Reader) reportLosses() {
	ringA, ringR, err := r.eng.RingDrops()
	if err != nil {
		return
	}
	now := [3]uint64{ringA, ringR, r.queueDrops.Load()}
	stages := [3]string{"ringbuf_alert", "ringbuf_routine", "queue"}
	for i := range now {
		delta := now[i] - r.reported[i]
		if delta == 0 {
			continue
		}
		ev := audit.Event{
			Time: time.Now(), Kind: audit.KindLoss, Verdict: audit.VerdictRecorded,
			Severity: audit.SeverityAlert, Mechanism: "agent",
			Loss: &audit.LossDetail{Stage: stages[i], Count: delta},
		}
		select {
		case r.out <- ev:
			r.reported[i] = now[i]
		default:
		}
	}
}

// cString converts a NUL-terminated byte array.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// CString converts a NUL-terminated byte array from a kernel event.
func CString(b []byte) string { return cString(b) }

// Cast views raw as *T after checking its length; raw must stay alive and
// unmodified while the result is used.
func Cast[T any](raw []byte) (*T, error) {
	var zero T
	if len(raw) < int(unsafe.Sizeof(zero)) {
		return nil, fmt.Errorf("short event: %d bytes, want %d", len(raw), unsafe.Sizeof(zero))
	}
	return (*T)(unsafe.Pointer(&raw[0])), nil
}
