package audit

import (
	"math"
	"strconv"
	"strings"
)

// Redacted is what a secret value is replaced with.
const Redacted = "***"

// Redact replaces values that look like secrets with "***" and lists the
// fields it touched in e.Redacted, so an audit record never becomes the leak.
// It reports whether anything was replaced.
//
// Redact never writes into memory the caller may share with other sinks: the
// Args slice and Labels map are copied before the first change.
//
// What counts as a secret:
//   - key=value where the key names a secret (password, passwd, passphrase,
//     token, secret, api_key/apikey/api-key, access_key, private_key,
//     credential, auth): the value is replaced;
//   - a long flag naming a secret without "=" (--password X, --api-key X):
//     the next argument is replaced;
//   - HTTP credential headers (Authorization, Proxy-Authorization, Cookie,
//     X-Api-Key, X-Auth-Token): everything after the colon;
//   - passwords in URLs (scheme://user:password@host);
//   - AWS access key ids (AKIA..., ASIA..., 20 characters);
//   - GitHub, GitLab and Slack tokens by their prefixes (ghp_, github_pat_,
//     glpat-, xoxb-, ...);
//   - PEM private key blocks (BEGIN ... PRIVATE KEY to END ... PRIVATE KEY);
//   - in argv and label values only: tokens of at least 24 characters drawn
//     from upper case, lower case and digits together whose Shannon entropy
//     is at least 4 bits per character (API tokens, AWS secret keys).
//     Hex digests and UUIDs (no upper case) are kept: they identify things
//     and are routinely passed on command lines.
func Redact(e *Event) bool {
	changed := false
	args := e.Process.Args
	copied := false
	skipNext := false
	for i, a := range args {
		var out string
		var hit bool
		if skipNext {
			out, hit = Redacted, a != Redacted
			skipNext = false
		} else {
			out, hit = redactString(a, true)
		}
		if secretFlag(a) {
			skipNext = true
		}
		if !hit {
			continue
		}
		if !copied {
			args = append([]string(nil), args...)
			copied = true
		}
		args[i] = out
		e.Redacted = append(e.Redacted, "process.args["+strconv.Itoa(i)+"]")
		changed = true
	}
	if copied {
		e.Process.Args = args
	}
	if out, hit := redactString(e.Message, false); hit {
		e.Message = out
		e.Redacted = append(e.Redacted, "message")
		changed = true
	}
	if len(e.Sandbox.Labels) > 0 {
		var labels map[string]string
		for k, v := range e.Sandbox.Labels {
			out, hit := redactString(v, true)
			if !hit && secretKey(k) && v != "" && v != Redacted {
				out, hit = Redacted, true
			}
			if !hit {
				continue
			}
			if labels == nil {
				labels = make(map[string]string, len(e.Sandbox.Labels))
				for k2, v2 := range e.Sandbox.Labels {
					labels[k2] = v2
				}
			}
			labels[k] = out
			e.Redacted = append(e.Redacted, "sandbox.labels["+k+"]")
			changed = true
		}
		if labels != nil {
			e.Sandbox.Labels = labels
		}
	}
	if e.Tool != nil && e.Tool.Arguments != "" {
		if out, hit := redactString(e.Tool.Arguments, false); hit {
			t := *e.Tool
			t.Arguments = out
			e.Tool = &t
			e.Redacted = append(e.Redacted, "tool.arguments")
			changed = true
		}
	}
	if e.Mount != nil && e.Mount.Source != "" {
		if out, hit := redactString(e.Mount.Source, false); hit {
			m := *e.Mount
			m.Source = out
			e.Mount = &m
			e.Redacted = append(e.Redacted, "mount.source")
			changed = true
		}
	}
	return changed
}

// secretWords are key fragments that mark the value as a secret.
var secretWords = []string{
	"password", "passwd", "passphrase", "token", "secret", "apikey", "api_key", "api-key",
	"access_key", "accesskey", "access-key", "private_key", "privatekey", "private-key",
	"credential", "auth",
}

