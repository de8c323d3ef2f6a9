package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/transparency-dev/formats/proof"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// A run proof shows offline that some records (those of one `watcher exec`
// run) are in the ledger, to someone who trusts only the witnesses' keys
// (and, optionally, the ledger's). It is a sequence of C2SP tlog-proofs,
// one per record, each complete on its own:
//
//	c2sp.org/tlog-proof@v1
//	extra <base64 of: ledger verifier key "\n" record line>
//	index <seq>
//	<inclusion proof, one base64 hash per line>
//
//	<checkpoint, with the ledger's signature and the witnesses' cosignatures>
//
// The record line is what the ledger stores (without its newline); its
// hash is the leaf the inclusion proof starts from. The ledger key in
// extra is not trusted: it only lets the ledger's signature be checked
// without --pubkey; the witnesses' cosignatures are what vouch for the
// checkpoint. The encoding is canonical: any changed byte fails the check.

const runProofHeader = "c2sp.org/tlog-proof@v1\n"

// RunProofRecord is a record a run proof covers.
type RunProofRecord struct {
	Seq  uint64
	Line []byte // as stored, without the newline
}

// BuildRunProof writes the proofs of records (in seq order) against the
// cosigned checkpoint c of the ledger in dir, from its tree hash files.
func BuildRunProof(dir string, c *Checkpoint, ledgerKey string, records []RunProofRecord) ([]byte, error) {
	if len(records) == 0 {
		return nil, errors.New("run proof: no records")
	}
	hr := hashReader(c.Size, c.Root, OpenTiles(dir))
	var out bytes.Buffer
	for i, r := range records {
		if r.Seq >= c.Size {
			return nil, fmt.Errorf("run proof: record %d is not covered by checkpoint size %d", r.Seq, c.Size)
		}
		if i > 0 && r.Seq <= records[i-1].Seq {
			return nil, errors.New("run proof: records out of order")
		}
		hashes, err := tlog.ProveRecord(int64(c.Size), int64(r.Seq), hr)
		if err != nil {
			return nil, fmt.Errorf("run proof: record %d: %w", r.Seq, err)
		}
		p := proof.TLogProof{Index: r.Seq, Checkpoint: c.Cosigned(),
			ExtraData: append([]byte(strings.TrimSpace(ledgerKey)+"\n"), r.Line...)}
		for _, h := range hashes {
			p.Hashes = append(p.Hashes, h)
		}
		out.Write(p.Marshal())
	}
	return out.Bytes(), nil
}

// RunProofOptions say whom CheckRunProof trusts.
type RunProofOptions struct {
	// Witnesses are the trusted witnesses' verifier keys; at least Quorum
	// of them (0: all) must have cosigned the checkpoint.
	Witnesses []string
	Quorum    int
	// PubKey, when set, is the ledger's verifier key the proof must use.
	PubKey string
}

// RunProofResult is what a valid run proof shows.
type RunProofResult struct {
	Checkpoint  *Checkpoint
	WitnessedBy []string
	Records     []Record
}

