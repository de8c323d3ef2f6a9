package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	tdnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Witness cosignatures (C2SP tlog-cosignature) are kept with the latest
// checkpoint in DIR/checkpoint: the checkpoint note signed by the ledger
// key, followed by one signature line per witness that cosigned it. A
// witness cosigns only a checkpoint consistent with every one it saw
// before, so a host that rewrites its history (even re-signing it with the
// ledger key) cannot get the rewrite cosigned, and a verifier that trusts
// only the witness keys rejects it.

// Cosigned returns the checkpoint note followed by its cosignatures, as a
// C2SP signed note with several signatures.
func (c *Checkpoint) Cosigned() []byte {
	return append(append([]byte(nil), c.Note...), c.Cosigs...)
}

// ParseWitnessKey parses a witness's verifier key: a C2SP signed-note
// vkey of type cosignature/v1 (0x04), as litewitness prints it. A plain
// Ed25519 key (0x01) of the witness is accepted and read as its
// cosignature/v1 key.
func ParseWitnessKey(vkey string) (note.Verifier, error) {
	v, err := tdnote.NewVerifierForCosignatureV1(strings.TrimSpace(vkey))
	if err != nil {
		return nil, fmt.Errorf("witness key %q: %w", vkey, err)
	}
	return v, nil
}

// ParseCosigned parses a cosigned checkpoint: the ledger's signature
// (checked with v, strictly as ParseCheckpoint does) first, then zero or
// more cosignature lines, returned in Cosigs unverified (see Cosigners).
func ParseCosigned(msg []byte, v note.Verifier) (*Checkpoint, error) {
	i := bytes.LastIndex(msg, []byte("\n\n"))
	if i < 0 {
		return nil, errors.New("checkpoint: not a signed note")
	}
	sigs := msg[i+2:]
	j := bytes.IndexByte(sigs, '\n')
	if j < 0 {
		return nil, errors.New("checkpoint: signature line incomplete")
	}
	c, err := ParseCheckpoint(msg[:i+2+j+1], v)
	if err != nil {
		return nil, err
	}
	rest := sigs[j+1:]
	for k, line := range bytes.SplitAfter(rest, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !bytes.HasPrefix(line, []byte("— ")) || line[len(line)-1] != '\n' || bytes.Count(line, []byte(" ")) != 2 {
			return nil, fmt.Errorf("checkpoint: cosignature line %d malformed", k+1)
		}
	}
	c.Cosigs = append([]byte(nil), rest...)
	return c, nil
}

// Cosigners checks the checkpoint's cosignatures with the witness keys and
// returns the names of the witnesses whose cosignature verifies. A
// cosignature claiming to be from one of them that does not verify is an
// error; cosignatures of other witnesses are ignored.
func (c *Checkpoint) Cosigners(witnesses []note.Verifier) ([]string, error) {
	if len(c.Cosigs) == 0 || len(witnesses) == 0 {
		return nil, nil
	}
	// The ledger's own signature is not checked here (the caller parsed
	// it); a verifier that accepts nothing stands for it so that a note
	// with no witness signature at all is not an error.
	n, err := note.Open(c.Cosigned(), note.VerifierList(witnesses...))
	var unverified *note.UnverifiedNoteError
	if errors.As(err, &unverified) {
		n, err = unverified.Note, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cosignature: %w", err)
	}
	trusted := map[string]bool{}
	for _, w := range witnesses {
		trusted[w.Name()] = true
	}
	for _, s := range n.UnverifiedSigs {
		if trusted[s.Name] {
			return nil, fmt.Errorf("cosignature by %s carries an unknown key hash %08x (altered, or another key of that name)", s.Name, s.Hash)
		}
	}
	var names []string
	seen := map[string]bool{}
	for _, s := range n.Sigs {
		if !seen[s.Name] {
			seen[s.Name] = true
			names = append(names, s.Name)
		}
	}
	return names, nil
}

// CheckpointNotify returns a channel that receives a value whenever a new
// checkpoint was signed (coalesced: one pending value at most).
func (l *Ledger) CheckpointNotify() <-chan struct{} { return l.ckptNotify }

// ProveConsistency returns the RFC 6962 consistency proof from the tree of
// the first old records to checkpoint c, read from the tree hash files and
// checked against c's root.
func (l *Ledger) ProveConsistency(old uint64, c *Checkpoint) (tlog.TreeProof, error) {
	if old > c.Size {
		return nil, fmt.Errorf("consistency proof from %d to %d: old size is larger", old, c.Size)
	}
	if old == 0 || old == c.Size {
		return tlog.TreeProof{}, nil
	}
	if err := l.tilesReady(c.Size); err != nil {
		return nil, err
	}
	p, err := tlog.ProveTree(int64(c.Size), int64(old), hashReader(c.Size, c.Root, l.tiles))
	if err != nil {
		return nil, fmt.Errorf("consistency proof from %d to %d: %w", old, c.Size, err)
	}
	return p, nil
}

