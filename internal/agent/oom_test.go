package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLowerOOMScore(t *testing.T) {
	f := filepath.Join(t.TempDir(), "oom_score_adj")
	for _, c := range []struct {
		in, want string
		changed  bool
	}{{"0\n", "-900", true}, {"500", "-900", true}, {"-900", "-900", false}, {"-1000\n", "-1000\n", false}} {
		os.WriteFile(f, []byte(c.in), 0o600)
		_, changed, err := lowerOOMScore(f, -900)
		got, _ := os.ReadFile(f)
		if err != nil || changed != c.changed || string(got) != c.want {
			t.Errorf("from %q: changed %v (%v), file %q; want changed %v, %q", c.in, changed, err, got, c.changed, c.want)
		}
	}
	os.WriteFile(f, []byte("x"), 0o600)
	if _, _, err := lowerOOMScore(f, -900); err == nil {
		t.Error("a malformed value was accepted")
	}
}
