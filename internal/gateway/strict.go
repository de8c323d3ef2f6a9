package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxApprovalArgumentBytes is the most argument bytes a call held for
// approval may have: the approver is shown all of them (never a cut), and
// a longer call is refused as too large for approval.
const MaxApprovalArgumentBytes = 64 << 10

// maxRecordedArgs is the most argument bytes a request record holds. It is
// the default max_argument_bytes, so by default every call's arguments are
// recorded whole; JSON escaping at most doubles them (the arguments are
// valid JSON, so they hold no raw control character but whitespace), which
// keeps the record well under the ledger's MaxRecordBytes. Beyond it (a
// policy that raised max_argument_bytes) the record keeps the first
// maxRecordedArgs bytes and says so; its SHA-256 is of them all.
const maxRecordedArgs = defaultMaxArgument

// ErrAmbiguousArguments is wrapped by every refusal of JSON that two
// decoders could read differently (duplicate keys, invalid UTF-8, lone
// surrogates, trailing data, out-of-range numbers): what an approver or the
// ledger reads must be what the tool runs with.
var ErrAmbiguousArguments = errors.New("ambiguous JSON")

// ErrTooLargeForApproval is wrapped by the refusal of a call held for
// approval whose arguments are over MaxApprovalArgumentBytes.
var ErrTooLargeForApproval = errors.New("arguments too large for approval")

// AmbiguousError says what makes a JSON text ambiguous and where. It
// wraps ErrAmbiguousArguments.
type AmbiguousError struct {
	// Offset is the byte offset in the text near the problem.
	Offset int64
	// Path names the member or element ("" for the top, then /key/0 ...,
	// keys escaped as Go strings when they need it).
	Path string
	// Reason says what is wrong.
	Reason string
}

func (e *AmbiguousError) Error() string {
	at := "at byte " + strconv.FormatInt(e.Offset, 10)
	if e.Path != "" {
		at = "in " + e.Path + " " + at
	}
	return fmt.Sprintf("%v: %s %s", ErrAmbiguousArguments, e.Reason, at)
}

func (e *AmbiguousError) Unwrap() error { return ErrAmbiguousArguments }

// checkArguments checks a call's arguments: one JSON object that every
// decoder reads the same way (see checkJSON).
func checkArguments(b []byte) error {
	if err := checkJSON(b, ""); err != nil {
		return err
	}
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return fmt.Errorf("arguments must be a JSON object")
	}
	return nil
}

// checkApprovable refuses arguments an approver could not be shown whole.
func checkApprovable(b []byte) error {
	if len(b) > MaxApprovalArgumentBytes {
		return fmt.Errorf("%w: the arguments are %d bytes, over the %d bytes (MaxApprovalArgumentBytes) an approver is shown whole",
			ErrTooLargeForApproval, len(b), MaxApprovalArgumentBytes)
	}
	return nil
}