// ProveInclusion returns the RFC 6962 inclusion proof of record seq in
// checkpoint c, from the tree hash files.
func (l *Ledger) ProveInclusion(seq uint64, c *Checkpoint) (tlog.RecordProof, error) {
	if seq >= c.Size {
		return nil, fmt.Errorf("record %d is not covered by the checkpoint (size %d)", seq, c.Size)
	}
	if err := l.tilesReady(c.Size); err != nil {
		return nil, err
	}
	p, err := tlog.ProveRecord(int64(c.Size), int64(seq), hashReader(c.Size, c.Root, l.tiles))
	if err != nil {
		return nil, fmt.Errorf("inclusion proof of %d in %d: %w", seq, c.Size, err)
	}
	return p, nil
}

func (l *Ledger) tilesReady(size uint64) error {
	l.tiles.mu.RLock()
	defer l.tiles.mu.RUnlock()
	if l.tiles.err != nil {
		return l.tiles.err
	}
	if l.tiles.n[0] < size {
		return fmt.Errorf("tree hash files cover %d records, not %d yet", l.tiles.n[0], size)
	}
	return nil
}

// ErrStaleCheckpoint is returned by AddCosignatures for a checkpoint that
// is no longer the latest (a newer one needs cosigning instead).
var ErrStaleCheckpoint = errors.New("checkpoint is no longer the latest")

// AddCosignatures stores cosignature lines (as a witness returned them,
// already verified by the caller) with the latest checkpoint, which must
// have the given size. A cosignature by a key already present replaces
// nothing: the first one is kept.
func (l *Ledger) AddCosignatures(size uint64, sigs []byte) error {
	l.ckptMu.Lock()
	defer l.ckptMu.Unlock()
	l.mu.Lock()
	c := l.lastCkpt
	l.mu.Unlock()
	if c == nil || c.Size != size {
		return fmt.Errorf("cosignatures for size %d: %w", size, ErrStaleCheckpoint)
	}
	have := map[string]bool{}
	for _, line := range strings.SplitAfter(string(c.Cosigs), "\n") {
		if name, _, ok := sigKey(line); ok {
			have[name] = true
		}
	}
	nc := *c
	nc.Cosigs = append([]byte(nil), c.Cosigs...)
	added := false
	for _, line := range strings.SplitAfter(string(sigs), "\n") {
		name, _, ok := sigKey(line)
		if !ok || !strings.HasSuffix(line, "\n") {
			if strings.TrimSpace(line) != "" {
				return fmt.Errorf("cosignature line %q malformed", line)
			}
			continue
		}
		if have[name] {
			continue
		}
		have[name] = true
		nc.Cosigs = append(nc.Cosigs, line...)
		added = true
	}
	if !added {
		return nil
	}
	if err := writeFileSync(filepath.Join(l.dir, latestName), nc.Cosigned(), 0o644, false); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(l.dir, latestName), err)
	}
	// The history keeps the cosigned note too: the next checkpoint
	// replaces DIR/checkpoint before witnesses cosign it. (Appended after
	// DIR/checkpoint is written, so a torn append is a prefix of it.)
	if err := appendHistory(l.dir, nc.Cosigned()); err != nil {
		return err
	}
	l.mu.Lock()
	if l.lastCkpt == c {
		l.lastCkpt = &nc
	}
	l.mu.Unlock()
	return nil
}

// sigKey returns the key name and base64 of a signature line.
func sigKey(line string) (name, b64 string, ok bool) {
	rest, ok := strings.CutPrefix(line, "— ")
	if !ok {
		return "", "", false
	}
	name, b64, ok = strings.Cut(strings.TrimSuffix(rest, "\n"), " ")
	return name, b64, ok && name != "" && b64 != ""
}

// writeLatest stores c (a new checkpoint, no cosignatures yet) as
// DIR/checkpoint. Called with ckptMu held.
func (l *Ledger) writeLatest(c *Checkpoint) error {
	path := filepath.Join(l.dir, latestName)
	if err := writeFileSync(path, c.Cosigned(), 0o644, false); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", path, err)
	}
	return nil
}

// readLatest reads DIR/checkpoint, or returns nil when absent.
func readLatest(dir string, v note.Verifier) (*Checkpoint, error) {
	path := filepath.Join(dir, latestName)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	c, err := ParseCosigned(data, v)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	c.File = path
	return c, nil
}
