package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/textesc"
	"golang.org/x/mod/sumdb/note"
)

func init() {
	register("ledger", command{Summary: "read the audit ledger: cat, prove, check-proof, checkpoint, pubkey, keygen", Run: runLedger})
	register("replay", command{Summary: "print ledger records with filters; --call ID / --session S: one tool call or session end to end", Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runLedgerCat(ctx, "replay", args, stdout, stderr)
	}})
}

const ledgerUsage = `Usage: watcher ledger SUBCOMMAND [flags] [args]

Subcommands:
  cat DIR                  print records (filters: --since --until --sandbox --kind --verdict --call --session; --json)
  prove DIR SEQ            print an inclusion proof of record SEQ in the latest (or --checkpoint) checkpoint
  check-proof FILE         check a proof offline: a bundle from exec --proof against --witness keys,
                           a proof from prove against --pubkey
  checkpoint DIR           print the latest signed checkpoint (copy it off the host)
  pubkey DIR               print the ledger's checkpoint verifier key
  keygen FILE              create a signing key (mode 0600) and print its verifier key

Verify a whole ledger with 'watcher verify DIR'.`

func runLedger(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, ledgerUsage)
		if len(args) == 0 {
			return &exitError{Code: 2, Err: errors.New("ledger: no subcommand given")}
		}
		return errHelpShown
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "cat":
		return runLedgerCat(ctx, "ledger cat", rest, stdout, stderr)
	case "prove":
		return runLedgerProve(rest, stdout, stderr)
	case "check-proof":
		return runLedgerCheckProof(rest, stdout, stderr)
	case "checkpoint":
		return runLedgerCheckpoint(rest, stdout, stderr)
	case "pubkey":
		return runLedgerPubkey(rest, stdout, stderr)
	case "keygen":
		return runLedgerKeygen(rest, stdout, stderr)
	}
	fmt.Fprintln(stderr, ledgerUsage)
	return &exitError{Code: 2, Err: fmt.Errorf("ledger: unknown subcommand %q", sub)}
}

// ledgerParse parses flags that may come before or after the positional
// arguments, and checks the positional count.
func ledgerParse(fs *flag.FlagSet, args []string, stderr io.Writer, usage string, nargs int) ([]string, error) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelpShown
			}
			return nil, &exitError{Code: 2, Err: err}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != nargs {
		fs.Usage()
		return nil, &exitError{Code: 2, Err: fmt.Errorf("want %d argument(s), got %d", nargs, len(pos))}
	}
	return pos, nil
}

// recordFilter selects records for cat and replay.
type recordFilter struct {
	since, until time.Time
	sandboxes    map[string]bool
	kinds        map[audit.Kind]bool
	verdicts     map[audit.Verdict]bool
	// callID and session select tool calls (replay --call/--session): the
	// gateway's records of a call and the kernel events labelled with it.
	callID, session string
	sessionCalls    map[string]bool
}

func (f *recordFilter) match(e *audit.Event) bool {
	if !f.since.IsZero() && e.Time.Before(f.since) {
		return false
	}
	if !f.until.IsZero() && !e.Time.Before(f.until) {
		return false
	}
	if f.sandboxes != nil && !f.sandboxes[e.Sandbox.Name] && !f.sandboxes[strconv.FormatUint(e.Sandbox.CgroupID, 10)] {
		return false
	}
	if f.kinds != nil && !f.kinds[e.Kind] {
		return false
	}
	if f.verdicts != nil && !f.verdicts[e.Verdict] {
		return false
	}
	return f.matchCall(e)
}

// parseWhen accepts RFC 3339 or a duration before now ("2h").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("time %q: want RFC 3339 (2025-01-02T15:04:05Z) or a duration ago (90m)", s)
}

func listSet(s string) map[string]bool {
	if s == "" {
		return nil
	}
	m := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			m[p] = true
		}
	}
	return m
}

