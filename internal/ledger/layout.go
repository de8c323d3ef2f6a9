package ledger

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/mod/sumdb/tlog"
)

// Files in a ledger directory. Anything else is foreign and makes Open fail.
const (
	segPrefix      = "seg-"
	segSuffix      = ".jsonl"
	zstSuffix      = ".zst"
	ckptPrefix     = "ckpt-"
	ckptSuffix     = ".note"
	tmpSuffix      = ".tmp"
	lockName       = "LOCK"
	defaultKeyName = "ledger.key"
	pubKeyName     = "ledger.pub"
	latestName     = "checkpoint" // the latest checkpoint with its cosignatures
	seqDigits      = 20
)

func segName(first uint64) string {
	return fmt.Sprintf("%s%0*d%s", segPrefix, seqDigits, first, segSuffix)
}
func ckptName(size uint64) string {
	return fmt.Sprintf("%s%0*d%s", ckptPrefix, seqDigits, size, ckptSuffix)
}
func parseSeqName(s string) (uint64, bool) {
	if len(s) != seqDigits {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// segFile is one segment in a directory listing.
type segFile struct {
	Name       string
	First      uint64
	Compressed bool
	Size       int64
	ModTime    time.Time
}

// ckptFile is one checkpoint file in a directory listing.
type ckptFile struct {
	Name string
	Size uint64
}

// dirLayout classifies the entries of a ledger directory.
type dirLayout struct {
	segments    []segFile  // by first seq; plain preferred over compressed
	duplicates  []string   // compressed copies of segments also present plain
	checkpoints []ckptFile // by size
	temps       []string   // leftovers of interrupted atomic writes
	foreign     []string
	trees       []string // tree hash files (see tiles.go)
	hasPub      bool
	hasLatest   bool
	hasHistory  bool
}

func scanDir(dir string) (*dirLayout, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read ledger directory: %w", err)
	}
	l := &dirLayout{}
	bySeq := map[uint64]int{}
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == lockName || name == defaultKeyName:
			continue
		case name == pubKeyName:
			l.hasPub = true
			continue
		case name == latestName && e.Type().IsRegular():
			l.hasLatest = true
			continue
		case name == historyName && e.Type().IsRegular():
			l.hasHistory = true
			continue
		case strings.HasPrefix(name, treePrefix) && e.Type().IsRegular():
			if _, ok := parseTreeName(name); ok {
				l.trees = append(l.trees, name)
				continue
			}
		case strings.HasSuffix(name, tmpSuffix) && (strings.HasPrefix(name, segPrefix) || strings.HasPrefix(name, ckptPrefix) || name == pubKeyName+tmpSuffix || name == latestName+tmpSuffix):
			l.temps = append(l.temps, name)
			continue
		case strings.HasPrefix(name, ckptPrefix) && strings.HasSuffix(name, ckptSuffix):
			if n, ok := parseSeqName(strings.TrimSuffix(strings.TrimPrefix(name, ckptPrefix), ckptSuffix)); ok && e.Type().IsRegular() {
				l.checkpoints = append(l.checkpoints, ckptFile{name, n})
				continue
			}
		case strings.HasPrefix(name, segPrefix):
			base, compressed := strings.CutSuffix(name, zstSuffix)
			base, ok := strings.CutSuffix(base, segSuffix)
			if !ok || !e.Type().IsRegular() {
				break
			}
			n, ok := parseSeqName(strings.TrimPrefix(base, segPrefix))
			if !ok {
				break
			}
			info, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("stat %s: %w", filepath.Join(dir, name), err)
			}
			s := segFile{Name: name, First: n, Compressed: compressed, Size: info.Size(), ModTime: info.ModTime()}
			if i, dup := bySeq[n]; dup {
				// A compressed copy next to its plain original: the
				// compressor stopped before removing the original.
				if l.segments[i].Compressed {
					l.duplicates = append(l.duplicates, l.segments[i].Name)
					l.segments[i] = s
				} else {
					l.duplicates = append(l.duplicates, name)
				}
				continue
			}
			bySeq[n] = len(l.segments)
			l.segments = append(l.segments, s)
			continue
		}
		l.foreign = append(l.foreign, name)
	}
	slices.SortFunc(l.segments, func(a, b segFile) int { return cmpU64(a.First, b.First) })
	slices.SortFunc(l.checkpoints, func(a, b ckptFile) int { return cmpU64(a.Size, b.Size) })
	return l, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// segHeader is the first line of every segment. It is not part of the hash
// chain; every field is cross-checked instead: ledger and key against the
// genesis record, the public key and the other segments; first_seq and prev
// against the file name and the records; the frontier (the Merkle state
// before first_seq) against the previous segment, or, when retention removed
// that, against the next checkpoint's root.
type segHeader struct {
	Version  int      `json:"watcher_ledger"`
	Ledger   string   `json:"ledger"`
	Key      string   `json:"key"`
	FirstSeq uint64   `json:"first_seq"`
	Prev     string   `json:"prev"`
	Frontier []string `json:"frontier"`
}

