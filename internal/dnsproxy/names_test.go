package dnsproxy

import "testing"

func TestNameListed(t *testing.T) {
	p := policyOf(map[string]*SandboxPolicy{
		"sb":   {Allow: []string{".cdn.test", "exact.test"}, Deny: []string{"bad.cdn.test"}},
		"open": {Default: "allow"},
	})
	s, err := New(Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sandbox, name string
		want          bool
	}{
		{"sb", "a.cdn.test", true}, {"sb", "A.CDN.TEST.", true}, {"sb", "exact.test", true},
		{"sb", "bad.cdn.test", false}, {"sb", "x.exact.test", false}, {"sb", "other.test", false},
		{"open", "anything.test", false}, // a default lists nothing
		{"nobody", "a.cdn.test", false},
	} {
		if got := s.NameListed(c.sandbox, c.name); got != c.want {
			t.Errorf("NameListed(%s, %s) = %v", c.sandbox, c.name, got)
		}
	}
}