func runLedgerCat(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	since := fs.String("since", "", "only records at or after this time (RFC 3339, or a duration ago like 2h)")
	until := fs.String("until", "", "only records before this time (RFC 3339, or a duration ago)")
	sandbox := fs.String("sandbox", "", "only these sandboxes (names or cgroup ids, comma-separated)")
	kind := fs.String("kind", "", "only these kinds (comma-separated: file_open,exec,dns,net,loss,...)")
	verdict := fs.String("verdict", "", "only these verdicts (comma-separated: allowed,recorded,denied,killed)")
	asJSON := fs.Bool("json", false, "print records as JSON lines (as stored, with seq/prev/hash)")
	callID := fs.String("call", "", "only this tool call: its gateway records and the kernel events of the command it ran")
	session := fs.String("session", "", "only the tool calls of this session, in order, with their kernel events")
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher "+name+" [flags] DIR", 1)
	if err != nil {
		return err
	}
	now := time.Now()
	f := &recordFilter{}
	if f.since, err = parseWhen(*since, now); err != nil {
		return &exitError{Code: 2, Err: err}
	}
	if f.until, err = parseWhen(*until, now); err != nil {
		return &exitError{Code: 2, Err: err}
	}
	f.sandboxes = listSet(*sandbox)
	f.callID, f.session = *callID, *session
	if ks := listSet(*kind); ks != nil {
		f.kinds = map[audit.Kind]bool{}
		for k := range ks {
			f.kinds[audit.Kind(k)] = true
		}
	}
	if vs := listSet(*verdict); vs != nil {
		f.verdicts = map[audit.Verdict]bool{}
		for v := range vs {
			switch audit.Verdict(v) {
			case audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled:
			default:
				return &exitError{Code: 2, Err: fmt.Errorf("unknown verdict %q (allowed, recorded, denied, killed)", v)}
			}
			f.verdicts[audit.Verdict(v)] = true
		}
	}
	r, err := ledger.NewReader(pos[0])
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	defer r.Close()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &exitError{Code: 2, Err: err}
		}
		if !f.match(&rec.Event) {
			continue
		}
		if *asJSON {
			_, err = stdout.Write(rec.Raw)
		} else {
			_, err = fmt.Fprintln(stdout, recordText(rec))
		}
		if err != nil {
			return err
		}
	}
}

// recordText is the one-line human form of a record. Free-form fields are
// strconv.Quote'd, the others passed through textesc.String: no field a
// sandbox named can hold a control sequence or a line break.
func recordText(r *ledger.Record) string {
	e := &r.Event
	q := textesc.String
	sb := e.Sandbox.Name
	if sb == "" && e.Sandbox.CgroupID != 0 {
		sb = "cgroup:" + strconv.FormatUint(e.Sandbox.CgroupID, 10)
	}
	if sb == "" {
		sb = "-"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s %-14s %-8s %s", r.Seq, e.Time.UTC().Format("2006-01-02T15:04:05.000000Z"), q(string(e.Kind)), q(string(e.Verdict)), q(sb))
	if e.Process.PID != 0 || e.Process.Comm != "" {
		fmt.Fprintf(&b, " pid=%d comm=%s", e.Process.PID, strconv.Quote(e.Process.Comm))
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, " rule=%s", q(e.Rule))
	}
	switch {
	case e.Tool != nil:
		b.WriteString(toolText(e.Tool, q))
	case e.File != nil:
		fmt.Fprintf(&b, " path=%s", strconv.Quote(e.File.Path))
	case e.DNS != nil:
		fmt.Fprintf(&b, " name=%s", q(e.DNS.Name))
		if e.DNS.QType != "" {
			fmt.Fprintf(&b, " qtype=%s", q(e.DNS.QType))
		}
		if e.DNS.Reason != "" {
			fmt.Fprintf(&b, " reason=%s", strconv.Quote(e.DNS.Reason))
		}
	case e.Net != nil:
		fmt.Fprintf(&b, " %s %s:%d", q(e.Net.Op), q(e.Net.Addr), e.Net.Port)
	case e.Mount != nil:
		fmt.Fprintf(&b, " %s %s", q(e.Mount.Op), strconv.Quote(e.Mount.Target))
	case e.Target != nil:
		fmt.Fprintf(&b, " target=%d", e.Target.PID)
	case e.Syscall != nil:
		fmt.Fprintf(&b, " syscall=%s(%d)", q(e.Syscall.Name), e.Syscall.Nr)
	case e.Loss != nil:
		fmt.Fprintf(&b, " lost=%d stage=%s", e.Loss.Count, q(e.Loss.Stage))
	case e.Summary != nil:
		for _, row := range e.Summary.Rows {
			fmt.Fprintf(&b, " %s/%s=%d/%d", q(row.Sandbox), q(string(row.Kind)), row.Kept, row.Seen)
		}
	}
	if r := e.Repeat; r != nil {
		fmt.Fprintf(&b, " repeated=%d first=%s last=%s", r.Count,
			r.First.UTC().Format("15:04:05.000000"), r.Last.UTC().Format("15:04:05.000000"))
	}
	if len(e.Process.Args) > 0 {
		fmt.Fprintf(&b, " args=%q", e.Process.Args)
	}
	if l := e.Sandbox.Labels["label"]; l != "" && e.Tool == nil {
		fmt.Fprintf(&b, " call=%s", q(l))
	}
	if e.Message != "" {
		fmt.Fprintf(&b, " msg=%s", strconv.Quote(e.Message))
	}
	if len(e.Redacted) > 0 {
		fmt.Fprintf(&b, " redacted=%s", q(strings.Join(e.Redacted, ",")))
	}
	return b.String()
}

