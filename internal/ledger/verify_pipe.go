package ledger

import (
	"crypto/sha256"
	"io"
	"runtime"
	"sync"

	"golang.org/x/mod/sumdb/tlog"
)

// Verification runs as a pipeline so that hashing uses every core: one
// goroutine reads and splits lines into batches, workers parse and hash the
// records of a batch, and the walker takes batches in file order and checks
// sequence numbers, links and the Merkle tree as before. A fixed pool of
// batches bounds memory whatever the ledger's size, and because the walker
// sees records strictly in order and stops at the first bad one, the
// problems reported are the same as a sequential pass would give.
const (
	verifyBatchBytes = 128 << 10 // a batch holds about this many line bytes
	verifyBatchRecs  = 512       // and at most this many records
)

// verifyBatch is a run of consecutive lines of one segment.
type verifyBatch struct {
	// buf holds each line preceded by a 0x00 byte, so that the tlog leaf
	// hash SHA-256(0x00 || body) is taken over contiguous bytes.
	buf   []byte
	recs  []verifyRec
	readN int64         // bytes of the segment file read when the batch was filled
	done  chan struct{} // capacity 1: a worker finished the batch
}

// verifyRec is one line of a batch. The reader fills off, start, end,
// tooLong and readErr; a worker fills the rest.
type verifyRec struct {
	off        int64
	start, end int   // buf[start] is the 0x00 prefix, buf[start+1:end] the line
	tooLong    bool  // the line exceeded MaxRecordBytes and was skipped
	readErr    error // reading failed at off; the last record of the batch

	f      frame
	ferr   error
	h      tlog.Hash // leaf hash of f.body
	hashOK bool      // f.hashHex is h
	decode bool      // needsDecode(f)
}

func (r *verifyRec) line(b *verifyBatch) []byte { return b.buf[r.start+1 : r.end] }

// verifyPool holds the batches, reused across segments.
type verifyPool struct {
	workers int
	free    chan *verifyBatch
}

func newVerifyPool() *verifyPool {
	n := max(runtime.GOMAXPROCS(0), 1)
	p := &verifyPool{workers: n, free: make(chan *verifyBatch, 2*n+2)}
	for range cap(p.free) {
		p.free <- &verifyBatch{done: make(chan struct{}, 1),
			buf: make([]byte, 0, verifyBatchBytes+16<<10), recs: make([]verifyRec, 0, verifyBatchRecs)}
	}
	return p
}

// verifyPipe is the pipeline over the records of one segment.
type verifyPipe struct {
	pool    *verifyPool
	ordered chan *verifyBatch // batches in file order, to the walker
	work    chan *verifyBatch // the same batches, to the workers
	quit    chan struct{}
	wg      sync.WaitGroup
	held    *verifyBatch // the batch the walker is checking
}

// start reads the rest of the segment from lr (cr counts the file bytes
// read) in a new pipeline.
func (p *verifyPool) start(lr *lineReader, cr *countingReader) *verifyPipe {
	vp := &verifyPipe{
		pool:    p,
		ordered: make(chan *verifyBatch, cap(p.free)),
		work:    make(chan *verifyBatch, cap(p.free)),
		quit:    make(chan struct{}),
	}
	vp.wg.Add(1 + p.workers)
	go vp.read(lr, cr)
	for range p.workers {
		go vp.hash()
	}
	return vp
}

func (vp *verifyPipe) read(lr *lineReader, cr *countingReader) {
	defer vp.wg.Done()
	defer close(vp.work)
	defer close(vp.ordered)
	for {
		var b *verifyBatch
		select {
		case b = <-vp.pool.free:
		case <-vp.quit:
			return
		}
		b.buf, b.recs = b.buf[:0], b.recs[:0]
		end := false
		for len(b.buf) < verifyBatchBytes && len(b.recs) < verifyBatchRecs {
			line, off, tooLong, err := lr.next()
			if err == io.EOF {
				end = true
				break
			}
			if err != nil {
				b.recs = append(b.recs, verifyRec{off: off, readErr: err})
				end = true
				break
			}
			r := verifyRec{off: off, tooLong: tooLong, start: len(b.buf)}
			b.buf = append(b.buf, 0)
			b.buf = append(b.buf, line...)
			r.end = len(b.buf)
			b.recs = append(b.recs, r)
		}
		b.readN = cr.n
		// Neither send blocks: at most cap(free) batches exist.
		vp.ordered <- b
		vp.work <- b
		if end {
			return
		}
	}
}

func (vp *verifyPipe) hash() {
	defer vp.wg.Done()
	for b := range vp.work {
		for i := range b.recs {
			r := &b.recs[i]
			if r.tooLong || r.readErr != nil {
				continue
			}
			r.f, r.ferr = parseFrame(r.line(b))
			if r.ferr != nil {
				continue
			}
			r.h = sha256.Sum256(b.buf[r.start : r.start+1+len(r.f.body)])
			r.hashOK = hexEqual(r.f.hashHex, r.h)
			r.decode = needsDecode(r.f)
		}
		b.done <- struct{}{}
	}
}

// next returns the next hashed batch in file order, or nil at the end. The
// previous batch goes back to the pool.
func (vp *verifyPipe) next() *verifyBatch {
	vp.release()
	b, ok := <-vp.ordered
	if !ok {
		return nil
	}
	<-b.done
	vp.held = b
	return b
}

func (vp *verifyPipe) release() {
	if vp.held != nil {
		vp.pool.free <- vp.held
		vp.held = nil
	}
}

// stop ends the pipeline (early or at the end of the segment) and returns
// every batch to the pool; afterwards no goroutine touches the segment.
func (vp *verifyPipe) stop() {
	vp.release()
	close(vp.quit)
	for b := range vp.ordered {
		<-b.done
		vp.pool.free <- b
	}
	vp.wg.Wait()
}
