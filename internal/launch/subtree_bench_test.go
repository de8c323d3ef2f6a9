package launch_test

import (
	"context"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/launch"
)

// BenchmarkExecSubtree times one launch of /bin/true with the exec
// restrictions (seccomp, Landlock's default rules), without and with the
// subtree namespaces and the capability drop: their cost per
// `watcher exec` run (docs/concepts/exec-privilege.md). Run the cases in one
// go test invocation and compare ratios, not absolute times.
func BenchmarkExecSubtree(b *testing.B) {
	enforcetest.RequireRoot(b)
	if launch.LandlockABI() == 0 {
		b.Skip("Landlock is not available on this kernel")
	}
	sandbox := enforcetest.Cgroup(b, "launchbench")
	ws := b.TempDir()
	rules := launch.DefaultFileRules(ws)
	none := launch.CapSet(0)
	for _, bc := range []struct {
		name string
		ns   uintptr
		caps *launch.CapSet
	}{
		{"plain", 0, nil},
		{"caps", 0, &none},
		{"namespaces", launch.SubtreeNamespaces, nil},
		{"namespaces+caps", launch.SubtreeNamespaces, &none},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := launch.Config{Path: "/bin/true", Sandbox: "bench", CgroupParent: sandbox, Label: "bench",
				Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: &rules, Capabilities: bc.caps},
				Isolation:    launch.Isolation{Namespaces: bc.ns}}
			for i := 0; i < b.N; i++ {
				v, err := launch.Run(context.Background(), cfg)
				if err != nil || v.ExitCode != 0 {
					b.Fatalf("run: %v %s", err, v)
				}
			}
		})
	}
}