// CheckRunProof checks a run proof offline: its canonical form, for every
// record its hash and inclusion proof, the ledger's signature on the
// checkpoint, and the cosignatures of a quorum of the witnesses. Every
// signature line must be one the checker can verify.
func CheckRunProof(data []byte, opts RunProofOptions) (*RunProofResult, error) {
	var wvs []note.Verifier
	for _, k := range opts.Witnesses {
		v, err := ParseWitnessKey(k)
		if err != nil {
			return nil, err
		}
		wvs = append(wvs, v)
	}
	quorum := opts.Quorum
	if quorum <= 0 {
		quorum = len(wvs)
	}
	if quorum > len(wvs) {
		return nil, fmt.Errorf("quorum %d is more than the %d witnesses given", quorum, len(wvs))
	}
	chunks, err := splitRunProof(data)
	if err != nil {
		return nil, err
	}
	res := &RunProofResult{}
	var ledgerKey string
	var prev uint64
	for i, chunk := range chunks {
		var p proof.TLogProof
		if err := p.Unmarshal(chunk); err != nil {
			return nil, fmt.Errorf("proof %d: %w", i+1, err)
		}
		if !bytes.Equal(p.Marshal(), chunk) {
			return nil, fmt.Errorf("proof %d: not in canonical form", i+1)
		}
		key, line, ok := bytes.Cut(p.ExtraData, []byte("\n"))
		if !ok {
			return nil, fmt.Errorf("proof %d: extra data is not a ledger key and a record", i+1)
		}
		if i == 0 {
			ledgerKey = string(key)
			if opts.PubKey != "" && strings.TrimSpace(opts.PubKey) != ledgerKey {
				return nil, fmt.Errorf("proof is for ledger key %s, not the one given", ledgerKey)
			}
			lv, err := note.NewVerifier(ledgerKey)
			if err != nil {
				return nil, fmt.Errorf("proof %d: ledger key: %w", i+1, err)
			}
			c, err := ParseCosigned(p.Checkpoint, lv)
			if err != nil {
				return nil, fmt.Errorf("proof %d: %w", i+1, err)
			}
			if res.WitnessedBy, err = strictCosigners(c, wvs); err != nil {
				return nil, fmt.Errorf("proof %d: %w", i+1, err)
			}
			if len(res.WitnessedBy) < quorum {
				return nil, fmt.Errorf("checkpoint carries cosignatures of %d of the %d witnesses given, need %d", len(res.WitnessedBy), len(wvs), quorum)
			}
			res.Checkpoint = c
		} else if string(key) != ledgerKey || !bytes.Equal(p.Checkpoint, res.Checkpoint.Cosigned()) {
			return nil, fmt.Errorf("proof %d: another ledger key or checkpoint than the first proof's", i+1)
		}
		c := res.Checkpoint
		rec, err := DecodeRecord(line)
		if err != nil {
			return nil, fmt.Errorf("proof %d: record: %w", i+1, err)
		}
		if rec.Seq != p.Index {
			return nil, fmt.Errorf("proof %d: index %d but the record is %d", i+1, p.Index, rec.Seq)
		}
		if i > 0 && p.Index <= prev {
			return nil, fmt.Errorf("proof %d: records out of order", i+1)
		}
		prev = p.Index
		if p.Index >= c.Size {
			return nil, fmt.Errorf("proof %d: record %d is beyond the checkpoint (size %d)", i+1, p.Index, c.Size)
		}
		hashes := make(tlog.RecordProof, len(p.Hashes))
		for j, h := range p.Hashes {
			hashes[j] = h
		}
		if err := tlog.CheckRecord(hashes, int64(c.Size), c.Root, int64(p.Index), rec.Hash); err != nil {
			return nil, fmt.Errorf("proof %d: record %d: inclusion proof does not lead to the checkpoint's root: %w", i+1, p.Index, err)
		}
		res.Records = append(res.Records, rec)
	}
	return res, nil
}

// strictCosigners verifies the cosignatures and refuses any it cannot.
func strictCosigners(c *Checkpoint, wvs []note.Verifier) ([]string, error) {
	if len(c.Cosigs) == 0 {
		return nil, nil
	}
	n, err := note.Open(c.Cosigned(), note.VerifierList(wvs...))
	var unverified *note.UnverifiedNoteError
	if errors.As(err, &unverified) {
		n, err = unverified.Note, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cosignature: %w", err)
	}
	// The ledger's own signature is the one unverified here.
	if len(n.UnverifiedSigs) > 1 {
		s := n.UnverifiedSigs[1]
		return nil, fmt.Errorf("cosignature by %s (key hash %08x) cannot be verified with the witness keys given", s.Name, s.Hash)
	}
	var names []string
	for _, s := range n.Sigs {
		names = append(names, s.Name)
	}
	return names, nil
}

// splitRunProof cuts a run proof into its tlog-proofs.
func splitRunProof(data []byte) ([][]byte, error) {
	if !bytes.HasPrefix(data, []byte(runProofHeader)) {
		return nil, errors.New("not a tlog-proof (first line is not c2sp.org/tlog-proof@v1)")
	}
	var out [][]byte
	for len(data) > 0 {
		next := bytes.Index(data[1:], []byte("\n"+runProofHeader))
		if next < 0 {
			out = append(out, data)
			break
		}
		out = append(out, data[:next+2])
		data = data[next+2:]
	}
	return out, nil
}

// RunRecords returns the records from seq `from` on that match, with
// their stored lines, reading dir (also while a writer appends).
func RunRecords(dir string, from uint64, match func(*Record) bool) ([]RunProofRecord, []*Record, error) {
	r, err := NewReaderFrom(dir, from)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	var out []RunProofRecord
	var recs []*Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, recs, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if rec.Seq < from || !match(rec) {
			continue
		}
		out = append(out, RunProofRecord{Seq: rec.Seq, Line: bytes.TrimSuffix(rec.Raw, []byte("\n"))})
		recs = append(recs, rec)
	}
}
