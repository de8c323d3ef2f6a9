package enforce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/pipeline"
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
	EvFileOp     uint32 = 16 // LSM path operations (unlink, rename, chmod...)
	EvOperation  uint32 = 17 // LSM operations judged as a whole (perf_event_open...)
	EvLSMSocket  uint32 = 18 // LSM socket_create
	EvLSMUnix    uint32 = 19 // LSM unix_stream_connect and unix_may_send
	EvListen     uint32 = 23 // cgroup bind4/bind6 and sockops listen (cgroupbpf)
)

// Actions of policy rules (enum action in common.h): rules.Action*.
const (
	ActionAllow  = rules.ActionAllow
	ActionRecord = rules.ActionRecord
	ActionBlock  = rules.ActionBlock
	ActionKill   = rules.ActionKill
)

var verdicts = [...]audit.Verdict{audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled}

// Decoder fills ev's kind-specific fields from raw, the whole sample
// (header included). The reader has already filled the common fields.
type Decoder func(raw []byte, ev *audit.Event) error

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// QueueSize bounds the queue between the kernel reader and consumers.
	QueueSize int
	// AlertReserve is the part of the queue only alerts may fill (default
	// a quarter): routine events that find the rest full are dropped and
	// counted, alerts are never dropped (the reader waits for room, and the
	// kernel ring, whose reservation failures are counted, takes the
	// pressure).
	AlertReserve int
	// Burst folds identical alerts (audit.SameOperation) into one record
	// (audit.RepeatDetail) until none came for Burst, or for at most
	// 10*Burst; the first of a burst is delivered at once. Default 1s;
	// negative: no folding.
	Burst time.Duration
	// PollInterval is the reader deadline: with batched wakeups, events
	// wait at most this long in the ring.
	PollInterval time.Duration
	// LossInterval is how often ring and queue drops are turned into loss
	// events.
	LossInterval time.Duration
}

// ReaderStats counts what the reader saw.
type ReaderStats struct {
	Read         uint64 // samples read from the rings
	Delivered    uint64 // events queued for consumers
	QueueDrops   uint64 // routine events dropped because the queue was full
	AlertDrops   uint64 // alerts dropped: only at shutdown with a full queue
	Folded       uint64 // alerts folded into a burst record (not delivered alone)
	DecodeErrors uint64
	RingAlert    uint64 // failed reservations in the alert ring (kernel)
	RingRoutine  uint64 // failed reservations in the routine ring (kernel)
}

// Reader reads both ring buffers and turns samples into audit events.
type Reader struct {
	eng      *Engine
	opts     ReaderOptions
	decoders map[uint32]registered
	byKind   [maxFastKind]registered // decoders of small kinds, without a map lookup
	// out carries batches of events in order; queued counts the events
	// handed over and not yet released, which QueueSize bounds.
	out     chan []audit.Event
	free    chan []audit.Event // released batches, reused
	queued  atomic.Int64
	bootOff time.Duration

	eventsOnce sync.Once
	events     chan audit.Event // Events: the batches one by one

	read, delivered, queueDrops, decodeErrs atomic.Uint64
	alertDrops, folded                      atomic.Uint64
	reported                                [4]uint64 // last reported: ring alert, ring routine, queue, queue_alert

	ctx context.Context // of Run: an alert waits for room until it ends

	// Owned by the reading goroutine.
	ev    audit.Event         // decoded in place, then copied into the batch
	cur   []audit.Event       // the batch being filled
	comms map[[16]byte]string // interned process names
	burst *pipeline.Fold      // the fold stage
}

// maxFastKind bounds the kinds looked up in Reader.byKind.
const maxFastKind = 64

// maxComms bounds the interned process names (the map is cleared when full).
const maxComms = 4096

// routineBatch is how many routine events are read before the alert ring is
// looked at again, so alerts never wait behind a flood of routine events.
const routineBatch = 1024

// batchMax is the most events one hand-over to the consumer carries. A
// channel operation and a wakeup per batch rather than per event, and only
// the batches in flight are touched (a channel of QueueSize events cycles
// through all of its 24 MiB).
const batchMax = 256

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
	if opts.AlertReserve <= 0 || opts.AlertReserve >= opts.QueueSize {
		opts.AlertReserve = max(opts.QueueSize/4, 1)
	}
	if opts.Burst == 0 {
		opts.Burst = time.Second
	}
	return &Reader{
		eng: e, opts: opts, decoders: map[uint32]registered{},
		out:     make(chan []audit.Event, opts.QueueSize),
		free:    make(chan []audit.Event, 8),
		bootOff: bootOffset(),
		comms:   map[[16]byte]string{},
		burst:   pipeline.NewFold(opts.Burst),
		ctx:     context.Background(),
	}
}

