package launch_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// planTree builds a small tree the way a host looks to a restricted
// sandbox: credentials in etc and a home, a workspace, a scratch directory
// holding an agent directory, and a symlink to etc.
func planTree(t *testing.T) (string, *launch.FileRules) {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"etc/ssl/certs", "etc/sudoers.d", "home/alice/.ssh", "home/alice/.cache", "home/bob", "ws/src", "tmp/agent", "tmp/other"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"etc/shadow", "etc/hostname", "etc/sudoers", "etc/sudoers.d/a", "etc/ssl/certs/ca.pem",
		"home/alice/.ssh/id_ed25519", "home/alice/.gitconfig", "home/bob/notes", "ws/src/main.c", "tmp/agent/ledger", "tmp/other/f"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(root, "etc"), filepath.Join(root, "etc-link")); err != nil {
		t.Fatal(err)
	}
	block := func(name, path string, m policy.Match, a policy.Access) policy.FileRule {
		return policy.FileRule{Name: name, Path: root + path, Match: m, Access: a, Action: policy.ActionBlock}
	}
	allowW := func(path string) policy.FileRule {
		return policy.FileRule{Name: "w", Path: root + path, Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow}
	}
	r := &launch.FileRules{
		Derive: true,
		Files: []policy.FileRule{
			{Name: "write-outside-workspace", Path: "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionBlock},
			allowW("/ws/"), allowW("/tmp/"),
			block("cred-shadow", "/etc/shadow", policy.MatchExact, policy.AccessAny),
			block("cred-sudoers", "/etc/sudoers", policy.MatchPrefix, policy.AccessAny),
			block("user-ssh", "/home/*/.ssh/", policy.MatchPrefix, policy.AccessAny),
			block("agent-files", "/tmp/agent/", policy.MatchPrefix, policy.AccessAny),
		},
		Exec: []policy.FileRule{
			{Name: "exec-from-tmp", Path: root + "/tmp/", Match: policy.MatchPrefix, Action: policy.ActionBlock},
			{Name: "workspace", Path: root + "/ws/", Match: policy.MatchPrefix, Action: policy.ActionAllow},
		},
	}
	return root, r
}

// effective is what Landlock grants at path under the plan: the union of
// the grants on the path and its ancestors (listing-only grants give
// READ_DIR, which counts as read for directories).
func effective(plan launch.FilePlan, path string, dir bool) int {
	by := map[string]launch.Grant{}
	for _, g := range plan.Grants {
		by[g.Path] = g
	}
	classes := 0
	for p := path; ; p = filepath.Dir(p) {
		if g, ok := by[p]; ok {
			classes |= g.Classes
			if g.ListDir && dir {
				classes |= launch.ClassRead
			}
		}
		if p == "/" {
			return classes
		}
	}
}

func policyAllows(r *launch.FileRules, class int, path string) bool {
	rules, write := r.Files, class == launch.ClassWrite
	if class == launch.ClassExec {
		rules, write = r.Exec, false
	}
	d, ok := policy.DecideFile(rules, path, write)
	return !ok || d.Action == policy.ActionAllow || d.Action == policy.ActionRecord
}

func TestPlanFilesComplement(t *testing.T) {
	root, r := planTree(t)
	plan, err := launch.PlanFiles(r)
	if err != nil {
		t.Fatal(err)
	}
	// Every existing path of the tree gets exactly what the policy says,
	// except below the directory the run writes to (granted whole, with a
	// note naming the rule left to the kernel hooks).
	overGranted := root + "/tmp/agent"
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return nil
		}
		for _, class := range []int{launch.ClassRead, launch.ClassWrite, launch.ClassExec} {
			if class == launch.ClassExec && fi.IsDir() {
				continue // only files are executed
			}
			got := effective(plan, p, fi.IsDir())&class != 0
			want := policyAllows(r, class, p)
			if fi.IsDir() && class == launch.ClassRead && !want && got {
				// READ_DIR inherited from a readable parent: listing
				// only, the documented limit; files below stay refused.
				continue
			}
			if got != want && !(strings.HasPrefix(p, overGranted) && got) {
				t.Errorf("%s: class %d granted=%t, policy allows=%t", p, class, got, want)
			}
		}
		return nil
	})
	for _, p := range []string{"/etc/shadow", "/etc/sudoers", "/etc/sudoers.d/a", "/home/alice/.ssh/id_ed25519"} {
		if effective(plan, root+p, false)&launch.ClassRead != 0 {
			t.Errorf("%s readable under the plan", p)
		}
	}
	for _, g := range plan.Grants {
		if g.Path == root+"/etc-link" {
			t.Errorf("symlink granted: %+v", g)
		}
	}
	joined := strings.Join(plan.Notes, "\n")
	if !strings.Contains(joined, "reads of "+root+"/tmp granted whole") || !strings.Contains(joined, "agent-files") {
		t.Errorf("notes do not name the over-grant of %s/tmp:\n%s", root, joined)
	}
	if !strings.Contains(joined, "entries created in "+root+"/etc after launch are refused") {
		t.Errorf("notes do not name the limit on new entries in etc:\n%s", joined)
	}

	// Entries created after planning: in the writable scratch directory
	// they are usable; in etc they are not granted (the documented limit).
	if effective(plan, root+"/tmp/new", false)&(launch.ClassRead|launch.ClassWrite) != launch.ClassRead|launch.ClassWrite {
		t.Error("a new file in the writable scratch directory is not readable and writable")
	}
	if effective(plan, root+"/tmp/new", false)&launch.ClassExec != 0 {
		t.Error("a new file in the scratch directory is executable")
	}
	if effective(plan, root+"/etc/new", false)&launch.ClassRead != 0 {
		t.Error("a file created later in etc is granted: the plan cannot know it")
	}
	if effective(plan, root+"/ws/new/deep", false) != launch.ClassRead|launch.ClassWrite|launch.ClassExec {
		t.Error("the workspace is not granted whole")
	}
}