// secretKey reports whether a key (env var name, flag, query parameter)
// names a secret.
func secretKey(k string) bool {
	if len(k) < 4 {
		return false
	}
	lk := strings.ToLower(k)
	for _, w := range secretWords {
		if strings.Contains(lk, w) {
			// "author" and "authority" are not credentials.
			if w == "auth" && (strings.Contains(lk, "author") && !strings.Contains(lk, "authorization")) {
				continue
			}
			return true
		}
	}
	return false
}

// secretFlag reports whether a is a long flag naming a secret whose value is
// the next argument (--password X). Flags with "=" carry their value inline.
func secretFlag(a string) bool {
	if !strings.HasPrefix(a, "--") || strings.ContainsRune(a, '=') {
		return false
	}
	name := strings.ToLower(a[2:])
	for _, suffix := range []string{"password", "passwd", "passphrase", "token", "secret", "api-key", "apikey", "api_key", "access-key", "secret-key", "private-key"} {
		if name == suffix || strings.HasSuffix(name, "-"+suffix) || strings.HasSuffix(name, "_"+suffix) {
			return true
		}
	}
	return false
}

// redactString applies the rules to one string; entropy enables the
// high-entropy token rule (argv, labels).
func redactString(s string, entropy bool) (string, bool) {
	if len(s) < 8 || s == Redacted || !maySecret(s) {
		return s, false
	}
	orig := s
	s = redactPEM(s)
	s = redactHeaders(s)
	s = redactKeyValues(s)
	s = redactURLPasswords(s)
	s = redactTokens(s, entropy)
	return s, s != orig
}