// loadVerifier reads a verifier key file, defaulting to DIR/ledger.pub.
func loadVerifier(file, dir string, stderr io.Writer) (note.Verifier, string, error) {
	if file == "" {
		file = filepath.Join(dir, "ledger.pub")
		fmt.Fprintf(stderr, "watcher: using %s; pass --pubkey with a copy kept off this host for a result that does not trust the host\n", file)
	}
	v, vkey, err := ledger.ReadPublicKey(file)
	if err != nil {
		return nil, "", &exitError{Code: 2, Err: err}
	}
	return v, vkey, nil
}

func runLedgerProve(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ledger prove", flag.ContinueOnError)
	pub := fs.String("pubkey", "", "verifier key file (default DIR/ledger.pub)")
	ckFile := fs.String("checkpoint", "", "signed checkpoint to prove against (default the latest in DIR)")
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher ledger prove [flags] DIR SEQ", 2)
	if err != nil {
		return err
	}
	dir := pos[0]
	seq, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("SEQ %q is not a record number", pos[1])}
	}
	v, _, err := loadVerifier(*pub, dir, stderr)
	if err != nil {
		return err
	}
	var ck []byte
	if *ckFile != "" {
		if ck, err = os.ReadFile(*ckFile); err != nil {
			return &exitError{Code: 2, Err: fmt.Errorf("read checkpoint: %w", err)}
		}
	} else if ck, _, err = ledger.LatestCheckpoint(dir); err != nil {
		return &exitError{Code: 2, Err: err}
	}
	p, err := ledger.Prove(dir, seq, ck, v)
	if err != nil {
		return &exitError{Code: 1, Err: fmt.Errorf("prove record %d: %w", seq, err)}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(p)
}

