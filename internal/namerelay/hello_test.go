package namerelay

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// clientHello is the first record crypto/tls sends for cfg (with the
// post-quantum key share of current Go: a few KiB).
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, cfg).Handshake()
	b.SetReadDeadline(time.Now().Add(3 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// reframe splits a one-record hello into records of at most n bytes.
func reframe(rec []byte, n int) []byte {
	var out []byte
	for body := rec[5:]; len(body) > 0; {
		k := min(n, len(body))
		out = append(out, 0x16, rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

func TestParseHello(t *testing.T) {
	rec := clientHello(t, &tls.Config{ServerName: "API.Example.COM."})
	if len(rec) < 1000 {
		t.Logf("hello of %d bytes", len(rec))
	}
	for _, tc := range []struct {
		name string
		buf  []byte
	}{{"one record", rec}, {"records of 100 bytes", reframe(rec, 100)}, {"records of 1 byte", reframe(rec, 1)}} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseHello(tc.buf)
			if err != nil || h.SNI != "api.example.com" || h.ECH {
				t.Fatalf("parse: %+v %v", h, err)
			}
			// Every proper prefix asks for more, never errs or decides.
			for i := 0; i < len(tc.buf); i++ {
				if _, err := parseHello(tc.buf[:i]); !errors.Is(err, errNeedMore) {
					t.Fatalf("prefix of %d bytes: %v", i, err)
				}
			}
			// Bytes after the hello (early data) do not matter.
			if h, err := parseHello(append(append([]byte(nil), tc.buf...), 0x17, 3, 3, 0, 1, 0)); err != nil || h.SNI != "api.example.com" {
				t.Fatalf("with trailing record: %+v %v", h, err)
			}
		})
	}

	t.Run("no SNI", func(t *testing.T) {
		h, err := parseHello(clientHello(t, &tls.Config{InsecureSkipVerify: true}))
		if err != nil || h.SNI != "" {
			t.Fatalf("%+v %v", h, err)
		}
	})

	t.Run("ECH and extension order", func(t *testing.T) {
		rec := addExt(t, clientHello(t, &tls.Config{ServerName: "front.example"}), 0xfe0d, []byte{0, 1, 2})
		h, err := parseHello(rec)
		if err != nil || !h.ECH || h.SNI != "front.example" {
			t.Fatalf("%+v %v", h, err)
		}
		// server_name last instead of first.
		moved := moveSNILast(t, rec)
		if h, err := parseHello(moved); err != nil || h.SNI != "front.example" || !h.ECH {
			t.Fatalf("moved: %+v %v", h, err)
		}
	})

	t.Run("two server names refused", func(t *testing.T) {
		rec := clientHello(t, &tls.Config{ServerName: "a.example"})
		sni := []byte{0, 14, 0, 0, 11}
		sni = append(sni, "b.example.x"...)
		if _, err := parseHello(addExt(t, rec, 0, sni)); err == nil {
			t.Fatal("two server_name extensions accepted")
		}
	})

	t.Run("not TLS", func(t *testing.T) {
		for _, b := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {0x16, 3, 1, 0, 5, 2, 0, 0, 1, 0}, {0x16, 2, 0, 0, 1, 1}} {
			if _, err := parseHello(b); err == nil || errors.Is(err, errNeedMore) {
				t.Errorf("%q: %v", b, err)
			}
		}
	})
}

// helloBody locates a one-record hello's extensions: offset (in rec) of
// the extensions length.
func extOffset(t testing.TB, rec []byte) int {
	t.Helper()
	body := rec[9:]
	off := 2 + 32
	off += 1 + int(body[off])
	off += 2 + int(binary.BigEndian.Uint16(body[off:]))
	off += 1 + int(body[off])
	return 9 + off
}

func fixLengths(rec []byte) {
	hl := len(rec) - 9
	rec[6], rec[7], rec[8] = byte(hl>>16), byte(hl>>8), byte(hl)
	binary.BigEndian.PutUint16(rec[3:], uint16(len(rec)-5))
}

func addExt(t testing.TB, rec []byte, typ uint16, data []byte) []byte {
	t.Helper()
	off := extOffset(t, rec)
	out := append([]byte(nil), rec...)
	out = binary.BigEndian.AppendUint16(out, typ)
	out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
	out = append(out, data...)
	binary.BigEndian.PutUint16(out[off:], binary.BigEndian.Uint16(out[off:])+uint16(4+len(data)))
	fixLengths(out)
	return out
}

// moveSNILast rewrites the hello with its server_name extension last.
func moveSNILast(t testing.TB, rec []byte) []byte {
	t.Helper()
	off := extOffset(t, rec)
	exts := rec[off+2:]
	var sni, rest []byte
	for len(exts) >= 4 {
		n := 4 + int(binary.BigEndian.Uint16(exts[2:]))
		if binary.BigEndian.Uint16(exts) == 0 {
			sni = exts[:n]
		} else {
			rest = append(rest, exts[:n]...)
		}
		exts = exts[n:]
	}
	if sni == nil {
		t.Fatal("no server_name")
	}
	out := append([]byte(nil), rec[:off+2]...)
	out = append(append(out, rest...), sni...)
	return out
}

func TestAnswers(t *testing.T) {
	a := NewAnswers(0)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	addr := netip.MustParseAddr("198.18.0.2")
	a.Record(1, "A.cdn.test.", []netip.Addr{addr, netip.MustParseAddr("::ffff:198.18.0.3")}, 10*time.Second)
	a.Record(1, "b.cdn.test", []netip.Addr{addr}, 20*time.Second)
	if !a.Answered(1, netip.MustParseAddr("::ffff:198.18.0.2"), "a.cdn.test") || !a.Answered(1, netip.MustParseAddr("198.18.0.3"), "A.CDN.TEST.") {
		t.Fatal("answered name not found")
	}
	if a.Answered(2, addr, "a.cdn.test") || a.Answered(1, addr, "c.cdn.test") {
		t.Fatal("another sandbox's or an unanswered name found")
	}
	if got := a.Names(1, addr); len(got) != 2 || got[0] != "a.cdn.test" || got[1] != "b.cdn.test" {
		t.Fatalf("names: %v", got)
	}
	now = now.Add(15 * time.Second)
	if a.Answered(1, addr, "a.cdn.test") || !a.Answered(1, addr, "b.cdn.test") {
		t.Fatal("expiry not applied")
	}
	a.Expire()
	if got := a.Names(1, addr); len(got) != 1 {
		t.Fatalf("after expire: %v", got)
	}
}

func TestNames(t *testing.T) {
	n := NewNames([]string{"exact.test", "*.below.test", ".both.test"})
	for name, want := range map[string]bool{
		"exact.test": true, "x.exact.test": false, "below.test": false, "a.below.test": true,
		"both.test": true, "a.b.both.test": true, "Exact.Test.": true, "": false, "xboth.test": false,
	} {
		if n.Match(name) != want {
			t.Errorf("%q: want %v", name, want)
		}
	}
}

func FuzzParseHello(f *testing.F) {
	rec := clientHello(f, &tls.Config{ServerName: "fuzz.example"})
	f.Add(rec)
	f.Add(reframe(rec, 7))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseHello(b) // must not panic
	})
}
