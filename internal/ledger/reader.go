package ledger

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Reader iterates over the records of a ledger directory in order, across
// plain and compressed segments. It checks each record's framing and own
// hash but not the chain: use Verify for that. A final record without its
// newline (a writer still running, or a torn tail not yet recovered) ends
// the iteration quietly.
type Reader struct {
	dir   string
	segs  []segFile
	i     int
	lr    *lineReader
	close func() error
	file  string
}

// NewReader opens dir for reading.
func NewReader(dir string) (*Reader, error) {
	layout, err := scanDir(dir)
	if err != nil {
		return nil, err
	}
	if len(layout.segments) == 0 {
		return nil, fmt.Errorf("%s holds no ledger segments (%s*%s)", dir, segPrefix, segSuffix)
	}
	return &Reader{dir: dir, segs: layout.segments}, nil
}

// NewReaderFrom is NewReader starting at the segment that holds record
// from (earlier records of that segment are still returned).
func NewReaderFrom(dir string, from uint64) (*Reader, error) {
	r, err := NewReader(dir)
	if err != nil {
		return nil, err
	}
	for r.i+1 < len(r.segs) && r.segs[r.i+1].First <= from {
		r.i++
	}
	return r, nil
}

// Next returns the next record, or io.EOF after the last.
func (r *Reader) Next() (*Record, error) {
	for {
		if r.lr == nil {
			if r.i >= len(r.segs) {
				return nil, io.EOF
			}
			s := r.segs[r.i]
			r.i++
			r.file = filepath.Join(r.dir, s.Name)
			rd, _, closeFn, err := openSegment(r.file, s.Compressed)
			if err != nil {
				return nil, fmt.Errorf("open segment: %w", err)
			}
			r.lr, r.close = newLineReader(rd), closeFn
			line, _, _, err := r.lr.next()
			if err != nil {
				return nil, fmt.Errorf("%s: read header: %w", r.file, err)
			}
			if _, _, _, err := parseHeader(line); err != nil {
				return nil, fmt.Errorf("%s: %w", r.file, err)
			}
		}
		line, off, tooLong, err := r.lr.next()
		if err == io.EOF {
			r.close()
			r.lr = nil
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: read at offset %d: %w", r.file, off, err)
		}
		if tooLong {
			return nil, fmt.Errorf("%s: record at offset %d longer than %d bytes", r.file, off, MaxRecordBytes)
		}
		if line[len(line)-1] != '\n' && r.i == len(r.segs) {
			r.close()
			r.lr = nil
			return nil, io.EOF
		}
		rec, err := DecodeRecord(line)
		if err != nil {
			return nil, fmt.Errorf("%s: record at offset %d: %w", r.file, off, err)
		}
		rec.File, rec.Offset = r.file, off
		rec.Raw = append([]byte(nil), line...)
		return &rec, nil
	}
}

// Close releases the current segment.
func (r *Reader) Close() error {
	if r.lr != nil {
		r.lr = nil
		return r.close()
	}
	return nil
}

// Proof is an inclusion proof of one record in a signed checkpoint. It is
// checkable offline with CheckProof and the ledger's public key.
type Proof struct {
	// Seq is the record's sequence number (its leaf index).
	Seq uint64 `json:"seq"`
	// Record is the record line, without its newline.
	Record string `json:"record"`
	// Hashes is the RFC 6962 inclusion proof (tlog.RecordProof).
	Hashes []tlog.Hash `json:"proof"`
	// Checkpoint is the signed checkpoint note the proof leads to.
	Checkpoint string `json:"checkpoint"`
}

