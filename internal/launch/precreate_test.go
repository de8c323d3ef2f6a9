package launch

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/watcherhq/watcher/internal/policy"
)

// TestPrecreateWritable: a write-allowed tool cache below home that does
// not exist yet is created (so Landlock can grant it), while rules outside
// home, with wildcards, read-only, or below a write-refusing rule create
// nothing, and a symlink on the way is never followed.
func TestPrecreateWritable(t *testing.T) {
	home := t.TempDir()
	outside := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(home, ".config"), 0o755))
	must(os.Symlink(outside, filepath.Join(home, "link")))
	w := func(path string) policy.FileRule {
		return policy.FileRule{Name: "w", Path: path, Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow}
	}
	rules := []policy.FileRule{
		w(home + "/.config/go/telemetry/"),
		w(home + "/.cache/*/x/"),
		w(filepath.Dir(home) + "/*/.npm/_cacache/"),
		w("/nonexistent-top/*/.npm/"),
		w(outside + "/made/"),
		w(home + "/secret/sub/"),
		{Name: "deny", Path: home + "/secret/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionBlock},
		{Name: "r", Path: home + "/ro/", Match: policy.MatchPrefix, Access: policy.AccessRead, Action: policy.ActionAllow},
		w(home + "/link/evil/"),
		w(home + "/.ssh/keys/"),
		{Name: "deny-ssh", Path: filepath.Dir(home) + "/*/.ssh/", Match: policy.MatchPrefix, Action: policy.ActionBlock},
	}
	made := PrecreateWritable(rules, home)
	want := []string{home + "/.config/go", home + "/.config/go/telemetry", home + "/.npm", home + "/.npm/_cacache"}
	if !slices.Equal(made, want) {
		t.Errorf("created %v, want %v", made, want)
	}
	if st, err := os.Stat(home + "/.config/go/telemetry"); err != nil || !st.IsDir() {
		t.Errorf("tool cache not created: %v", err)
	}
	for _, p := range []string{home + "/.cache", outside + "/made", home + "/secret", home + "/ro", outside + "/evil", home + "/.ssh"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s created", p)
		}
	}
	if again := PrecreateWritable(rules, home); len(again) != 0 {
		t.Errorf("second run created %v", again)
	}
}
