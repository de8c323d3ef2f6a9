package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"filippo.io/torchwood"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/witness/witnesstest"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// TestExecProof: `watcher exec --proof` with a policy naming a real
// witness (litewitness on loopback) writes a tlog-proof bundle of the
// run's records that `watcher ledger check-proof --witness KEY` accepts
// offline, and refuses once a byte changed; the agent's ledger verifies
// with the witness key.
func TestExecProof(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	w := witnesstest.Start(t)
	// The witness must know the ledger: create it first, as an operator
	// registers a host's ledger with its witnesses.
	l, err := ledger.Open(tb.ledger, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	l.Close()
	pol, _ := os.ReadFile(tb.policy)
	withWitness := strings.Replace(string(pol), "agent:\n", "agent:\n  witnesses:\n    - url: "+w.URL+"\n      key: "+w.VKey+"\n", 1)
	os.WriteFile(tb.policy, []byte(withWitness), 0o600)

	proof := filepath.Join(tb.dir, "run.tlog-proof")
	out, code := tb.watcher("exec", "--policy", tb.policy, "--label", "call-42", "--proof", proof, "--", "sh", "-c", "cat /etc/hostname >/dev/null; ls / >/dev/null; echo done")
	if code != 0 || !strings.Contains(out, "done") || !strings.Contains(out, "1 of 1 witnesses") {
		t.Fatalf("exec --proof: exit %d\n%s\nwitness log:\n%s", code, out, w.Log())
	}
	out, code = tb.watcher("ledger", "check-proof", "--witness", w.VKey, proof)
	if code != 0 || !strings.Contains(out, "cosigned by "+w.Name) || !strings.Contains(out, "exec") {
		t.Fatalf("check-proof: exit %d\n%s", code, out)
	}
	t.Logf("check-proof:\n%s", out)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if !strings.Contains(line, "call-42") && !strings.Contains(line, "sh") && !strings.Contains(line, "cat") && !strings.Contains(line, "ls") {
			t.Errorf("record not of the run: %s", line)
		}
	}
	if out, code := tb.watcher("verify", "--witness", w.VKey, "--pubkey", filepath.Join(tb.ledger, "ledger.pub"), tb.ledger); code != 0 || !strings.Contains(out, "witnessed") {
		t.Fatalf("verify --witness: %d\n%s", code, out)
	}
	data, _ := os.ReadFile(proof)
	data[len(data)/3] ^= 0x02
	bad := filepath.Join(tb.dir, "bad.tlog-proof")
	os.WriteFile(bad, data, 0o644)
	if out, code := tb.watcher("ledger", "check-proof", "--witness", w.VKey, bad); code != 1 {
		t.Fatalf("altered proof: exit %d\n%s", code, out)
	}
	// With the witness down, the run still completes; the proof waits
	// for it, then says why it could not be written.
	w.Stop()
	start := time.Now()
	out, code = tb.watcher("exec", "--policy", tb.policy, "--proof", filepath.Join(tb.dir, "down.tlog-proof"), "--proof-wait", "3s", "--", "sh", "-c", "echo ran")
	if code == 0 || !strings.Contains(out, "ran") || !strings.Contains(out, "witnesses") {
		t.Fatalf("exec --proof with the witness down: exit %d after %v\n%s", code, time.Since(start), out)
	}
	w.Restart()
}

// TestRunningAgentWitnessAndTiles: `watcher run` with a witness in the
// policy and --serve-tiles: `watcher exec --proof` through the running
// agent gets a cosigned proof, and the tiles served on loopback give the
// root of the checkpoints verify matches, and every record.
func TestRunningAgentWitnessAndTiles(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	w := witnesstest.Start(t)
	l, err := ledger.Open(tb.ledger, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	l.Close()
	pol, _ := os.ReadFile(tb.policy)
	os.WriteFile(tb.policy, []byte(strings.Replace(string(pol), "agent:\n", "agent:\n  witnesses:\n    - {url: \""+w.URL+"\", key: \""+w.VKey+"\"}\n", 1)), 0o600)
	tilesAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	tb.agentArgs = []string{"--serve-tiles", tilesAddr}
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")

	proof := filepath.Join(tb.dir, "run.tlog-proof")
	out, code := tb.watcher("exec", "--socket", ctl, "--proof", proof, "--", "sh", "-c", "ls / >/dev/null; echo done")
	if code != 0 || !strings.Contains(out, "done") || !strings.Contains(out, "1 of 1 witnesses") {
		t.Fatalf("exec --proof via the agent: exit %d\n%s\nagent:\n%s", code, out, tb.agentLog)
	}
	if out, code := tb.watcher("ledger", "check-proof", "--witness", w.VKey, proof); code != 0 || !strings.Contains(out, `comm="ls"`) {
		t.Fatalf("check-proof: %d\n%s", code, out)
	}

	// The served log.
	base := "http://" + tilesAddr
	resp, err := http.Get(base + "/checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, vkey, err := ledger.ReadPublicKey(filepath.Join(tb.ledger, "ledger.pub"))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := note.NewVerifier(vkey)
	c, err := ledger.ParseCosigned(ck, v)
	if err != nil {
		t.Fatalf("served checkpoint: %v\n%s", err, ck)
	}
	fetcher, _ := torchwood.NewTileFetcher(base + "/")
	ctx := context.Background()
	tree := tlog.Tree{N: int64(c.Size), Hash: c.Root}
	if root, err := tlog.TreeHash(tree.N, torchwood.TileHashReaderWithContext(ctx, tree, fetcher)); err != nil || root != c.Root {
		t.Fatalf("root from served tiles: %v %v", root, err)
	}
	client, _ := torchwood.NewClient(fetcher)
	var served [][]byte
	for _, e := range client.Entries(ctx, tree, 0) {
		served = append(served, append([]byte(nil), e...))
	}
	if err := client.Err(); err != nil {
		t.Fatal(err)
	}
	tb.stopAgent(syscall.SIGTERM)
	// Verify matched the served checkpoint (it is in the history), and
	// the served entries are the records it checked.
	served0 := served
	out, code = tb.watcher("verify", "--json", "--pubkey", filepath.Join(tb.ledger, "ledger.pub"), "--witness", w.VKey, tb.ledger)
	if code != 0 {
		t.Fatalf("verify: %d\n%s", code, out)
	}
	r, err := ledger.NewReader(tb.ledger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range served0 {
		rec, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if tlog.RecordHash(served0[i]) != rec.Hash {
			t.Fatalf("served entry %d is not record %d", i, rec.Seq)
		}
	}
	t.Logf("served checkpoint size %d, %d entries from full bundles, all match", c.Size, len(served0))
}
