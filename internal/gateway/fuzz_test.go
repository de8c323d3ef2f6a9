package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

var frameSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tool.list"}`,
	`{"jsonrpc":"2.0","id":"a","method":"tool.request","params":{"call_id":"c1","tool":"read_file","arguments":{"path":"x"}}}`,
	`{"jsonrpc":"2.0","id":null,"method":"tool.list"}`,
	`{"jsonrpc":"2.0","id":-3.5e2,"method":"x","params":[]}`,
	`{"jsonrpc":"2.0","id":1,"method":"tool.list","params":null}`,
	`[{"jsonrpc":"2.0","id":1,"method":"tool.list"}]`,
	`{"jsonrpc":"2.0","id":{},"method":"m"}`,
	`{"jsonrpc":"2.0","id":true,"method":"m"}`,
	`{"jsonrpc":"2.0","method":"m","params":"s"}`,
	`{"jsonrpc":"2.0","id":1,"method":"m"} trailing`,
	`{"jsonrpc":"2.0","id":1,"method":"m","method":"n"}`,
	`{"jsonrpc":"2.0","id":1,"method":"\ud800"}`,
	"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\xff\"}",
	`{`, `}`, `null`, `"2.0"`, ``, ` `, `{"jsonrpc":2}`,
}

// FuzzDecodeRequest: any frame decodes to a well-formed request or a typed
// error (never a panic), and an accepted request re-encodes to one that
// decodes the same.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range frameSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		req, e := decodeRequest(frame)
		if (req == nil) == (e == nil) {
			t.Fatalf("want exactly one of request and error: %v %v", req, e)
		}
		if e != nil {
			if e.Data == nil || e.Data.Type == "" || e.Code >= 0 {
				t.Fatalf("untyped error %+v", e)
			}
			return
		}
		if req.JSONRPC != "2.0" || req.Method == "" {
			t.Fatalf("accepted %q as %+v", frame, req)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, e2 := decodeRequest(b)
		if e2 != nil || again.Method != req.Method || !bytes.Equal(again.ID, req.ID) {
			t.Fatalf("re-encoded %s decodes to %+v %v", b, again, e2)
		}
	})
}

// FuzzFrames: the frame reader never returns a frame over the limit, never
// loses bytes of frames it returns, and stops at an oversized one.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("a\nbb\n\n\r\nccc"), 3)
	f.Add([]byte("{\"jsonrpc\":\"2.0\"}\n"+string(bytes.Repeat([]byte("x"), 100))+"\n"), 16)
	f.Add([]byte("\n\n\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, max int) {
		if max <= 0 || max > 1<<16 {
			return
		}
		r := bufio.NewReaderSize(bytes.NewReader(stream), 16)
		var got [][]byte
		for {
			fr, err := readFrame(r, max)
			if errors.Is(err, errFrameTooLarge) {
				return
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(fr) > max {
				t.Fatalf("frame of %d bytes over %d", len(fr), max)
			}
			got = append(got, append([]byte(nil), fr...))
		}
		// Without an oversized frame, the frames are the non-blank lines.
		var want [][]byte
		for _, l := range bytes.Split(stream, []byte("\n")) {
			l = bytes.TrimRight(l, "\r")
			if len(bytes.TrimSpace(l)) > 0 {
				want = append(want, l)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("got %d frames %q, want %q", len(got), got, want)
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("frame %d = %q, want %q", i, got[i], want[i])
			}
		}
	})
}
