package ledger

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// newSegment creates the segment starting at the current state and makes
// it the active one. The header is written atomically (temporary file and
// rename), so a segment file always has a complete header.
func (l *Ledger) newSegment() error {
	name := segName(l.cur.next)
	path := filepath.Join(l.dir, name)
	hdr := renderHeader(l.id, l.vkey, l.cur.next, l.cur.prev, &l.cur.fr)
	if err := writeFileSync(path, hdr, 0o600, false); err != nil {
		return fmt.Errorf("create segment %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open segment %s: %w", path, err)
	}
	if l.seg != nil {
		l.seg.Close()
	}
	l.seg, l.segName, l.segFirst, l.segStart = f, name, l.cur.next, time.Now()
	l.cur.off = int64(len(hdr))
	l.written.copyFrom(&l.cur)
	l.durable.copyFrom(&l.cur)
	return nil
}

// rotateLocked closes the active segment and starts a new one. Called with
// syncMu held, after a successful commit.
func (l *Ledger) rotateLocked() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateAsk = false
	if l.degraded || l.flushLocked() != nil {
		return
	}
	// Appends wait for this one fdatasync: the old segment must be
	// complete and durable before the new one links to it.
	if err := unix.Fdatasync(int(l.seg.Fd())); err != nil {
		l.failLocked(fmt.Errorf("fdatasync %s: %w", filepath.Join(l.dir, l.segName), err), &l.durable)
		return
	}
	l.stats.Syncs++
	l.durable.copyFrom(&l.written)
	old := l.segName
	if err := l.newSegment(); err != nil {
		l.stats.WriteFailures++
		l.lastErr = err
		return
	}
	l.stats.Segments++
	if l.opts.Compress || l.opts.Retention != (Retention{}) {
		select {
		case l.work <- old:
		default: // the worker is behind; Open picks up uncompressed segments
		}
	}
}

// worker compresses rolled-over segments and applies retention.
func (l *Ledger) worker(pending []string) {
	defer close(l.workDone)
	for _, name := range pending {
		l.work1(name)
	}
	for name := range l.work {
		l.work1(name)
	}
}

func (l *Ledger) work1(name string) {
	{
		if l.opts.Compress && name != "" {
			if err := compressSegment(filepath.Join(l.dir, name)); err != nil {
				l.mu.Lock()
				l.lastErr = err
				l.mu.Unlock()
			} else {
				l.mu.Lock()
				l.stats.Compressed++
				l.mu.Unlock()
			}
		}
		l.applyRetention()
	}
}

// segmentEncoderOptions are the zstd settings of rolled-over segments.
// The fastest level: compression runs beside the agent's hot path on busy
// hosts, and JSON lines still shrink about ten-fold at this level. A 1 MiB
// window: a record's matches are in the records just before it (the same
// ratio as the default 8 MiB window, with a third of the encoder's memory).
// No zstd checksum: the frame's XXH64 cost a tenth of the compression time
// and guards nothing the hash chain does not (every decompressed record is
// hashed and linked by the verifier, so a changed byte is found and located
// either way); frames written with a checksum still decode and verify.
var segmentEncoderOptions = []zstd.EOption{zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false),
	zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1 << 20)}

// compressSegment replaces path by path.zst: written to a temporary file,
// fsync'ed, renamed, and only then is the original removed.
func compressSegment(path string) error {
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	defer in.Close()
	tmp := path + zstSuffix + tmpSuffix
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	enc, err := zstd.NewWriter(out, segmentEncoderOptions...)
	if err == nil {
		_, err = io.Copy(enc, in)
		if cerr := enc.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path+zstSuffix)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compress %s: %w", path, err)
	}
	if info, err := in.Stat(); err == nil {
		// Keep the last-write time: age-based retention goes by it.
		os.Chtimes(path+zstSuffix, info.ModTime(), info.ModTime())
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("compress %s: remove original: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}
