package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/mod/sumdb/note"
)

// The seed corpora live in testdata/fuzz/<target>; `go test` runs them,
// `go test -fuzz=FuzzX` explores further. Regenerate them with
// WATCHER_LEDGER_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds.

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"seq":0,"prev":"0000000000000000000000000000000000000000000000000000000000000000","time":"2024-01-01T00:00:00Z","kind":"agent","verdict":"recorded","severity":"routine","hash":"00"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		rec, err := DecodeRecord(line)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		// Whatever decodes must re-encode to the same bytes: the
		// encoding is canonical.
		again, h := appendRecord(nil, newLeafHasher(), rec.Seq, rec.Prev, &rec.Event)
		if h != rec.Hash || !bytes.Equal(again, rec.Raw) {
			t.Fatalf("decoded record is not canonical:\n%s\n%s", rec.Raw, again)
		}
	})
}

func FuzzVerify(f *testing.F) {
	f.Add([]byte("{\"watcher_ledger\":1}\n"))
	f.Fuzz(func(t *testing.T, seg []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segName(0)), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		key := fuzzKey
		var hdr struct{ Key string }
		if i := bytes.IndexByte(seg, '\n'); i > 0 && json.Unmarshal(seg[:i], &hdr) == nil {
			if _, err := note.NewVerifier(hdr.Key); err == nil {
				key = hdr.Key
			}
		}
		rep, err := Verify(dir, key, nil)
		if err != nil {
			return
		}
		for _, p := range rep.Problems {
			if p.Reason == "" {
				t.Fatal("problem without a reason")
			}
		}
		if rep.OK() && rep.NextSeq > 0 {
			// A clean result must be readable too.
			r, err := NewReader(dir)
			if err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := r.Next(); err != nil {
					if err.Error() != "EOF" {
						t.Fatalf("verified clean but reader fails: %v", err)
					}
					break
				}
			}
		}
	})
}

func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte("watcher-ledger/x\n1\nAAAA\ntime 2024-01-01T00:00:00Z\n\n— watcher-ledger AAAA\n"))
	v, err := note.NewVerifier(fuzzKey)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		c, err := ParseCheckpoint(msg, v)
		if err == nil && !bytes.Equal(c.Note, msg) {
			t.Fatal("note not kept")
		}
	})
}

// fuzzKey is the verifier of testdata/fuzz-ledger.key, which signed the seeds.
const fuzzKeyFile = "testdata/fuzz-ledger.key"

var fuzzKey = func() string {
	b, err := os.ReadFile(fuzzKeyFile)
	if err != nil {
		return "watcher-ledger+00000000+AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	}
	k, err := PublicKey(string(bytes.TrimSpace(b)))
	if err != nil {
		panic(err)
	}
	return k
}()

func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WATCHER_LEDGER_FUZZ_SEEDS") == "" {
		t.Skip("set WATCHER_LEDGER_FUZZ_SEEDS=1 to regenerate the fuzz seed corpora")
	}
	dir := t.TempDir()
	key, _ := filepath.Abs(fuzzKeyFile)
	if _, err := os.Stat(key); err != nil {
		if _, err := GenerateKey(key, "watcher-ledger"); err != nil {
			t.Fatal(err)
		}
	}
	l := openT(t, dir, Options{KeyFile: key})
	for i := 0; i < 6; i++ {
		l.Append(testEvent(i, i == 3))
	}
	l.RecordLoss("queue", 3)
	l.Close()
	seg := onlySeg(t, dir)
	data, _ := os.ReadFile(seg)
	hdr, recs := segLines(t, seg)
	ck, _, _ := LatestCheckpoint(dir)
	write := func(target, name string, b []byte) {
		p := filepath.Join("testdata", "fuzz", target, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b)))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("FuzzVerify", "segment", data)
	write("FuzzVerify", "header-only", hdr)
	write("FuzzVerify", "torn", data[:len(data)-30])
	for i, r := range recs {
		write("FuzzDecodeRecord", fmt.Sprintf("record-%d", i), r)
	}
	write("FuzzParseCheckpoint", "checkpoint", ck)
}