// argsSHA256 is the hex SHA-256 of the exact argument bytes.
func argsSHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// checkJSON refuses a JSON text that decoders could read differently:
// a key twice in one object (at any depth; also two keys equal but for
// case, which encoding/json matches to one struct field), invalid UTF-8 in
// a string or key, a \u escape of a lone surrogate (decoders replace it or
// refuse it), a number no float64 holds, anything after the value, and
// invalid JSON. The value of the top-level member named skip (if any) is
// not looked into: its decoder checks it (a call's arguments are checked
// by run, so that their refusal is recorded as the call's).
func checkJSON(b []byte, skip string) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type level struct {
		obj   bool
		keys  map[string]string // folded key -> key
		key   string            // the current member's key
		wantK bool              // an object expecting a key (or '}')
		index int               // the next array element
		path  string
	}
	var stack []*level
	bad := func(off int64, path, format string, args ...any) error {
		return &AmbiguousError{Offset: off, Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	// pathOf is the path of the value about to be read.
	pathOf := func() string {
		if len(stack) == 0 {
			return ""
		}
		l := stack[len(stack)-1]
		if l.obj {
			return l.path + "/" + pathKey(l.key)
		}
		return l.path + "/" + strconv.Itoa(l.index)
	}
	// valueDone ends a value in its parent.
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		if l := stack[len(stack)-1]; l.obj {
			l.wantK = true
		} else {
			l.index++
		}
	}
	started := false
	for {
		before := dec.InputOffset()
		if started && len(stack) == 0 {
			// The value is complete: only whitespace may follow.
			if _, err := dec.Token(); err != io.EOF {
				return bad(before, "", "data after the JSON value")
			}
			return nil
		}
		tok, err := dec.Token()
		if err != nil {
			if err == io.EOF {
				if !started {
					return bad(0, "", "no JSON value")
				}
				return bad(before, "", "the JSON text ends early")
			}
			return bad(before, "", "not valid JSON: %v", err)
		}
		started = true
		seg := b[before:dec.InputOffset()]
		top := (*level)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.wantK {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				valueDone()
				continue
			}
			key, ok := tok.(string)
			if !ok {
				return bad(before, top.path, "object key is not a string")
			}
			if err := checkString(seg); err != "" {
				return bad(before, top.path, "key %s", err)
			}
			f := foldKey(key)
			if prev, dup := top.keys[f]; dup {
				if prev == key {
					return bad(before, top.path, "duplicate key %q (decoders keep either the first or the last)", key)
				}
				return bad(before, top.path, "keys %q and %q differ only in case (encoding/json reads them as one field)", prev, key)
			}
			if top.keys == nil {
				top.keys = map[string]string{}
			}
			top.keys[f] = key
			top.key, top.wantK = key, false
			if skip != "" && len(stack) == 1 && key == skip {
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return bad(dec.InputOffset(), pathOf(), "not valid JSON: %v", err)
				}
				valueDone()
			}
			continue
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				stack = append(stack, &level{obj: v == '{', wantK: v == '{', path: pathOf()})
			case '}', ']':
				// '}' with wantK false cannot happen (the decoder checks
				// the syntax); ']' ends an array.
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if err := checkString(seg); err != "" {
				return bad(before, pathOf(), "string %s", err)
			}
			valueDone()
		case json.Number:
			if _, err := strconv.ParseFloat(string(v), 64); err != nil {
				return bad(before, pathOf(), "number %.40s does not fit a float64", v)
			}
			valueDone()
		default: // bool, nil
			valueDone()
		}
	}
}

// checkString checks the bytes of one string token (with the delimiters
// and whitespace before it): valid UTF-8, and every \u escape of a
// surrogate one half of a pair. It returns what is wrong, or "".
func checkString(seg []byte) string {
	if !utf8.Valid(seg) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] != '\\' || i+1 >= len(seg) {
			continue
		}
		i++
		if seg[i] != 'u' {
			continue
		}
		r, ok := hex4(seg[i+1:])
		if !ok {
			continue // the decoder refuses it
		}
		i += 4
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if i+6 < len(seg) && seg[i+1] == '\\' && seg[i+2] == 'u' {
				if r2, ok := hex4(seg[i+3:]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
					i += 6
					continue
				}
			}
			return fmt.Sprintf(`has a lone surrogate \u%04x`, r)
		case r >= 0xDC00 && r < 0xE000:
			return fmt.Sprintf(`has a lone surrogate \u%04x`, r)
		}
	}
	return ""
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// foldKey folds a key as encoding/json matches names to fields
// (bytes.EqualFold): two keys with the same fold fill the same field.
func foldKey(k string) string {
	b := make([]byte, 0, len(k))
	for _, r := range k {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b = append(b, byte(r))
			continue
		}
		// The smallest rune of its fold orbit.
		for {
			r2 := unicode.SimpleFold(r)
			if r2 <= r {
				r = r2
				break
			}
			r = r2
		}
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// pathKey is a key as a path element: as it is when plain, else quoted.
func pathKey(k string) string {
	for _, r := range k {
		if r == '/' || r == '"' || r == '\\' || !unicode.IsPrint(r) {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}
