package mcpwrap

import (
	"regexp"

	"github.com/watcherhq/watcher/internal/policy"
)

// Pattern is a named regular expression of what a tool description must
// not carry: instructions to the model rather than a description (tool
// poisoning), credential paths, pipelines from the network.
type Pattern struct {
	Name string
	Re   *regexp.Regexp
}

// injectionPatterns are the markers of instructions hidden in a tool
// description, as published tool-poisoning attacks write them.
var injectionPatterns = []Pattern{
	{"hidden-instructions", regexp.MustCompile(`(?i)<\s*(important|system|instructions?|secret)\s*>`)},
	{"hidden-instructions", regexp.MustCompile(`(?i)\b(ignore|disregard|forget)\s+(all\s+|any\s+)?(the\s+)?(previous|prior|above|earlier)\s+(instructions|rules|messages)`)},
	{"hidden-instructions", regexp.MustCompile(`(?i)\b(do\s+not|don't|never)\s+(tell|mention|reveal|inform)\s+(the\s+)?user`)},
}

// DescriptionPatterns are the patterns tool descriptions are checked
// with: the injection markers and the sandbox's exchange patterns (the
// same suspicious content the gateway refuses between agents).
func DescriptionPatterns(sb *policy.Sandbox) []Pattern {
	out := append([]Pattern(nil), injectionPatterns...)
	for _, p := range sb.Tools.Exchange.Patterns {
		if re, err := regexp.Compile(p.Regex); err == nil { // validated with the policy
			out = append(out, Pattern{Name: p.Name, Re: re})
		}
	}
	return out
}

// suspicious returns the name of the first pattern the definition's
// description or schema matches ("" for none).
func suspicious(pats []Pattern, t Tool) string {
	for _, p := range pats {
		if p.Re.MatchString(t.Description) || p.Re.Match(t.InputSchema) {
			return p.Name
		}
	}
	return ""
}
