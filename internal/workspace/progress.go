package workspace

import (
	"context"
	"fmt"
	"time"
)

// Progress is how far a long operation has got: what the sandbox wrote
// decides how long diff, commit, rollback and snapshot take, so they
// report as they go and stop when their context is cancelled.
type Progress struct {
	// Op is the operation: "diff", "commit", "rollback", "snapshot".
	Op string `json:"op"`
	// Entries counts the directory entries visited.
	Entries int64 `json:"entries"`
	// Bytes counts the file bytes read, compared, hashed or copied (data
	// only: the holes of a sparse file are skipped, not read).
	Bytes int64 `json:"bytes"`
}

func (p Progress) String() string {
	return fmt.Sprintf("%d entries, %d bytes read", p.Entries, p.Bytes)
}

// progressEvery is how often a meter calls its report func at most.
const progressEvery = 250 * time.Millisecond

// meter counts the work of one operation, checks its context between
// steps and reports progress now and then.
type meter struct {
	ctx    context.Context
	p      Progress
	report func(Progress)
	next   time.Time
	buf    []byte // read buffer, reused across files
}

// copyChunk is the most bytes read at once.
const copyChunk = 256 << 10

func newMeter(ctx context.Context, op string, report func(Progress)) *meter {
	if ctx == nil {
		ctx = context.Background()
	}
	return &meter{ctx: ctx, p: Progress{Op: op}, report: report, next: time.Now().Add(progressEvery)}
}

// entry counts an entry and checks for cancellation.
func (m *meter) entry() error {
	m.p.Entries++
	return m.check()
}

// read counts n bytes read and checks for cancellation.
func (m *meter) read(n int) error {
	m.p.Bytes += int64(n)
	return m.check()
}

func (m *meter) check() error {
	if err := m.ctx.Err(); err != nil {
		return err
	}
	if m.report != nil {
		if now := time.Now(); now.After(m.next) {
			m.next = now.Add(progressEvery)
			m.report(m.p)
		}
	}
	return nil
}

func (m *meter) buffer() []byte {
	if m.buf == nil {
		m.buf = make([]byte, 2*copyChunk)
	}
	return m.buf
}
