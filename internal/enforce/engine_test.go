package enforce_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

func TestEngineSandboxSetAndAdoption(t *testing.T) {
	eng := enforcetest.Engine(t)
	cg := enforcetest.Cgroup(t, "sb")
	id, err := eng.AddSandbox(cg, 7, enforce.SandboxRecordOnly)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := cgroupfs.ID(cg)
	if id != want {
		t.Fatalf("cgroup id %d, want inode %d", id, want)
	}
	// A second engine on the same pins (a restarted agent) sees the set.
	again, err := enforce.Open(enforce.Options{PinDir: eng.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got, err := again.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := got[id]; !ok || v[0] != 7 || v[1] != enforce.SandboxRecordOnly {
		t.Fatalf("adopted sandbox set %v, want %d -> [7 1]", got, id)
	}
	if _, err := os.Stat(filepath.Join(enforce.MapPinDir(eng.PinDir()), "sandboxes")); err != nil {
		t.Fatalf("sandboxes map not pinned: %v", err)
	}
	if err := again.RemoveSandbox(id); err != nil {
		t.Fatal(err)
	}
	got, _ = eng.Sandboxes()
	if _, ok := got[id]; ok {
		t.Fatal("sandbox still present after removal")
	}
	if _, err := eng.AddSandbox(filepath.Join(cg, "missing"), 1, 0); err == nil {
		t.Fatal("adding a missing cgroup succeeded")
	}
}