// Prove builds an inclusion proof of record seq in the signed checkpoint
// ckpt (verified with v). It reads the ledger once, keeping only the
// subtree hashes the proof needs.
func Prove(dir string, seq uint64, ckpt []byte, v note.Verifier) (*Proof, error) {
	c, err := ParseCosigned(ckpt, v)
	if err != nil {
		return nil, err
	}
	if seq >= c.Size {
		return nil, fmt.Errorf("record %d is not covered by the checkpoint (size %d)", seq, c.Size)
	}
	// Which stored hashes does the proof need? The indexes depend only on
	// the sizes, so ask tlog with a reader that just notes them.
	want := map[int64]*tlog.Hash{}
	_, err = tlog.ProveRecord(int64(c.Size), int64(seq), tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		for _, i := range idx {
			want[i] = nil
		}
		return make([]tlog.Hash, len(idx)), nil
	}))
	if err != nil {
		return nil, err
	}
	layout, err := scanDir(dir)
	if err != nil {
		return nil, err
	}
	found := func(level int, index int64, h tlog.Hash) {
		k := tlog.StoredHashIndex(level, index)
		if _, ok := want[k]; ok {
			hh := h
			want[k] = &hh
		}
	}
	var fr *frontier
	lh := newLeafHasher()
	var record []byte
	for _, s := range layout.segments {
		if fr != nil && fr.n >= c.Size {
			break
		}
		path := filepath.Join(dir, s.Name)
		if err := func() error {
			rd, _, closeFn, err := openSegment(path, s.Compressed)
			if err != nil {
				return fmt.Errorf("open segment: %w", err)
			}
			defer closeFn()
			lr := newLineReader(rd)
			line, _, _, err := lr.next()
			if err != nil {
				return fmt.Errorf("%s: read header: %w", path, err)
			}
			hdr, _, hfr, err := parseHeader(line)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if fr == nil {
				fr = hfr
				// The header's frontier stands for the removed records:
				// its subtrees are known, nothing below them is.
				start := uint64(0)
				for i, bit := 0, 63; bit >= 0; bit-- {
					if hdr.FirstSeq&(1<<bit) != 0 {
						found(bit, int64(start>>bit), hfr.h[i])
						start += 1 << bit
						i++
					}
				}
			} else if hdr.FirstSeq != fr.n {
				return fmt.Errorf("%s: starts at record %d, expected %d (run watcher verify)", path, hdr.FirstSeq, fr.n)
			}
			for fr.n < c.Size {
				line, off, tooLong, err := lr.next()
				if err == io.EOF {
					return nil
				}
				if err != nil || tooLong {
					return fmt.Errorf("%s: read at offset %d failed (run watcher verify): %v", path, off, err)
				}
				f, err := parseFrame(line)
				if err != nil || f.seq != fr.n {
					return fmt.Errorf("%s: bad record at offset %d (run watcher verify)", path, off)
				}
				if f.seq == seq {
					record = append([]byte(nil), line[:len(line)-1]...)
				}
				fr.add(lh.hash(f.body), found)
			}
			return nil
		}(); err != nil {
			return nil, err
		}
	}
	if fr == nil || fr.n < c.Size {
		return nil, fmt.Errorf("ledger in %s has fewer records than checkpoint size %d: run watcher verify", dir, c.Size)
	}
	if fr.root() != c.Root {
		return nil, fmt.Errorf("records do not match the checkpoint's root: run watcher verify")
	}
	if record == nil {
		return nil, fmt.Errorf("record %d was removed by retention; cannot prove it", seq)
	}
	proof, err := tlog.ProveRecord(int64(c.Size), int64(seq), tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, k := range idx {
			h := want[k]
			if h == nil {
				return nil, fmt.Errorf("subtree hash %d unavailable (records removed by retention)", k)
			}
			out[i] = *h
		}
		return out, nil
	}))
	if err != nil {
		return nil, err
	}
	return &Proof{Seq: seq, Record: string(record), Hashes: proof, Checkpoint: string(ckpt)}, nil
}

// CheckProof checks an inclusion proof offline: the checkpoint's signature
// with v, the record's own hash, and the Merkle path to the signed root. It
// returns the verified checkpoint and the decoded record.
func CheckProof(p *Proof, v note.Verifier) (*Checkpoint, *Record, error) {
	c, err := ParseCosigned([]byte(p.Checkpoint), v)
	if err != nil {
		return nil, nil, err
	}
	rec, err := DecodeRecord([]byte(p.Record))
	if err != nil {
		return nil, nil, fmt.Errorf("proof record: %w", err)
	}
	if rec.Seq != p.Seq {
		return nil, nil, fmt.Errorf("proof is for record %d but holds record %d", p.Seq, rec.Seq)
	}
	if p.Seq >= c.Size {
		return nil, nil, fmt.Errorf("record %d is beyond the checkpoint (size %d)", p.Seq, c.Size)
	}
	if err := tlog.CheckRecord(p.Hashes, int64(c.Size), c.Root, int64(p.Seq), rec.Hash); err != nil {
		return nil, nil, fmt.Errorf("inclusion proof does not lead to the signed root: %w", err)
	}
	return c, &rec, nil
}

// ReadProof parses a proof as written by `watcher ledger prove`.
func ReadProof(data []byte) (*Proof, error) {
	var p Proof
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("parse proof: %w", err)
	}
	return &p, nil
}

// LatestCheckpoint returns the raw note of the latest checkpoint in dir,
// with its cosignatures.
func LatestCheckpoint(dir string) ([]byte, string, error) {
	layout, err := scanDir(dir)
	if err != nil {
		return nil, "", err
	}
	if layout.hasLatest {
		path := filepath.Join(dir, latestName)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, "", fmt.Errorf("read checkpoint: %w", err)
		}
		return data, path, nil
	}
	if len(layout.checkpoints) == 0 {
		return nil, "", fmt.Errorf("%s: %w", dir, ErrNoCheckpoint)
	}
	path := filepath.Join(dir, layout.checkpoints[len(layout.checkpoints)-1].Name)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("read checkpoint: %w", err)
	}
	return data, path, nil
}
