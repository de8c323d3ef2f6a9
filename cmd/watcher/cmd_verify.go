package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
)

func init() {
	register("verify", command{Summary: "verify a ledger (or, with --export, a Collector's copy) offline: exit 0 clean, 1 tampered, 2 unreadable", Run: runVerify})
}

// checkpointFiles collects repeated --checkpoint flags.
type checkpointFiles []string

func (c *checkpointFiles) String() string     { return fmt.Sprint(*c) }
func (c *checkpointFiles) Set(s string) error { *c = append(*c, s); return nil }

// progressThreshold is the ledger size from which verify reports progress.
const progressThreshold = 64 << 20

func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if wantsExport(args) {
		return runVerifyExport(args, stdout, stderr)
	}
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	pub := fs.String("pubkey", "", "checkpoint verifier key file (default DIR/ledger.pub; use a copy kept off the host)")
	var ckpts checkpointFiles
	fs.Var(&ckpts, "checkpoint", "a signed checkpoint kept elsewhere that the ledger must match (repeatable)")
	var witnesses checkpointFiles
	fs.Var(&witnesses, "witness", "a trusted witness's verifier key, or a file holding it (repeatable): a checkpoint that matches the records must carry their cosignatures")
	quorum := fs.Int("quorum", 0, "how many of the --witness keys must have cosigned (default all)")
	decode := fs.Bool("decode", false, "also decode every record's event")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("quiet", false, "no progress output")
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher verify [flags] DIR\n\nExit status: 0 clean, 1 tampered or inconsistent, 2 unreadable.", 1)
	if err != nil {
		return err
	}
	dir := pos[0]
	if _, err := os.Stat(dir); err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("ledger directory: %w", err)}
	}
	_, vkey, err := loadVerifier(*pub, dir, stderr)
	if err != nil {
		return err
	}
	wkeys, err := witnessKeys(witnesses)
	if err != nil {
		return err
	}
	if *quorum < 0 || *quorum > len(wkeys) {
		return &exitError{Code: 2, Err: fmt.Errorf("--quorum %d: want 1..%d (the number of --witness keys)", *quorum, len(wkeys))}
	}
	opts := ledger.VerifyOptions{PubKey: vkey, Decode: *decode, Checkpoints: map[string][]byte{}, Witnesses: wkeys, Quorum: *quorum}
	for _, c := range ckpts {
		data, err := os.ReadFile(c)
		if err != nil {
			return &exitError{Code: 2, Err: fmt.Errorf("read checkpoint: %w", err)}
		}
		opts.Checkpoints[c] = data
	}
	if !*quiet {
		var last time.Time
		opts.Progress = func(p ledger.Progress) {
			if p.BytesTotal < progressThreshold || (time.Since(last) < time.Second && p.BytesDone < p.BytesTotal) {
				return
			}
			last = time.Now()
			fmt.Fprintf(stderr, "verify: %3.0f%% %d/%d MB, %d records, %s\n", 100*float64(p.BytesDone)/float64(p.BytesTotal),
				p.BytesDone>>20, p.BytesTotal>>20, p.Records, filepath.Base(p.File))
		}
	}
	start := time.Now()
	rep, err := ledger.VerifyDir(dir, opts)
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		took := time.Since(start)
		var gaps []audit.Event
		var gapsErr error
		if rep.OK() {
			gaps, gapsErr = agentGaps(ctx, dir, rep.Bytes)
		}
		printReport(stdout, rep, took, gaps, gapsErr)
	}
	if !rep.OK() {
		msg := "ledger does not verify"
		if rep.FirstBad != nil {
			msg = "first bad record: " + rep.FirstBad.String()
		} else {
			msg = rep.Problems[0].String()
		}
		return &exitError{Code: 1, Err: fmt.Errorf("%s: %s", dir, msg)}
	}
	return nil
}

func printReport(w io.Writer, r *ledger.Report, took time.Duration, gaps []audit.Event, gapsErr error) {
	fmt.Fprintf(w, "ledger %s in %s\n", r.LedgerID, r.Dir)
	fmt.Fprintf(w, "  records   %d checked in %d segments, %d bytes, %s\n",
		r.Records, r.Segments, r.Bytes, took.Round(time.Millisecond))
	if r.Covered > 0 {
		fmt.Fprintf(w, "  signed    %d checkpoints matched; records 0..%d covered", r.Checkpoints, r.Covered-1)
	} else {
		fmt.Fprintf(w, "  signed    no checkpoint matched")
	}
	if r.OK() && r.NextSeq > r.Covered {
		fmt.Fprintf(w, "; %d later records rest on the hash chain alone", r.NextSeq-r.Covered)
	}
	fmt.Fprintln(w)
	if len(r.WitnessedBy) > 0 {
		fmt.Fprintf(w, "  witnessed records 0..%d cosigned by %s", r.Witnessed-1, strings.Join(r.WitnessedBy, ", "))
		if r.OK() && r.NextSeq > r.Witnessed {
			fmt.Fprintf(w, "; %d later records rest on the ledger key alone", r.NextSeq-r.Witnessed)
		}
		fmt.Fprintln(w)
	}
	if r.FirstSeq > 0 {
		fmt.Fprintf(w, "  retention records before %d were removed (stated in the chain)\n", r.RemovedBefore)
	}
	if r.LossRecords > 0 || r.Recoveries > 0 {
		fmt.Fprintf(w, "  losses    %d loss records, %d events known lost; %d torn tails recovered\n", r.LossRecords, r.Lost, r.Recoveries)
	}
	printGaps(w, gaps, gapsErr)
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "  warning   %s\n", s)
	}
	if r.OK() {
		fmt.Fprintln(w, "OK")
		return
	}
	if r.FirstBad != nil {
		fmt.Fprintf(w, "TAMPERED: first bad record: %s\n", r.FirstBad)
	} else {
		fmt.Fprintln(w, "TAMPERED")
	}
	for _, p := range r.Problems {
		if r.FirstBad == nil || p != *r.FirstBad {
			fmt.Fprintf(w, "  problem   %s\n", p)
		}
	}
}

// witnessKeys reads --witness values: a verifier key, or a file holding
// one.
func witnessKeys(args []string) ([]string, error) {
	var keys []string
	for _, a := range args {
		k := a
		if data, err := os.ReadFile(a); err == nil {
			k = strings.TrimSpace(string(data))
		}
		if _, err := ledger.ParseWitnessKey(k); err != nil {
			return nil, &exitError{Code: 2, Err: fmt.Errorf("--witness %s: %w", a, err)}
		}
		keys = append(keys, k)
	}
	return keys, nil
}