// The workspace wherever it lives: under the exec-blocked scratch
// directory it still runs, while the rest of the scratch directory does
// not, including entries created there later.
func TestPlanFilesWorkspaceUnderTmp(t *testing.T) {
	root, r := planTree(t)
	ws := root + "/tmp/ws"
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	r.Exec = append(r.Exec, policy.FileRule{Name: "workspace", Path: ws + "/", Match: policy.MatchPrefix, Action: policy.ActionAllow})
	plan, err := launch.PlanFiles(r)
	if err != nil {
		t.Fatal(err)
	}
	if effective(plan, ws+"/build/a.out", false)&launch.ClassExec == 0 {
		t.Error("exec in a workspace under the scratch directory not granted")
	}
	for _, p := range []string{root + "/tmp/other/f", root + "/tmp/dropped"} {
		if effective(plan, p, false)&launch.ClassExec != 0 {
			t.Errorf("exec of %s granted", p)
		}
	}
}

// Symlinked rule paths name the real tree: a rule on a symlinked directory
// applies where Landlock judges, at its target.
func TestPlanFilesResolvesRuleSymlinks(t *testing.T) {
	root, r := planTree(t)
	r.Files = append(r.Files, policy.FileRule{Name: "via-link", Path: root + "/etc-link/hostname", Match: policy.MatchExact, Access: policy.AccessRead, Action: policy.ActionBlock})
	plan, err := launch.PlanFiles(r)
	if err != nil {
		t.Fatal(err)
	}
	if effective(plan, root+"/etc/hostname", false)&launch.ClassRead != 0 {
		t.Error("a file blocked through a symlinked path is readable at its real path")
	}
	if effective(plan, root+"/etc/ssl/certs/ca.pem", false)&launch.ClassRead == 0 {
		t.Error("its sibling subtree is not readable")
	}
}

// A rule allowing entries by name in a directory the run writes to
// ("/tmp/go-build" for go test's binaries) cannot be listed ahead of time:
// the directory is granted whole for that class, with a note.
func TestPlanFilesNamePrefixInWritableDir(t *testing.T) {
	root, r := planTree(t)
	r.Exec = append(r.Exec, policy.FileRule{Name: "go-build", Path: root + "/tmp/go-build", Match: policy.MatchPrefix, Action: policy.ActionAllow})
	plan, err := launch.PlanFiles(r)
	if err != nil {
		t.Fatal(err)
	}
	if effective(plan, root+"/tmp/go-build123/b001/x.test", false)&launch.ClassExec == 0 {
		t.Error("exec of a later go-build binary not granted")
	}
	if !strings.Contains(strings.Join(plan.Notes, "\n"), "execs of "+root+"/tmp granted whole (the run may create entries there that go-build") {
		t.Errorf("no note for the whole grant:\n%s", strings.Join(plan.Notes, "\n"))
	}
	// Without the rule the scratch directory stays unexecutable.
	_, r2 := planTree(t)
	plan2, _ := launch.PlanFiles(r2)
	for _, g := range plan2.Grants {
		if strings.HasSuffix(g.Path, "/tmp") && g.Classes&launch.ClassExec != 0 {
			t.Errorf("scratch directory executable without the rule: %+v", g)
		}
	}
}