// bootOffset is wall clock minus CLOCK_BOOTTIME, to date kernel events.
func bootOffset() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(time.Now().UnixNano() - ts.Nano())
}

// Register sets the decoder for a kernel event kind. Register every
// decoder before Run.
func (r *Reader) Register(kind uint32, ak audit.Kind, mechanism string, dec Decoder) {
	reg := registered{kind: ak, mechanism: mechanism, dec: dec}
	r.decoders[kind] = reg
	if kind < maxFastKind {
		r.byKind[kind] = reg
	}
}

// Batches is the bounded queue of decoded events, in order, a batch at a
// time. The consumer gives each batch back with Release when it is done
// with its events (they count against QueueSize until then). Use Batches
// or Events, not both.
func (r *Reader) Batches() <-chan []audit.Event { return r.out }

// Release gives back a batch received from Batches.
func (r *Reader) Release(b []audit.Event) {
	r.queued.Add(-int64(len(b)))
	r.reuse(b)
}

func (r *Reader) reuse(b []audit.Event) {
	if cap(b) != batchMax {
		return
	}
	select {
	case r.free <- b[:0]:
	default:
	}
}

// Events is the bounded queue of decoded events, one at a time (Batches
// unbatched by a goroutine, which ends when Run does).
func (r *Reader) Events() <-chan audit.Event {
	r.eventsOnce.Do(func() {
		r.events = make(chan audit.Event)
		go func() {
			defer close(r.events)
			for b := range r.out {
				for i := range b {
					r.events <- b[i]
				}
				r.Release(b)
			}
		}()
	})
	return r.events
}

// Stats returns the reader's counters.
func (r *Reader) Stats() ReaderStats {
	s := ReaderStats{
		Read: r.read.Load(), Delivered: r.delivered.Load(),
		QueueDrops: r.queueDrops.Load(), DecodeErrors: r.decodeErrs.Load(),
		AlertDrops: r.alertDrops.Load(), Folded: r.folded.Load(),
	}
	s.RingAlert, s.RingRoutine, _ = r.eng.RingDrops()
	return s
}

// Run reads until ctx ends. It closes the Events channel on return.
//
// One goroutine reads both rings. It sleeps in an edge-triggered epoll on
// them, so it wakes when the kernel side's batched wakeup fires (once per
// WAKEUP_BYTES produced, see submit_event in bpf/include/common.h) or when
// PollInterval passes, then reads what is pending, alerts first. A
// level-triggered wait (ringbuf.Reader's own) returns as soon as one event
// is pending, which turns a steady stream into a system call per few
// events.
func (r *Reader) Run(ctx context.Context) error {
	defer close(r.out)
	r.ctx = ctx
	alertRd, err := ringbuf.NewReader(r.eng.AlertRing())
	if err != nil {
		return fmt.Errorf("open alert ring: %w", err)
	}
	defer alertRd.Close()
	routineRd, err := ringbuf.NewReader(r.eng.RoutineRing())
	if err != nil {
		return fmt.Errorf("open routine ring: %w", err)
	}
	defer routineRd.Close()
	// The readers never block: the wait is ours (ringWait). A deadline in
	// the past makes ReadInto return os.ErrDeadlineExceeded once a ring is
	// empty.
	past := time.Unix(1, 0)
	alertRd.SetDeadline(past)
	routineRd.SetDeadline(past)
	wait, err := newRingWait(r.eng.AlertRing().FD(), r.eng.RoutineRing().FD())
	if err != nil {
		return err
	}
	defer wait.close()
	stopWake := context.AfterFunc(ctx, wait.wake)
	defer stopWake()

	errc := make(chan error, 1)
	go func() { errc <- r.readRings(ctx, wait, alertRd, routineRd) }()
	tick := time.NewTicker(r.opts.LossInterval)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			if ctx.Err() != nil && err == nil {
				r.reportLosses() // a final account, best effort
			}
			return err
		case <-tick.C:
			r.reportLosses()
		}
	}
}

// readRings reads both rings until ctx ends (with a last read of what is
// pending then) or a ring fails.
func (r *Reader) readRings(ctx context.Context, wait *ringWait, alertRd, routineRd *ringbuf.Reader) error {
	var rec ringbuf.Record
	timeout := int(max(r.opts.PollInterval/time.Millisecond, 1))
	for {
		for {
			if _, err := r.drain(alertRd, &rec, -1); err != nil {
				r.handOver()
				return err
			}
			n, err := r.drain(routineRd, &rec, routineBatch)
			if err != nil {
				r.handOver()
				return err
			}
			if n < routineBatch {
				break
			}
		}
		r.burst.Flush(time.Now(), false, r.deliver)
		if ctx.Err() != nil {
			r.burst.Flush(time.Now(), true, r.deliver)
			r.handOver()
			return nil
		}
		r.handOver() // nothing waits in a batch while the reader sleeps
		if err := wait.wait(timeout); err != nil {
			r.handOver()
			return err
		}
	}
}

