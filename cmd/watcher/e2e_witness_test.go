package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/witness/witnesstest"
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
