// Package textesc makes text that a sandbox can influence (process names,
// paths, arguments, DNS names, tool arguments) safe to print on an
// operator's terminal: no control sequence, no line break, no invisible or
// reordering rune reaches the screen, and what is shown cannot be forged
// from another string.
//
// String escapes, as visible backslash sequences:
//
//   - the backslash itself, as \\ (so no escape can be forged);
//   - newline, carriage return and tab, as \n, \r and \t;
//   - the other C0 controls (0x00-0x1f, ESC among them) and DEL, as \xHH;
//   - bytes that are not valid UTF-8, as \xHH (HH is 80 or more, so these
//     never collide with the controls above);
//   - every rune that is not printable (unicode.IsPrint): C1 controls
//     (U+0080-U+009F), format characters such as the bidirectional
//     overrides and isolates (U+202A-U+202E, U+2066-U+2069), zero-width
//     characters and U+FEFF, the line and paragraph separators U+2028 and
//     U+2029, spaces other than the ASCII space, private-use and unassigned
//     code points, as \uHHHH or \UHHHHHHHH.
//
// Everything else, printable UTF-8 such as é, 日本 or an emoji, is kept as
// it is, and a string that needs no escape is returned unchanged. The
// mapping is injective: each escape names exactly one input rune or byte,
// and a backslash in the output always starts an escape.
//
// Use it for human-readable output only. JSON output and the ledger keep
// the exact bytes.
package textesc

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// String returns s escaped for a terminal: one line, no control or
// non-printing rune, printable UTF-8 unchanged.
func String(s string) string {
	i := firstUnsafe(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\':
				b.WriteString(`\\`)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c < 0x20 || c == 0x7f:
				writeByte(&b, c)
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			writeByte(&b, c)
		case !unicode.IsPrint(r):
			writeRune(&b, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// firstUnsafe is the index of the first byte of s that String changes, or
// -1.
func firstUnsafe(s string) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f || c == '\\' {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || !unicode.IsPrint(r) {
			return i
		}
		i += size
	}
	return -1
}

func writeByte(b *strings.Builder, c byte) {
	b.WriteString(`\x`)
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&0xf])
}

func writeRune(b *strings.Builder, r rune) {
	n := 4
	if r > 0xffff {
		b.WriteString(`\U`)
		n = 8
	} else {
		b.WriteString(`\u`)
	}
	for shift := 4 * (n - 1); shift >= 0; shift -= 4 {
		b.WriteByte(hex[(r>>shift)&0xf])
	}
}