// drain reads up to limit samples (all when limit < 0) from rd, stopping
// when the ring was empty after a sample: more will come with the next
// wakeup. It returns how many it read.
func (r *Reader) drain(rd *ringbuf.Reader, rec *ringbuf.Record, limit int) (int, error) {
	if rd.AvailableBytes() == 0 {
		return 0, nil
	}
	n := 0
	defer func() { r.read.Add(uint64(n)) }()
	for limit < 0 || n < limit {
		if err := rd.ReadInto(rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrClosed) {
				return n, nil
			}
			return n, fmt.Errorf("read ring: %w", err)
		}
		n++
		r.handle(rec.RawSample)
		if n%1024 == 0 {
			// A burst that never pauses still gets a record per maxAge.
			r.burst.Flush(time.Now(), false, r.deliver)
		}
		if rec.Remaining == 0 {
			break
		}
	}
	return n, nil
}

// ringWait is an edge-triggered epoll over the ring buffers plus an eventfd
// that wakes it to stop.
type ringWait struct {
	epfd, stopfd int
	events       [4]unix.EpollEvent
}

func newRingWait(ringFDs ...int) (*ringWait, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ring epoll: %w", err)
	}
	stopfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("ring epoll eventfd: %w", err)
	}
	w := &ringWait{epfd: epfd, stopfd: stopfd}
	add := func(fd int, flags uint32) error {
		ev := unix.EpollEvent{Events: flags, Fd: int32(fd)}
		return unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	}
	for _, fd := range ringFDs {
		if err := add(fd, unix.EPOLLIN|unix.EPOLLET); err != nil {
			w.close()
			return nil, fmt.Errorf("ring epoll add: %w", err)
		}
	}
	if err := add(stopfd, unix.EPOLLIN); err != nil {
		w.close()
		return nil, fmt.Errorf("ring epoll add eventfd: %w", err)
	}
	return w, nil
}

// wait blocks until a ring's wakeup, wake, or timeout milliseconds.
func (w *ringWait) wait(timeout int) error {
	for {
		_, err := unix.EpollWait(w.epfd, w.events[:], timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ring epoll wait: %w", err)
		}
		return nil
	}
}

// wake makes wait return, now and from then on (the eventfd stays readable).
func (w *ringWait) wake() {
	var one = [8]byte{1}
	unix.Write(w.stopfd, one[:])
}

func (w *ringWait) close() {
	unix.Close(w.epfd)
	unix.Close(w.stopfd)
}

func (r *Reader) handle(raw []byte) {
	if len(raw) < EventHeaderSize {
		r.decodeErrs.Add(1)
		return
	}
	hdr := (*EventHeader)(unsafe.Pointer(unsafe.SliceData(raw)))
	var reg registered
	if hdr.Kind < maxFastKind {
		reg = r.byKind[hdr.Kind]
	} else {
		reg = r.decoders[hdr.Kind]
	}
	if reg.dec == nil {
		r.decodeErrs.Add(1)
		return
	}
	ev := &r.ev
	*ev = audit.Event{
		Time:      time.Unix(0, int64(hdr.TsNs)+int64(r.bootOff)),
		Kind:      reg.kind,
		Mechanism: reg.mechanism,
		Sandbox:   audit.Sandbox{CgroupID: hdr.SandboxCg, ID: hdr.SandboxId},
		RuleID:    hdr.RuleId,
		Process: audit.Process{
			PID: hdr.Pid, TGID: hdr.Tgid, PPID: hdr.Ppid, UID: hdr.Uid,
			Comm: r.comm(&hdr.Comm), CgroupID: hdr.CgroupId,
		},
	}
	if int(hdr.Verdict) < len(verdicts) {
		ev.Verdict = verdicts[hdr.Verdict]
	}
	if ev.Verdict != audit.VerdictAllowed {
		// Decoded, not a default: what the kernel did not allow is an
		// alert, which the queue's reserve and the fold go by. The
		// pipeline's enrich stage sets routine on the rest (Defaults).
		ev.Severity = audit.SeverityAlert
	}
	// Decoding is pure: ids as the kernel wrote them, with the id as the
	// rule's name; the pipeline's enrich stage names sandbox and rule.
	if hdr.RuleId != 0 {
		ev.Rule = RuleLabel(hdr.RuleId)
	}
	if err := reg.dec(raw, ev); err != nil {
		r.decodeErrs.Add(1)
		return
	}
	if ev.Verdict != audit.VerdictAllowed && r.burst.Fold(ev) {
		r.folded.Add(1)
		return
	}
	r.deliver(ev)
}

