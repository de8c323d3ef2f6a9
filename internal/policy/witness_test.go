package policy

import (
	"strings"
	"testing"
)

const witnessKey = "witness.example/w1+ae2b2e1a+BKQ9nB3GrLBxAfL+ERbz2i13TmMCfwNXVx2fdVC9YvAU"

func witnessPolicy(witnesses string) string {
	return "version: 1\nagent:\n  witnesses:\n" + witnesses + "sandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n"
}

func TestWitnesses(t *testing.T) {
	p, err := Parse("w.yaml", []byte(witnessPolicy("    - url: http://127.0.0.1:7380\n      key: "+witnessKey+"\n")))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Agent.Witnesses) != 1 || p.Agent.Witnesses[0].URL != "http://127.0.0.1:7380" || p.Agent.Witnesses[0].Key != witnessKey {
		t.Fatalf("witnesses %+v", p.Agent.Witnesses)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"    - url: ftp://x\n      key: " + witnessKey + "\n", "witnesses[0].url"},
		{"    - url: http://127.0.0.1:1\n", "witnesses[0].key: required"},
		{"    - url: http://127.0.0.1:1\n      key: nope\n", "not a witness verifier key"},
		{"    - url: http://127.0.0.1:1\n      key: " + witnessKey + "\n      quorum: 2\n", "quorum"},
		{"    - url: http://127.0.0.1:1\n      key: " + witnessKey + "\n    - url: http://127.0.0.1:2\n      key: " + witnessKey + "\n", "listed twice"},
	} {
		_, err := Parse("w.yaml", []byte(witnessPolicy(tc.yaml)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
