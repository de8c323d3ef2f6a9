package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/pkg/toolproto"
)

// newWorkspace makes a workspace with benign files and escape attempts:
// symlinks out, /proc/self/root, a hard link to a file outside.
func newWorkspace(t *testing.T) (ws, outside string) {
	t.Helper()
	base := t.TempDir()
	ws = filepath.Join(base, "a", "b", "ws")
	outside = filepath.Join(base, "secret.txt")
	must(t, os.MkdirAll(filepath.Join(ws, "src"), 0o755))
	must(t, os.WriteFile(outside, []byte("outside secret\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(ws, "src", "main.go"), []byte("package main\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(ws, "README"), []byte("hello\n"), 0o644))
	must(t, os.Symlink("/etc/passwd", filepath.Join(ws, "abs-link")))
	must(t, os.Symlink("../../../secret.txt", filepath.Join(ws, "rel-out")))
	must(t, os.Symlink("/proc/self/root", filepath.Join(ws, "procroot")))
	must(t, os.Symlink("src/main.go", filepath.Join(ws, "in-link")))
	must(t, os.Link(outside, filepath.Join(ws, "hard")))
	return ws, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReadFileConfined(t *testing.T) {
	ws, outside := newWorkspace(t)
	for _, follow := range []bool{false, true} {
		r := Root{Dir: ws, FollowSymlinks: follow}
		// Benign neighbours work.
		for _, p := range []string{"README", "src/main.go", "./src/../README", filepath.Join(ws, "README")} {
			fc, err := r.ReadFile(p, 0, 1024)
			if err != nil {
				t.Errorf("follow=%v %s: %v", follow, p, err)
				continue
			}
			if fc.Content == "" || fc.Encoding != "utf-8" {
				t.Errorf("%s: %+v", p, fc)
			}
		}
		inLink, err := r.ReadFile("in-link", 0, 1024)
		if follow && (err != nil || inLink.Content != "package main\n") {
			t.Errorf("symlink inside the workspace not followed: %v", err)
		}
		if !follow && pathErrType(err) != toolproto.TypeSymlink {
			t.Errorf("follow=false: in-link err = %v, want %s", err, toolproto.TypeSymlink)
		}
		refused := map[string]string{
			"../../etc/passwd":              toolproto.TypeOutside,
			"../../../secret.txt":           toolproto.TypeOutside,
			"/etc/passwd":                   toolproto.TypeOutside,
			"/proc/self/root/etc/passwd":    toolproto.TypeOutside,
			"src/../../ws/../../secret.txt": toolproto.TypeOutside,
			"procroot/etc/passwd":           toolproto.TypeOutside,
			"hard":                          toolproto.TypeHardlink,
			"src":                           toolproto.TypeNotRegular,
			"/proc/self/fd/0":               toolproto.TypeOutside,
			ws + "/../secret.txt":           toolproto.TypeOutside,
			"missing":                       toolproto.TypeNotFound,
		}
		if follow {
			refused["abs-link"] = toolproto.TypeOutside
			refused["rel-out"] = toolproto.TypeOutside
		} else {
			refused["abs-link"] = toolproto.TypeSymlink
			refused["rel-out"] = toolproto.TypeSymlink
			refused["procroot/etc/passwd"] = toolproto.TypeSymlink
		}
		for p, want := range refused {
			fc, err := r.ReadFile(p, 0, 1024)
			if pathErrType(err) != want {
				t.Errorf("follow=%v %s: err = %v (%+v), want %s", follow, p, err, fc, want)
			}
			if fc != nil && strings.Contains(fc.Content, "secret") {
				t.Errorf("%s leaked the outside file", p)
			}
		}
	}
	_ = outside
}

func pathErrType(err error) string {
	var pe *PathError
	if errors.As(err, &pe) {
		return pe.Type
	}
	if err != nil {
		return "other:" + err.Error()
	}
	return ""
}

func TestWriteFileConfined(t *testing.T) {
	ws, outside := newWorkspace(t)
	r := Root{Dir: ws}
	res, err := r.WriteFile("src/new.txt", []byte("new\n"))
	if err != nil || !res.Created {
		t.Fatalf("benign write: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "new.txt")); string(b) != "new\n" {
		t.Fatalf("content %q", b)
	}
	// Overwriting the hard link replaces the name, never the outside file.
	if _, err := r.WriteFile("hard", []byte("overwritten\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside secret\n" {
		t.Fatalf("write went through the hard link: outside now %q", b)
	}
	// Same for a symlink pointing out.
	if _, err := r.WriteFile("rel-out", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside secret\n" {
		t.Fatalf("write went through the symlink: outside now %q", b)
	}
	for p, want := range map[string]string{
		"../../x.txt":           toolproto.TypeOutside,
		"/tmp/x.txt":            toolproto.TypeOutside,
		"procroot/tmp/x.txt":    toolproto.TypeSymlink,
		"src":                   toolproto.TypeNotRegular,
		"nodir/x.txt":           toolproto.TypeNotFound,
		"/proc/self/root/tmp/x": toolproto.TypeOutside,
	} {
		if _, err := r.WriteFile(p, []byte("x")); pathErrType(err) != want {
			t.Errorf("write %s: err = %v, want %s", p, err, want)
		}
	}
	if _, err := os.Stat("/tmp/x.txt"); err == nil {
		t.Error("/tmp/x.txt was written")
	}
	entries, _ := os.ReadDir(filepath.Join(ws, "src"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".watcher-tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

func TestListDirConfined(t *testing.T) {
	ws, _ := newWorkspace(t)
	r := Root{Dir: ws}
	l, err := r.ListDir(".", 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range l.Entries {
		got[e.Name] = e.Type
	}
	if got["src"] != "directory" || got["README"] != "file" || got["abs-link"] != "symlink" {
		t.Errorf("listing = %v", got)
	}
	if l, err := r.ListDir(".", 2); err != nil || len(l.Entries) != 2 || !l.Truncated {
		t.Errorf("cap: %+v %v", l, err)
	}
	for p, want := range map[string]string{"..": toolproto.TypeOutside, "/": toolproto.TypeOutside, "procroot": toolproto.TypeSymlink, "/proc/self/root": toolproto.TypeOutside} {
		if _, err := r.ListDir(p, 10); pathErrType(err) != want {
			t.Errorf("list %s: %v, want %s", p, err, want)
		}
	}
}