// maySecret is a single-pass filter: every rule needs a '=' or ':', a run
// of five dashes (PEM) or a token of at least 20 characters.
func maySecret(s string) bool {
	run, dashes := 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '=' || c == ':':
			return true
		case c == '-':
			if dashes++; dashes >= 5 {
				return true
			}
		default:
			dashes = 0
		}
		if isTokenByte(c) {
			if run++; run >= 20 {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// redactPEM replaces private key blocks.
func redactPEM(s string) string {
	for {
		i := strings.Index(s, "-----BEGIN ")
		if i < 0 {
			return s
		}
		hdrEnd := strings.Index(s[i+11:], "-----")
		if hdrEnd < 0 {
			return s
		}
		label := s[i+11 : i+11+hdrEnd]
		if !strings.HasSuffix(label, "PRIVATE KEY") {
			// Certificates and public keys are not secrets; look further on.
			rest := redactPEM(s[i+11+hdrEnd+5:])
			return s[:i+11+hdrEnd+5] + rest
		}
		end := strings.Index(s[i:], "-----END "+label+"-----")
		if end < 0 {
			return s[:i] + Redacted
		}
		s = s[:i] + Redacted + s[i+end+len("-----END "+label+"-----"):]
	}
}

var credentialHeaders = []string{"proxy-authorization:", "authorization:", "cookie:", "x-api-key:", "x-auth-token:"}

// redactHeaders replaces the values of HTTP credential headers up to the end
// of the line.
func redactHeaders(s string) string {
	if !strings.ContainsRune(s, ':') {
		return s
	}
	lower := strings.ToLower(s)
	for _, h := range credentialHeaders {
		from := 0
		for {
			j := strings.Index(lower[from:], h)
			if j < 0 {
				break
			}
			j += from
			// "proxy-authorization:" also contains "authorization:"; the
			// earlier, longer match already redacted it.
			if j > 0 && isKeyByte(lower[j-1]) {
				from = j + len(h)
				continue
			}
			v := j + len(h)
			for v < len(s) && s[v] == ' ' {
				v++
			}
			end := strings.IndexAny(s[v:], "\r\n")
			if end < 0 {
				end = len(s) - v
			}
			if s[v:v+end] != Redacted && end > 0 {
				s = s[:v] + Redacted + s[v+end:]
				lower = strings.ToLower(s)
			}
			from = v + len(Redacted)
			if from > len(s) {
				break
			}
		}
	}
	return s
}

func isKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

// redactKeyValues replaces the value of key=value pairs whose key names a
// secret. The value ends at whitespace, '&', ';', ',' or a quote.
func redactKeyValues(s string) string {
	from := 0
	for {
		j := strings.IndexByte(s[from:], '=')
		if j < 0 {
			return s
		}
		j += from
		k := j
		for k > 0 && isKeyByte(s[k-1]) {
			k--
		}
		v := j + 1
		end := v
		for end < len(s) && !strings.ContainsRune(" \t\r\n&;,\"'", rune(s[end])) {
			end++
		}
		if k < j && secretKey(s[k:j]) && end > v && s[v:end] != Redacted {
			s = s[:v] + Redacted + s[end:]
			end = v + len(Redacted)
		}
		from = end
		if from >= len(s) {
			return s
		}
	}
}

// redactURLPasswords replaces the password in scheme://user:password@host
// and in //user:password@host/share (CIFS sources).
func redactURLPasswords(s string) string {
	from := 0
	for {
		var start int
		if from == 0 && strings.HasPrefix(s, "//") {
			start = 2
		} else {
			j := strings.Index(s[from:], "://")
			if j < 0 {
				return s
			}
			start = from + j + 3
		}
		end := start
		for end < len(s) && !strings.ContainsRune("/?# \t\r\n\"'", rune(s[end])) {
			end++
		}
		auth := s[start:end]
		at := strings.LastIndexByte(auth, '@')
		if at > 0 {
			if c := strings.IndexByte(auth[:at], ':'); c >= 0 && auth[c+1:at] != Redacted && c+1 < at {
				s = s[:start+c+1] + Redacted + s[start+at:]
				end = start + c + 1 + len(Redacted) + (len(auth) - at)
			}
		}
		from = end
		if from >= len(s) {
			return s
		}
	}
}

var awsPrefixes = []string{"AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"}

func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=' || c == '_' || c == '-'
}

// redactTokens replaces AWS access key ids and, when entropy is set, long
// high-entropy tokens.
func redactTokens(s string, entropy bool) string {
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); {
		if !isTokenByte(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isTokenByte(s[j]) {
			j++
		}
		tok := s[i:j]
		if secret(tok, entropy) {
			b.WriteString(s[last:i])
			b.WriteString(Redacted)
			last = j
		} else if strings.HasPrefix(tok, "/") || strings.Contains(tok, "//") {
			// A path: judge its components one by one.
			for _, part := range splitKeep(tok, '/') {
				if part.s != "" && secret(part.s, entropy) {
					b.WriteString(s[last : i+part.off])
					b.WriteString(Redacted)
					last = i + part.off + len(part.s)
				}
			}
		}
		i = j
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

type piece struct {
	s   string
	off int
}

func splitKeep(s string, sep byte) []piece {
	var out []piece
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == sep {
			out = append(out, piece{s[start:i], start})
			start = i + 1
		}
	}
	return out
}

// tokenPrefixes mark credentials by their documented format, found in any
// field (not only argv): GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_,
// github_pat_), GitLab personal tokens, Slack tokens.
var tokenPrefixes = []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xoxb-", "xoxp-", "xoxa-"}

func secret(tok string, entropy bool) bool {
	if len(tok) >= 20 {
		for _, p := range tokenPrefixes {
			if strings.HasPrefix(tok, p) {
				return true
			}
		}
	}
	if len(tok) == 20 {
		for _, p := range awsPrefixes {
			if strings.HasPrefix(tok, p) && allUpperDigit(tok) {
				return true
			}
		}
	}
	if !entropy || len(tok) < 24 || strings.HasPrefix(tok, "/") {
		return false
	}
	var upper, lower, digit bool
	var counts [256]int
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		counts[c]++
		switch {
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= '0' && c <= '9':
			digit = true
		}
	}
	if !(upper && lower && digit) {
		return false
	}
	h := 0.0
	n := float64(len(tok))
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h >= 4.0
}

func allUpperDigit(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
