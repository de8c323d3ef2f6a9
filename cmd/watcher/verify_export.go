package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport"
	"github.com/watcherhq/watcher/internal/textesc"
	"golang.org/x/mod/sumdb/note"
)

// wantsExport reports whether verify's arguments ask for --export.
func wantsExport(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--export" || a == "-export" || strings.HasPrefix(a, "--export=") || strings.HasPrefix(a, "-export=") {
			return true
		}
	}
	return false
}

// runVerifyExport checks a central copy of exported records: the
// OpenTelemetry Collector file exporter's output.
func runVerifyExport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("verify --export", flag.ContinueOnError)
	file := fs.String("export", "", "a Collector file exporter's output (OTLP JSON lines) holding watcher's exported records")
	var pubs checkpointFiles
	fs.Var(&pubs, "pubkey", "a host's ledger verifier key file (ledger.pub), kept off the host (repeatable, one per ledger)")
	var witnesses checkpointFiles
	fs.Var(&witnesses, "witness", "a trusted witness's verifier key, or a file holding it (repeatable): the proving checkpoint must carry their cosignatures")
	quorum := fs.Int("quorum", 0, "how many of the --witness keys must have cosigned (default all)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if _, err := ledgerParse(fs, args, stderr, "Usage: watcher verify --export FILE [--pubkey FILE]... [--witness KEY]...\n\nProves records a central store received from watcher's OTLP export: each is\nincluded in its host's signed checkpoint, and nothing between received records\nis missing without a gap or loss the host recorded.\nExit status: 0 proven, 1 missing or tampered, 2 unreadable.", 0); err != nil {
		return err
	}
	keys := map[string]string{}
	for _, p := range pubs {
		_, vkey, err := ledger.ReadPublicKey(p)
		if err != nil {
			return &exitError{Code: 2, Err: err}
		}
		name, _, _ := strings.Cut(vkey, "+")
		keys[strings.TrimPrefix(name, "watcher-ledger/")] = vkey
	}
	wkeys, err := witnessKeys(witnesses)
	if err != nil {
		return err
	}
	if *quorum < 0 || *quorum > len(wkeys) {
		return &exitError{Code: 2, Err: fmt.Errorf("--quorum %d: want 1..%d (the number of --witness keys)", *quorum, len(wkeys))}
	}
	var wvs []note.Verifier
	for _, k := range wkeys {
		v, err := ledger.ParseWitnessKey(k)
		if err != nil {
			return &exitError{Code: 2, Err: err}
		}
		wvs = append(wvs, v)
	}
	f, err := os.Open(*file)
	if err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("export file: %w", err)}
	}
	defer f.Close()
	reps, err := otlpexport.VerifyWitnessed(f, keys, wvs, *quorum)
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	if len(reps) == 0 {
		return &exitError{Code: 2, Err: fmt.Errorf("%s holds no watcher records", *file)}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(reps); err != nil {
			return err
		}
	} else {
		for _, r := range reps {
			printExportReport(stdout, r)
		}
	}
	bad := 0
	for _, r := range reps {
		if !r.OK() {
			bad++
		}
	}
	if bad > 0 {
		return &exitError{Code: 1, Err: fmt.Errorf("%d of %d ledgers in the export are not proven complete", bad, len(reps))}
	}
	return nil
}

func printExportReport(w io.Writer, r *otlpexport.LedgerReport) {
	key := "given"
	if r.KeyFromExport {
		key = "taken from the export itself: this shows consistency, not authenticity (pass --pubkey)"
	}
	fmt.Fprintf(w, "ledger %s (key %s)\n", textesc.String(r.ID), key)
	fmt.Fprintf(w, "  records received: %d (%d duplicates)\n", r.Records, r.Duplicates)
	if r.Checkpoint > 0 {
		fmt.Fprintf(w, "  checkpoint of %d records: %d received records proven included", r.Checkpoint, r.Proven)
		if r.Unproven > 0 {
			fmt.Fprintf(w, ", %d covered by a gap as well (chain checked only)", r.Unproven)
		}
		fmt.Fprintf(w, "; %d past it await the next checkpoint\n", r.Pending)
		if len(r.Cosigners) > 0 {
			fmt.Fprintf(w, "  checkpoint cosigned by %s\n", textesc.String(strings.Join(r.Cosigners, ", ")))
		}
	} else {
		fmt.Fprintf(w, "  no valid checkpoint received: inclusion not proven\n")
	}
	var parts []string
	for _, reason := range []string{otlpexport.ReasonFiltered, otlpexport.ReasonThrottled, otlpexport.ReasonDropped, otlpexport.ReasonBefore} {
		if n := r.Gaps[reason]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, reason))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "  not exported, accounted for by gaps: %s\n", strings.Join(parts, ", "))
	}
	stages := make([]string, 0, len(r.Losses))
	for s := range r.Losses {
		stages = append(stages, s)
	}
	slices.Sort(stages)
	for _, s := range stages {
		fmt.Fprintf(w, "  loss recorded by the host: %s: %d\n", textesc.String(s), r.Losses[s])
	}
	for _, u := range r.Unaccounted {
		fmt.Fprintf(w, "  MISSING: records %d..%d with no gap or loss recorded\n", u.From, u.To-1)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", textesc.String(p))
	}
	if r.OK() {
		fmt.Fprintf(w, "  ok: complete and proven\n")
	}
}
