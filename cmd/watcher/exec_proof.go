package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/witness"
	"golang.org/x/mod/sumdb/note"
)

// proofWait bounds how long `watcher exec --proof` waits for a checkpoint
// covering the run and for the witnesses to cosign it.
var proofWait = 2 * time.Minute

// runProofStart returns the ledger's next record number before the run:
// the run's records come after it.
func runProofStart(a *agent.Agent, socket string) uint64 {
	if a != nil {
		return a.Status().Ledger.HeadSeq + 1
	}
	if st, err := control.NewClient(socket).Status(); err == nil {
		return st.Ledger.HeadSeq + 1
	}
	return 0
}

// writeRunProof writes the run proof of the records of the run in leaf
// cgroup cg (from record `from` on) to file. With a private agent (already
// stopped) it reopens the ledger, has the witnesses cosign its final
// checkpoint and builds the proof; with a running agent it waits for the
// agent's next checkpoint that covers the run and carries the witnesses'
// cosignatures.
func writeRunProof(ctx context.Context, pol *policy.Policy, running bool, socket string, cg, from uint64, file string, stderr io.Writer) error {
	if cg == 0 {
		return errors.New("--proof: the run has no cgroup (it did not start)")
	}
	dir := pol.Agent.LedgerDir
	ctx, cancel := context.WithTimeout(ctx, proofWait)
	defer cancel()
	ws, err := agent.Witnesses(pol)
	if err != nil {
		return err
	}
	match := func(r *ledger.Record) bool { return r.Event.Process.CgroupID == cg || r.Event.Sandbox.CgroupID == cg }
	var c *ledger.Checkpoint
	if running {
		// Best effort: an older agent signs at its next interval.
		control.NewClient(socket).Checkpoint()
		c, err = awaitCheckpoint(ctx, dir, from, len(ws), match, stderr)
	} else {
		c, err = cosignClosed(ctx, dir, ws)
	}
	if err != nil {
		return fmt.Errorf("--proof: %w", err)
	}
	recs, _, err := ledger.RunRecords(dir, from, func(r *ledger.Record) bool { return r.Seq < c.Size && match(r) })
	if err != nil {
		return fmt.Errorf("--proof: %w", err)
	}
	if len(recs) == 0 {
		return fmt.Errorf("--proof: the ledger holds no record of cgroup %d", cg)
	}
	_, vkey, err := ledger.ReadPublicKey(filepath.Join(dir, "ledger.pub"))
	if err != nil {
		return fmt.Errorf("--proof: %w", err)
	}
	data, err := ledger.BuildRunProof(dir, c, vkey, recs)
	if err != nil {
		return fmt.Errorf("--proof: %w", err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return fmt.Errorf("--proof: %w", err)
	}
	fmt.Fprintf(stderr, "watcher: proof of %d records (checkpoint size %d, %d of %d witnesses) written to %s\n",
		len(recs), c.Size, cosigners(c, ws), len(ws), file)
	return nil
}

// cosignClosed reopens the (closed) ledger, submits its latest checkpoint
// to the witnesses and waits for all of them.
func cosignClosed(ctx context.Context, dir string, ws []*witness.Witness) (*ledger.Checkpoint, error) {
	l, err := ledger.Open(dir, ledger.Options{Compress: true})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	c, err := l.Checkpoint()
	if err != nil {
		return nil, err
	}
	if len(ws) > 0 {
		cs := witness.Start(l, witness.Options{Witnesses: ws})
		err = cs.Wait(ctx, c.Size, len(ws))
		cs.Stop()
		if err != nil {
			return nil, fmt.Errorf("witnesses: %w (status %+v)", err, cs.Status())
		}
	}
	return l.LastCheckpoint(), nil
}

// awaitCheckpoint waits for the running agent's checkpoint that covers
// the run's records and carries the cosignatures of all witnesses.
func awaitCheckpoint(ctx context.Context, dir string, from uint64, nw int, match func(*ledger.Record) bool, stderr io.Writer) (*ledger.Checkpoint, error) {
	v, _, err := ledger.ReadPublicKey(filepath.Join(dir, "ledger.pub"))
	if err != nil {
		return nil, err
	}
	recs, _, err := ledger.RunRecords(dir, from, match)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, errors.New("the agent's ledger holds no record of the run")
	}
	need := recs[len(recs)-1].Seq + 1
	told := false
	for {
		data, _, err := ledger.LatestCheckpoint(dir)
		if err == nil {
			if c, err := ledger.ParseCosigned(data, v); err == nil && c.Size >= need && countLines(c.Cosigs) >= nw {
				return c, nil
			}
		}
		if !told {
			fmt.Fprintf(stderr, "watcher: waiting for the agent's next cosigned checkpoint (covering record %d)\n", need-1)
			told = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no cosigned checkpoint covering record %d within %s", need-1, proofWait)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func countLines(b []byte) int {
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}

func cosigners(c *ledger.Checkpoint, ws []*witness.Witness) int {
	n := 0
	for _, w := range ws {
		if names, err := c.Cosigners([]note.Verifier{w.Verifier()}); err == nil && len(names) > 0 {
			n++
		}
	}
	return n
}
