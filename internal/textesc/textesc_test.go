package textesc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		// The attack of issue 26: erase the line, hide what follows.
		{"x\x1b[G\x1b[K\x1b[8mhidden", `x\x1b[G\x1b[K\x1b[8mhidden`},
		{"a\nb\rc\td", `a\nb\rc\td`},
		{"nul\x00 bel\x07 del\x7f", `nul\x00 bel\x07 del\x7f`},
		{"c1\u0085 csi\u009b", `c1\u0085 csi\u009b`},
		{"bidi\u202eevil\u202c", `bidi\u202eevil\u202c`},
		{"iso\u2066x\u2069", `iso\u2066x\u2069`},
		{"zw\u200b\u200c\u200d\ufeff", `zw\u200b\u200c\u200d\ufeff`},
		{"ls\u2028ps\u2029", `ls\u2028ps\u2029`},
		{"nbsp\u00a0shy\u00ad", `nbsp\u00a0shy\u00ad`},
		{"tag\U000e0041 pua\U000f0000", `tag\U000e0041 pua\U000f0000`},
		{"bad\xff\xc3(\xed\xa0\x80", `bad\xff\xc3(\xed\xa0\x80`},
		// A backslash is escaped, so an escape cannot be forged...
		{`\x1b`, `\\x1b`},
		{`C:\dir\`, `C:\\dir\\`},
		// ...and a valid C1 rune and an invalid byte of the same value
		// differ.
		{"\u0085", `\u0085`},
		{"\x85", `\x85`},
		// The benign neighbours: printable UTF-8 as it is.
		{"", ""},
		{"cat", "cat"},
		{"/work/café/日本語 file.txt", "/work/café/日本語 file.txt"},
		{"emoji 🦀 e\u0301 \ufffd", "emoji 🦀 e\u0301 \ufffd"},
		{`quote"s 'and' {json: [1]}`, `quote"s 'and' {json: [1]}`},
	} {
		got := String(c.in)
		if got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
		if u, err := unescape(got); err != nil || u != c.in {
			t.Errorf("unescape(%q) = %q, %v; want %q", got, u, err, c.in)
		}
		checkSafe(t, c.in, got)
	}
}

func TestStringUnchangedIsSame(t *testing.T) {
	s := "/work/plain/日本"
	if got := String(s); got != s || testing.AllocsPerRun(10, func() { String(s) }) != 0 {
		t.Errorf("a safe string must come back as it is, without allocating")
	}
}

// checkSafe fails when out holds a control or non-printing rune, invalid
// UTF-8 or a line break.
func checkSafe(t *testing.T, in, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("String(%q) = %q: invalid UTF-8", in, out)
	}
	for _, r := range out {
		if !unicode.IsPrint(r) || unicode.IsControl(r) || r == '\n' || r == '\r' {
			t.Fatalf("String(%q) = %q holds %U", in, out, r)
		}
	}
}

// unescape is String's inverse: its existence proves String injective.
func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("trailing backslash at %d", i)
		}
		n := 0
		switch s[i+1] {
		case '\\':
			b.WriteByte('\\')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'x':
			n = 2
		case 'u':
			n = 4
		case 'U':
			n = 8
		default:
			return "", fmt.Errorf("unknown escape at %d", i)
		}
		if n == 0 {
			i += 2
			continue
		}
		if i+2+n > len(s) {
			return "", fmt.Errorf("short escape at %d", i)
		}
		v, err := strconv.ParseUint(s[i+2:i+2+n], 16, 32)
		if err != nil {
			return "", err
		}
		if n == 2 {
			b.WriteByte(byte(v))
		} else {
			b.WriteRune(rune(v))
		}
		i += 2 + n
	}
	return b.String(), nil
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"", "cat", "\x1b[G\x1b[K\x1b[8m", "a\nb", "\u202e", "\u0085", "\x85", "\xff", `\x1b`, "日本 🦀", "\\\\u0085"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := String(a), String(b)
		checkSafe(t, a, ea)
		checkSafe(t, b, eb)
		if a != b && ea == eb {
			t.Fatalf("String(%q) == String(%q) == %q", a, b, ea)
		}
		if u, err := unescape(ea); err != nil || u != a {
			t.Fatalf("unescape(String(%q)) = %q, %v", a, u, err)
		}
		if firstUnsafe(a) < 0 && ea != a {
			t.Fatalf("String changed safe %q to %q", a, ea)
		}
	})
}
