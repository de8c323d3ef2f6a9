// Package witness submits the ledger's checkpoints to C2SP tlog-witness
// services and keeps their cosignatures.
//
// A witness cosigns a checkpoint only when it is consistent with the last
// one it cosigned for the same log (the client sends a consistency proof
// from that size), so once a checkpoint is cosigned, no rewritten history
// can be: the host's root may hold the ledger key, but not the witnesses'.
// The Cosigner submits every new checkpoint to every witness, retries with
// backoff while a witness is unreachable (a later checkpoint with a proof
// from the witness's size covers everything in between, so nothing is
// lost), stores the cosignatures next to the checkpoint, and reports a
// witness that refuses the history (409 with a larger size, 422) as an
// alert.
package witness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/ledger"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Witness is one witness: where it is and the key it cosigns with.
type Witness struct {
	// URL is the witness's base URL; checkpoints are POSTed to
	// URL/add-checkpoint.
	URL string
	// Key is the witness's verifier key (cosignature/v1 vkey).
	Key string
	// Name is the key's name, as in its cosignature lines.
	Name     string
	verifier note.Verifier
}

// New parses a witness's URL and verifier key.
func New(rawURL, vkey string) (*Witness, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("witness URL %q: want http(s)://host[:port][/path]", rawURL)
	}
	v, err := ledger.ParseWitnessKey(vkey)
	if err != nil {
		return nil, err
	}
	return &Witness{URL: strings.TrimSuffix(rawURL, "/"), Key: strings.TrimSpace(vkey), Name: v.Name(), verifier: v}, nil
}

// Verifier returns the verifier of the witness's cosignatures.
func (w *Witness) Verifier() note.Verifier { return w.verifier }

// ConflictError is a 409 answer: the witness's latest cosigned size for
// the log is not the old size sent.
type ConflictError struct {
	Known uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("witness has cosigned size %d (409 conflict)", e.Known)
}

// Refusals by the witness.
var (
	// ErrInconsistent is a 422 answer: the consistency proof does not lead
	// from the witness's checkpoint to the one sent, the histories differ.
	ErrInconsistent = errors.New("witness refused the consistency proof (422): the ledger's history differs from what it cosigned")
	// ErrUnknownLog is a 403 answer: the witness does not know the log's
	// origin or key.
	ErrUnknownLog = errors.New("witness does not know this ledger or its key (403)")
)

// AddCheckpoint sends one C2SP tlog-witness add-checkpoint request: the
// old size the proof starts from, the consistency proof, and the signed
// checkpoint. It returns the witness's cosignature line(s), verified with
// its key against the checkpoint.
func (w *Witness) AddCheckpoint(ctx context.Context, hc *http.Client, old uint64, proof tlog.TreeProof, checkpoint []byte) ([]byte, error) {
	var body bytes.Buffer
	fmt.Fprintf(&body, "old %d\n", old)
	for _, h := range proof {
		body.WriteString(h.String())
		body.WriteByte('\n')
	}
	body.WriteByte('\n')
	body.Write(checkpoint)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/add-checkpoint", &body)
	if err != nil {
		return nil, fmt.Errorf("witness %s: %w", w.Name, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("witness %s: %w", w.Name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("witness %s: read answer: %w", w.Name, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusConflict:
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("witness %s: 409 with malformed size %q", w.Name, data)
		}
		return nil, &ConflictError{Known: n}
	case http.StatusUnprocessableEntity:
		return nil, ErrInconsistent
	case http.StatusForbidden, http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", ErrUnknownLog, strings.TrimSpace(string(data)))
	default:
		return nil, fmt.Errorf("witness %s: HTTP %d: %s", w.Name, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return w.checkCosignature(checkpoint, data)
}

// checkCosignature keeps the answer's lines that are a valid cosignature
// of checkpoint by this witness.
func (w *Witness) checkCosignature(checkpoint, answer []byte) ([]byte, error) {
	var good []byte
	for _, line := range bytes.SplitAfter(answer, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if line[len(line)-1] != '\n' {
			line = append(line, '\n')
		}
		n, err := note.Open(append(append([]byte(nil), checkpoint...), line...), note.VerifierList(w.verifier))
		if err != nil {
			continue // another key's line, or not a signature
		}
		for _, s := range n.Sigs {
			if s.Name == w.verifier.Name() && s.Hash == w.verifier.KeyHash() {
				good = append(good, line...)
			}
		}
	}
	if good == nil {
		return nil, fmt.Errorf("witness %s: answer holds no valid cosignature by %s", w.Name, w.Key)
	}
	return good, nil
}

// backoff returns the wait before retry n (0-based): min doubling up to
// max, with up to 25% jitter so a fleet does not retry in step.
func backoff(n int, minD, maxD time.Duration) time.Duration {
	d := minD
	for i := 0; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	return d - time.Duration(float64(d)*0.25*jitter())
}
