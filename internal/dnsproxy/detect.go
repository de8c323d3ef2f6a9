package dnsproxy

import (
	_ "embed"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/watcherhq/watcher/internal/dnsproxy/internal/hostmodel"
	"golang.org/x/net/publicsuffix"
)

//go:embed hostmodel.bin
var hostModelFile []byte

// hostModel is the trigram model of real hostname labels (see package doc).
var hostModel = func() *hostmodel.Model {
	m, err := hostmodel.Parse(hostModelFile)
	if err != nil {
		panic(fmt.Sprintf("dnsproxy: embedded hostname model: %v", err))
	}
	return m
}()

// Thresholds of the per-name detector. The package documentation explains
// each one.
const (
	// evidenceBlockBits: summed randomness evidence of a name's labels that
	// marks it as carrying encoded data.
	evidenceBlockBits = 100
	// evidenceMinLabel: labels shorter than this carry too little to judge and
	// are left out of the evidence.
	evidenceMinLabel = 6
	// caseSwitchMin / caseSwitchMinLen: letters switching case this often in a
	// label of at least this length means base64-style encoding.
	caseSwitchMin    = 3
	caseSwitchMinLen = 8
	// decodedTextMin: decoded bytes that must all be text for a hex or base32
	// label to count as encoded text; decodedRunMin: a run of text this long
	// inside otherwise binary hex data counts too.
	decodedTextMin = 8
	decodedRunMin  = 8
	// maxNameLen: names longer than this (presentation form, no trailing dot)
	// are refused as carrying data by their size alone.
	maxNameLen = 180
)

// nameInfo is what the detector learns about one query name.
type nameInfo struct {
	// name is the lower-cased name without the trailing dot.
	name string
	// domain is the tracking domain: the registrable domain (Public Suffix
	// List), or the top-level label when the TLD is not on the list.
	domain string
	// head is the part of name left of domain ("" when name == domain).
	head string
	// evidence is the summed randomness evidence of the head's labels, bits.
	evidence float64
	// encoded is the reason the name is judged to carry encoded data, "" if
	// it is not.
	encoded string
	// dgaLike reports a random-looking registrable label (reported only).
	dgaLike bool
}

// analyzeName judges a name (presentation form, trailing dot optional) that
// passed the syntax check: only letters, digits, '-' and '_' in its labels.
func analyzeName(raw string) nameInfo {
	raw = strings.TrimSuffix(raw, ".")
	lower := strings.ToLower(raw)
	info := nameInfo{name: lower}
	info.domain, info.head = trackingDomain(lower)
	if info.domain == "" {
		return info
	}
	rawHead := ""
	if info.head != "" {
		rawHead = raw[:len(info.head)]
	}

	if len(raw) > maxNameLen {
		info.encoded = ReasonOversized
	}
	if isReverseName(lower) {
		return info
	}
	// A top-level label that cannot be a TLD (digits, over 24 characters)
	// means the whole name is made up, as in dnscat2's tag-prefix mode.
	if tld := lastLabel(lower); (len(tld) > 24 || hasDigit(tld)) && !isKnownSuffix(lower) && (len(tld) > 24 || hasDigit(tld)) && !strings.HasPrefix(tld, "xn--") {
		if info.encoded == "" {
			info.encoded = ReasonBadTLD
		}
		info.evidence += labelEvidence(tld)
	}

	parentUniformCase := uniformCase(raw[len(rawHead):])
	for label := range strings.SplitSeq(rawHead, ".") {
		if label == "" {
			continue
		}
		info.evidence += max(labelEvidence(label), 0)
		if info.encoded != "" {
			continue
		}
		if parentUniformCase && len(label) >= caseSwitchMinLen && caseSwitches(label) >= caseSwitchMin {
			info.encoded = ReasonEncoded
		} else if decodesToText(label) {
			info.encoded = ReasonEncoded
		}
	}
	if info.encoded == "" && info.head != "" {
		// Tunnels split one encoded payload across labels: judge the joined
		// head as well, where a label boundary may cut a text run.
		if joined := strings.ReplaceAll(info.head, ".", ""); len(joined) != len(info.head) && decodesToText(joined) {
			info.encoded = ReasonEncoded
		}
	}
	if info.encoded == "" && splitPayload(rawHead) {
		info.encoded = ReasonEncoded
	}
	if info.encoded == "" && info.evidence >= evidenceBlockBits {
		info.encoded = ReasonEncoded
	}
	if reg, _, ok := strings.Cut(info.domain, "."); ok && labelEvidence(reg) >= 12 {
		info.dgaLike = true
	}
	return info
}

