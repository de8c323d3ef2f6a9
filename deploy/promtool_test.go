package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// ruleFile is one Prometheus rule file, prometheus/NAME.yml, with its unit
// tests, prometheus/NAME_test.yml.
type ruleFile struct {
	promtool     string
	name         string
	rules, tests []byte
}

// promRules checks prometheus/NAME.yml with promtool and runs its unit
// tests (both must pass), then returns the two files' contents. It skips
// where promtool is not installed.
func promRules(t *testing.T, name string) *ruleFile {
	t.Helper()
	r := &ruleFile{promtool: lookTool(t, "promtool", "prometheus"), name: name}
	if out, err := run(t, "prometheus", r.promtool, "check", "rules", name+".yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err := run(t, "prometheus", r.promtool, "test", "rules", name+"_test.yml")
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("promtool test rules %s_test.yml:\n%s", name, out)
	if r.rules, err = os.ReadFile(filepath.Join("prometheus", name+".yml")); err != nil {
		t.Fatal(err)
	}
	if r.tests, err = os.ReadFile(filepath.Join("prometheus", name+"_test.yml")); err != nil {
		t.Fatal(err)
	}
	return r
}

// alerts returns the names of the file's alerting rules.
func (r *ruleFile) alerts() []string {
	var names []string
	for _, m := range regexp.MustCompile(`alert: (\w+)\n`).FindAllSubmatch(r.rules, -1) {
		names = append(names, string(m[1]))
	}
	return names
}

// requireTested fails for every alert of the file the unit tests do not
// name.
func (r *ruleFile) requireTested(t *testing.T) {
	t.Helper()
	for _, alert := range r.alerts() {
		if !bytes.Contains(r.tests, []byte("alertname: "+alert+"\n")) {
			t.Errorf("%s_test.yml does not test %s", r.name, alert)
		}
	}
}

// mustCatch shows the unit tests can fail: against the rules with old
// replaced by new (a rule that no longer fires when it should), they fail
// and name alert.
func (r *ruleFile) mustCatch(t *testing.T, alert, old, new string) {
	t.Helper()
	broken := bytes.Replace(r.rules, []byte(old), []byte(new), 1)
	if bytes.Equal(broken, r.rules) {
		t.Fatalf("could not break %s for the negative check: %q not in %s.yml", alert, old, r.name)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, r.name+".yml"), broken, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, r.name+"_test.yml"), r.tests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, dir, r.promtool, "test", "rules", r.name+"_test.yml"); err == nil || !strings.Contains(out, alert) {
		t.Errorf("broken %s passed the tests (err %v):\n%s", alert, err, out)
	}
}