// RuleLabel is the name of a rule id no rule table names: "rule-<id>".
func RuleLabel(id uint32) string { return "rule-" + strconv.FormatUint(uint64(id), 10) }

// comm returns the process name of a header, interned: a sandbox runs few
// distinct commands, and each event would otherwise allocate its own.
func (r *Reader) comm(c *[16]uint8) string {
	if s, ok := r.comms[*c]; ok {
		return s
	}
	if len(r.comms) >= maxComms {
		clear(r.comms)
	}
	s := cString(c[:])
	r.comms[*c] = s
	return s
}

// deliver queues ev. Routine events may use the queue up to its alert
// reserve and are dropped (counted) beyond it; alerts wait for room, so
// none is dropped in user space while the agent runs. An alert is handed
// over at once, with the routine events before it.
func (r *Reader) deliver(ev *audit.Event) {
	alert := ev.IsAlert()
	if !alert && int(r.queued.Load())+len(r.cur) >= r.opts.QueueSize-r.opts.AlertReserve {
		r.queueDrops.Add(1)
		return
	}
	if r.cur == nil {
		select {
		case r.cur = <-r.free:
		default:
			r.cur = make([]audit.Event, 0, batchMax)
		}
	}
	r.cur = append(r.cur, *ev)
	if alert || len(r.cur) == batchMax {
		r.handOver()
	}
}

// handOver sends the batch being filled to the consumer.
func (r *Reader) handOver() {
	b := r.cur
	if len(b) == 0 {
		return
	}
	r.cur = nil
	r.queued.Add(int64(len(b)))
	select {
	case r.out <- b:
		r.delivered.Add(uint64(len(b)))
		return
	default:
	}
	// QueueSize batches are queued: routine events are dropped, a batch
	// with an alert waits for room.
	alerts := 0
	for i := range b {
		if b[i].IsAlert() {
			alerts++
		}
	}
	if alerts > 0 {
		select {
		case r.out <- b:
			r.delivered.Add(uint64(len(b)))
			return
		case <-r.ctx.Done():
		}
		// Stopping with nobody reading: count what cannot be handed over.
		select {
		case r.out <- b:
			r.delivered.Add(uint64(len(b)))
			return
		default:
		}
	}
	r.queued.Add(-int64(len(b)))
	r.alertDrops.Add(uint64(alerts))
	r.queueDrops.Add(uint64(len(b) - alerts))
	r.reuse(b)
}

// reportLosses turns new ring and queue drops into loss events. A loss
// event that does not fit the queue is retried on the next tick: the
// counters are cumulative, so nothing is forgotten.
func (r *Reader) reportLosses() {
	ringA, ringR, err := r.eng.RingDrops()
	if err != nil {
		return
	}
	now := [4]uint64{ringA, ringR, r.queueDrops.Load(), r.alertDrops.Load()}
	stages := [4]string{"ringbuf_alert", "ringbuf_routine", "queue", "queue_alert"}
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
		r.queued.Add(1)
		select {
		case r.out <- []audit.Event{ev}:
			r.reported[i] = now[i]
		default:
			r.queued.Add(-1)
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

// CastPrefix is Cast for events whose trailing fields may be left out by
// the kernel (a record that ends early, e.g. before strings that are all
// empty): a whole T is viewed in place, a shorter record of at least min
// bytes is copied into *buf with the missing bytes zero.
func CastPrefix[T any](raw []byte, buf *T, min int) (*T, error) {
	size := int(unsafe.Sizeof(*buf))
	if len(raw) >= size {
		return (*T)(unsafe.Pointer(&raw[0])), nil
	}
	if len(raw) < min {
		return nil, fmt.Errorf("short event: %d bytes, want at least %d", len(raw), min)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), size)
	clear(b[copy(b, raw):])
	return buf, nil
}

// Cast views raw as *T after checking its length; raw must stay alive and
// unmodified while the result is used.
func Cast[T any](raw []byte) (*T, error) {
	var zero T
	if len(raw) < int(unsafe.Sizeof(zero)) {
		return nil, fmt.Errorf("short event: %d bytes, want %d", len(raw), unsafe.Sizeof(zero))
	}
	return (*T)(unsafe.Pointer(&raw[0])), nil
}