const headerVersion = 1

func renderHeader(id, vkey string, first uint64, prev tlog.Hash, fr *frontier) []byte {
	b := []byte(`{"watcher_ledger":1,"ledger":`)
	b = appendString(b, id)
	b = append(b, `,"key":`...)
	b = appendString(b, vkey)
	b = append(b, `,"first_seq":`...)
	b = strconv.AppendUint(b, first, 10)
	b = append(b, `,"prev":"`...)
	b = appendHex(b, prev)
	b = append(b, `","frontier":[`...)
	for i, h := range fr.h {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = appendHex(b, h)
		b = append(b, '"')
	}
	return append(b, ']', '}', '\n')
}

// parseHeader parses and checks a header line, returning it with the
// decoded prev hash and frontier.
func parseHeader(line []byte) (*segHeader, tlog.Hash, *frontier, error) {
	var h segHeader
	var prev tlog.Hash
	if len(line) == 0 || line[len(line)-1] != '\n' {
		return nil, prev, nil, errors.New("segment header incomplete")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, prev, nil, fmt.Errorf("segment header: %w", err)
	}
	if h.Version != headerVersion {
		return nil, prev, nil, fmt.Errorf("segment header: unsupported version %d", h.Version)
	}
	if _, err := hexDecode([]byte(h.Prev), prev[:]); err != nil {
		return nil, prev, nil, fmt.Errorf("segment header prev: %w", err)
	}
	fr := &frontier{n: h.FirstSeq}
	for _, s := range h.Frontier {
		var x tlog.Hash
		if _, err := hexDecode([]byte(s), x[:]); err != nil {
			return nil, prev, nil, fmt.Errorf("segment header frontier: %w", err)
		}
		fr.h = append(fr.h, x)
	}
	if !validFrontier(h.FirstSeq, fr.h) {
		return nil, prev, nil, errors.New("segment header frontier does not match first_seq")
	}
	if !bytes.Equal(renderHeader(h.Ledger, h.Key, h.FirstSeq, prev, fr), line) {
		return nil, prev, nil, errors.New("segment header is not in canonical form")
	}
	return &h, prev, fr, nil
}

// lineReader reads newline-terminated lines with bounded memory, tracking
// byte offsets.
type lineReader struct {
	r       *bufio.Reader
	off     int64 // offset of the next line
	scratch []byte
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 256<<10)}
}

// reset starts reading r, reusing the buffer.
func (lr *lineReader) reset(r io.Reader) {
	lr.r.Reset(r)
	lr.off = 0
}

// next returns the next line (with its '\n', or without at EOF for a torn
// tail) and its offset. Lines longer than MaxRecordBytes are skipped up to
// their newline and reported with tooLong and a nil line. At the end it
// returns io.EOF.
func (lr *lineReader) next() (line []byte, off int64, tooLong bool, err error) {
	off = lr.off
	line, err = lr.r.ReadSlice('\n')
	if err == nil || (err == io.EOF && len(line) > 0) {
		lr.off += int64(len(line))
		return line, off, false, nil
	}
	if err != bufio.ErrBufferFull {
		return nil, off, false, err
	}
	lr.scratch = append(lr.scratch[:0], line...)
	for {
		line, err = lr.r.ReadSlice('\n')
		if len(lr.scratch) <= MaxRecordBytes {
			lr.scratch = append(lr.scratch, line...)
		} else {
			lr.off += int64(len(line))
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && err != io.EOF {
			return nil, off, false, err
		}
		if len(lr.scratch) > MaxRecordBytes {
			lr.off += int64(len(lr.scratch))
			return nil, off, true, nil
		}
		lr.off += int64(len(lr.scratch))
		return lr.scratch, off, false, nil
	}
}

// openSegment opens a segment for reading, decompressing if needed. The
// returned counter reports how many bytes of the file were read (for
// progress).
func openSegment(path string, compressed bool) (io.Reader, *countingReader, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	cr := &countingReader{r: f}
	if !compressed {
		return cr, cr, f.Close, nil
	}
	d, err := zstd.NewReader(cr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		f.Close()
		return nil, nil, nil, err
	}
	return d, cr, func() error { d.Close(); return f.Close() }, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// recordTime extracts the event time from a framed record without decoding
// the rest.
func recordTime(f frame) (time.Time, bool) {
	rest := f.body[len(seqPrefix):]
	i := bytes.Index(rest, []byte(`"time":"`))
	if i < 0 {
		return time.Time{}, false
	}
	rest = rest[i+len(`"time":"`):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}
