package e2etest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

type built struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*built{}
)

// Binary builds the Go package pkg (a path go build understands, from the
// test's directory) once per test process, with env added to the build's
// environment, and returns the binary's path. The suites run the real
// binaries as separate processes, as an operator would. RemoveBinaries
// removes them (call it from TestMain).
func Binary(t testing.TB, pkg string, env ...string) string {
	t.Helper()
	key := fmt.Sprint(pkg, env)
	buildsMu.Lock()
	b := builds[key]
	if b == nil {
		b = &built{}
		builds[key] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "watcher-e2e-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		if pkg == "." {
			wd, _ := os.Getwd()
			b.path = filepath.Join(dir, filepath.Base(wd))
		}
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// RemoveBinaries removes what Binary built.
func RemoveBinaries() {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	for _, b := range builds {
		if b.path != "" {
			os.RemoveAll(filepath.Dir(b.path))
		}
	}
}