func runLedgerCheckProof(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ledger check-proof", flag.ContinueOnError)
	pub := fs.String("pubkey", "", "the ledger's verifier key file (required for a proof from 'ledger prove'; optional for a tlog-proof bundle)")
	var witnesses checkpointFiles
	fs.Var(&witnesses, "witness", "a trusted witness's verifier key, or a file holding it (repeatable; a tlog-proof bundle must carry their cosignatures)")
	quorum := fs.Int("quorum", 0, "how many of the --witness keys must have cosigned (default all)")
	pos, err := ledgerParse(fs, args, stderr, `Usage: watcher ledger check-proof [--witness KEY]... [--quorum N] [--pubkey FILE] PROOF

PROOF is a tlog-proof bundle from 'watcher exec --proof' (checked against
the witness keys: every record's inclusion in a checkpoint they cosigned)
or a proof from 'watcher ledger prove' (checked against --pubkey).`, 1)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("read proof: %w", err)}
	}
	wkeys, err := witnessKeys(witnesses)
	if err != nil {
		return err
	}
	if *quorum < 0 || *quorum > len(wkeys) {
		return &exitError{Code: 2, Err: fmt.Errorf("--quorum %d: want 1..%d (the number of --witness keys)", *quorum, len(wkeys))}
	}
	if strings.HasPrefix(string(data), "c2sp.org/tlog-proof@v1\n") {
		opts := ledger.RunProofOptions{Witnesses: wkeys, Quorum: *quorum}
		if *pub != "" {
			_, vkey, err := ledger.ReadPublicKey(*pub)
			if err != nil {
				return &exitError{Code: 2, Err: err}
			}
			opts.PubKey = vkey
		}
		if len(wkeys) == 0 && *pub == "" {
			return &exitError{Code: 2, Err: errors.New("check-proof needs --witness (or --pubkey): a bundle checked against nothing proves nothing")}
		}
		res, err := ledger.CheckRunProof(data, opts)
		if err != nil {
			return &exitError{Code: 1, Err: fmt.Errorf("%s: %w", pos[0], err)}
		}
		c := res.Checkpoint
		by := "no witness"
		if len(res.WitnessedBy) > 0 {
			by = strings.Join(res.WitnessedBy, ", ")
		}
		fmt.Fprintf(stdout, "ok: %d records are included in checkpoint %s size %d signed %s, cosigned by %s\n",
			len(res.Records), c.Origin, c.Size, c.Time.Format(time.RFC3339), by)
		for i := range res.Records {
			fmt.Fprintln(stdout, recordText(&res.Records[i]))
		}
		return nil
	}
	if *pub == "" {
		return &exitError{Code: 2, Err: errors.New("check-proof of a 'ledger prove' proof needs --pubkey")}
	}
	v, _, err := ledger.ReadPublicKey(*pub)
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	p, err := ledger.ReadProof(data)
	if err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("%s: %w", pos[0], err)}
	}
	c, rec, err := ledger.CheckProof(p, v)
	if err != nil {
		return &exitError{Code: 1, Err: fmt.Errorf("%s: %w", pos[0], err)}
	}
	fmt.Fprintf(stdout, "ok: record %d is included in checkpoint %s size %d signed %s\n%s\n",
		rec.Seq, c.Origin, c.Size, c.Time.Format(time.RFC3339), recordText(rec))
	return nil
}

func runLedgerCheckpoint(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ledger checkpoint", flag.ContinueOnError)
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher ledger checkpoint DIR", 1)
	if err != nil {
		return err
	}
	ck, _, err := ledger.LatestCheckpoint(pos[0])
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	_, err = stdout.Write(ck)
	return err
}

func runLedgerPubkey(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ledger pubkey", flag.ContinueOnError)
	key := fs.String("key", "", "derive from this private key file instead of reading DIR/ledger.pub")
	n := 1
	if len(args) > 0 && (strings.HasPrefix(args[0], "--key") || strings.HasPrefix(args[0], "-key")) {
		n = 0
	}
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher ledger pubkey DIR | --key FILE", n)
	if err != nil {
		return err
	}
	if *key != "" {
		data, err := os.ReadFile(*key)
		if err != nil {
			return &exitError{Code: 2, Err: fmt.Errorf("read key: %w", err)}
		}
		vkey, err := ledger.PublicKey(strings.TrimSpace(string(data)))
		if err != nil {
			return &exitError{Code: 2, Err: fmt.Errorf("%s: %w", *key, err)}
		}
		fmt.Fprintln(stdout, vkey)
		return nil
	}
	_, vkey, err := ledger.ReadPublicKey(filepath.Join(pos[0], "ledger.pub"))
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	fmt.Fprintln(stdout, vkey)
	return nil
}

func runLedgerKeygen(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ledger keygen", flag.ContinueOnError)
	name := fs.String("name", "watcher-ledger", "key name (shown in checkpoint signatures)")
	pos, err := ledgerParse(fs, args, stderr, "Usage: watcher ledger keygen [--name NAME] FILE", 1)
	if err != nil {
		return err
	}
	vkey, err := ledger.GenerateKey(pos[0], *name)
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	fmt.Fprintln(stdout, vkey)
	return nil
}
