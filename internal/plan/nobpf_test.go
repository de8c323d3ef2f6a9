package plan

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The planner is pure: it builds the layers' rule types
// (internal/enforce/rules/...) and loads nothing, so neither it nor
// anything it imports may pull in the BPF library. A layer type it needs
// belongs in its rules package, not in the loader.
func TestNoBPF(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Skip("no go tool to list the dependencies")
		}
	}
	for _, pkg := range []string{".", "../enforce/rules/..."} {
		out, err := exec.Command(goTool, "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for dep := range strings.SplitSeq(string(out), "\n") {
			if strings.HasPrefix(dep, "github.com/cilium/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