// trackingDomain returns the domain whose state a name counts against, and
// the part of the name left of it.
func trackingDomain(name string) (domain, head string) {
	if name == "" || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
		return "", ""
	}
	suffix, icann := publicsuffix.PublicSuffix(name)
	switch {
	case !icann && !strings.Contains(suffix, ".") && !isListedTLD(suffix):
		// Unlisted TLD (".internal", ".bazar", a made-up tag): take the last
		// two labels as the domain ("corp.internal"), except for two-label
		// names, which would each be their own domain and escape the
		// stream limits: those count against the TLD itself.
		domain = suffix
		if strings.Count(name, ".") >= 2 {
			i := strings.LastIndexByte(name[:len(name)-len(suffix)-1], '.')
			domain = name[i+1:]
		}
	case len(suffix) >= len(name):
		// The name is itself a public suffix ("com", "co.uk").
		return name, ""
	default:
		// Registrable domain: the public suffix plus one label.
		i := strings.LastIndexByte(name[:len(name)-len(suffix)-1], '.')
		domain = name[i+1:]
	}
	if len(name) > len(domain) {
		head = name[:len(name)-len(domain)-1]
	}
	return domain, head
}

// isListedTLD reports whether a single label is a TLD the list knows as
// private (non-ICANN) but still real; no such single-label entries exist
// today, so this only guards against that changing.
func isListedTLD(label string) bool {
	_, icann := publicsuffix.PublicSuffix("x." + label)
	return icann
}

// isKnownSuffix reports whether the name ends in a suffix on the list.
func isKnownSuffix(name string) bool {
	suffix, icann := publicsuffix.PublicSuffix(name)
	return icann || strings.Contains(suffix, ".")
}

func lastLabel(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i+1:]
	}
	return name
}

func hasDigit(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= '0' && s[i] <= '9' {
			return true
		}
	}
	return false
}

// isReverseName reports a well-formed reverse-mapping name: decimal octets
// under in-addr.arpa or single nibbles under ip6.arpa, which look random to
// the model but carry no payload.
func isReverseName(name string) bool {
	var rest string
	var nibble bool
	switch {
	case strings.HasSuffix(name, ".in-addr.arpa"):
		rest = strings.TrimSuffix(name, ".in-addr.arpa")
	case strings.HasSuffix(name, ".ip6.arpa"):
		rest, nibble = strings.TrimSuffix(name, ".ip6.arpa"), true
	default:
		return false
	}
	for label := range strings.SplitSeq(rest, ".") {
		if nibble {
			if len(label) != 1 || !isHexDigit(label[0]) {
				return false
			}
			continue
		}
		if len(label) == 0 || len(label) > 3 {
			return false
		}
		v := 0
		for i := 0; i < len(label); i++ {
			if label[i] < '0' || label[i] > '9' {
				return false
			}
			v = v*10 + int(label[i]-'0')
		}
		if v > 255 {
			return false
		}
	}
	return true
}

func isHexDigit(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// labelEvidence is the log-likelihood ratio, in bits, of a label being a
// uniformly random string over the smallest encoding alphabet that contains
// it versus being a hostname label under the trigram model. Positive means
// "better explained as encoded data".
func labelEvidence(label string) float64 {
	if len(label) < evidenceMinLabel {
		return 0
	}
	if strings.HasPrefix(label, "xn--") && len(label) <= 30 {
		// Punycode of an internationalised label looks random by design.
		return 0
	}
	model := hostModel.Bits(label)
	uniform := float64(len(label))*math.Log2(alphabetSize(label)) + 6 // +6: the length itself
	return model - uniform
}

// alphabetSize returns the size of the smallest common encoding alphabet that
// contains every byte of label: hex 16, base32 32, base36 36, LDH 37,
// base64 64 (mixed case, '_' or other bytes).
func alphabetSize(label string) float64 {
	hex, b32, b36, ldh := true, true, true, true
	upper, lower := false, false
	for i := 0; i < len(label); i++ {
		c := label[i]
		if c >= 'A' && c <= 'Z' {
			upper = true
			c += 'a' - 'A'
		} else if c >= 'a' && c <= 'z' {
			lower = true
		}
		digit := c >= '0' && c <= '9'
		letter := c >= 'a' && c <= 'z'
		if !(digit || c >= 'a' && c <= 'f') {
			hex = false
		}
		if !(letter || c >= '2' && c <= '7') {
			b32 = false
		}
		if !(letter || digit) {
			b36 = false
			if c != '-' {
				ldh = false
			}
		}
	}
	switch {
	case upper && lower || !ldh:
		return 64
	case hex:
		return 16
	case b32:
		return 32
	case b36:
		return 36
	}
	return 37
}

// uniformCase reports whether the letters of s are all lower, all upper, or
// capitalised per label: anything else is case used as data (or 0x20
// randomisation, which stubs do not apply).
func uniformCase(s string) bool {
	var upper, lower bool
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' && i > 0 && s[i-1] != '.' {
			upper = true
		} else if c >= 'a' && c <= 'z' {
			lower = true
		}
	}
	return !(upper && lower)
}

// caseSwitches counts adjacent letter pairs of different case.
func caseSwitches(label string) int {
	n := 0
	prev := byte(0) // 0 none, 1 lower, 2 upper
	for i := 0; i < len(label); i++ {
		c := label[i]
		var k byte
		switch {
		case c >= 'a' && c <= 'z':
			k = 1
		case c >= 'A' && c <= 'Z':
			k = 2
		default:
			continue
		}
		if prev != 0 && k != prev {
			n++
		}
		prev = k
	}
	return n
}

// decodesToText reports whether s, read as hex or as base32, decodes to
// text: all of at least decodedTextMin bytes printable with letters among
// them, or (hex) a run of decodedRunMin text bytes. Hashes and keys decode to
// uniformly random bytes, of which only 37% are printable, so eight in a row
// is a one-in-three-thousand event per position.
func decodesToText(s string) bool {
	if len(s) >= 2*decodedTextMin && allHex(s) {
		var buf [128]byte
		n := 0
		for i := 0; i+1 < len(s) && n < len(buf); i += 2 {
			buf[n] = hexVal(s[i])<<4 | hexVal(s[i+1])
			n++
		}
		return isText(buf[:n]) || longestTextRun(buf[:n]) >= decodedRunMin
	}
	if len(s) >= 13 && allBase32(s) && hasDigit(s) {
		var buf [128]byte
		n := base32Decode(s, buf[:])
		return n >= decodedTextMin && isText(buf[:n])
	}
	return false
}

func allHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return false
		}
	}
	return true
}

func hexVal(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func allBase32(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if !(c >= 'a' && c <= 'z' || s[i] >= '2' && s[i] <= '7') {
			return false
		}
	}
	return true
}

// base32Decode decodes RFC 4648 base32 without padding, either case, into
// dst; trailing bits that do not fill a byte are dropped.
func base32Decode(s string, dst []byte) int {
	var acc uint32
	var bits uint
	n := 0
	for i := 0; i < len(s) && n < len(dst); i++ {
		c := s[i]
		var v byte
		switch {
		case c >= 'a' && c <= 'z':
			v = c - 'a'
		case c >= 'A' && c <= 'Z':
			v = c - 'A'
		default:
			v = c - '2' + 26
		}
		acc = acc<<5 | uint32(v)
		bits += 5
		if bits >= 8 {
			bits -= 8
			dst[n] = byte(acc >> bits)
			n++
		}
	}
	return n
}

func isTextByte(b byte) bool { return b >= 0x20 && b < 0x7f || b == '\n' || b == '\t' || b == '\r' }

func isText(b []byte) bool {
	if len(b) < decodedTextMin {
		return false
	}
	letters := 0
	for _, c := range b {
		if !isTextByte(c) {
			return false
		}
		if c|0x20 >= 'a' && c|0x20 <= 'z' {
			letters++
		}
	}
	return letters*5 >= len(b)
}

// longestTextRun returns the longest run of printable bytes with at least
// half letters in it.
func longestTextRun(b []byte) int {
	best, run, letters := 0, 0, 0
	for _, c := range b {
		if isTextByte(c) && c != '\n' && c != '\t' && c != '\r' || c == '\n' {
			run++
			if c|0x20 >= 'a' && c|0x20 <= 'z' {
				letters++
			}
			if run > best && letters*2 >= run {
				best = run
			}
			continue
		}
		run, letters = 0, 0
	}
	return best
}

// splitPayload reports a head that starts with a run of two or more labels
// in one encoding alphabet that together look random: how a tunnel spreads
// more than one label's worth of data over a name. Machine-made hostnames put
// one hash next to word labels ("<hash>.us-east-1.prod...") or mix
// alphabets, which this does not match.
func splitPayload(head string) bool {
	const (
		minRunChars    = 40
		minRunEvidence = 40
	)
	var (
		labels   int
		chars    int
		evidence float64
		alphabet float64
	)
	for label := range strings.SplitSeq(head, ".") {
		a := alphabetSize(label)
		hex := a == 16 && hasDigit(label) && len(label) >= 2
		ev := labelEvidence(label)
		if !hex && !(len(label) >= 8 && ev > 0) {
			break
		}
		if labels > 0 && a != alphabet && !(hex && alphabet == 16) {
			break
		}
		if labels == 0 || a > alphabet {
			alphabet = a
		}
		labels++
		chars += len(label)
		evidence += max(ev, 0)
	}
	return labels >= 2 && chars >= minRunChars && evidence >= minRunEvidence
}

// nameMemo remembers analyses of recent names: the analysis is a pure
// function of the name, and most queries repeat a name. Two generations of
// at most memoGeneration entries each bound the memory: when the current one
// fills up it becomes the previous one and the oldest is dropped.
type nameMemo struct {
	mu        sync.Mutex
	cur, prev map[string]nameInfo
}

const memoGeneration = 32 << 10

func newNameMemo() *nameMemo {
	return &nameMemo{cur: make(map[string]nameInfo), prev: make(map[string]nameInfo)}
}

func (m *nameMemo) analyze(name string) nameInfo {
	m.mu.Lock()
	if info, ok := m.cur[name]; ok {
		m.mu.Unlock()
		return info
	}
	if info, ok := m.prev[name]; ok {
		m.store(name, info)
		m.mu.Unlock()
		return info
	}
	m.mu.Unlock()
	info := analyzeName(name)
	m.mu.Lock()
	m.store(name, info)
	m.mu.Unlock()
	return info
}

func (m *nameMemo) store(name string, info nameInfo) {
	if len(m.cur) >= memoGeneration {
		m.prev, m.cur = m.cur, make(map[string]nameInfo, memoGeneration)
	}
	m.cur[name] = info
}
