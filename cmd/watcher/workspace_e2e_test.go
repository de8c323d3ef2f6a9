package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/poll"
	"github.com/watcherhq/watcher/internal/workspace"
)

// ipcKeys returns the keys (as /proc/sysvipc lists them, decimal) that
// `ipcs` printed (hex) in out.
func ipcKeys(out string) []string {
	var keys []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[0], "0x") {
			if k, err := strconv.ParseUint(f[0][2:], 16, 32); err == nil && k != 0 {
				keys = append(keys, strconv.FormatInt(int64(int32(uint32(k))), 10))
			}
		}
	}
	return keys
}

// hostHasIPCKey reports whether the host's IPC namespace has an object of
// that key in /proc/sysvipc/{shm,sem}.
func hostHasIPCKey(t *testing.T, key string) bool {
	for _, f := range []string{"/proc/sysvipc/shm", "/proc/sysvipc/sem"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if fs := strings.Fields(line); len(fs) > 0 && fs[0] == key {
				return true
			}
		}
	}
	return false
}

func mustHash(t *testing.T, dir string) string {
	t.Helper()
	h, err := workspace.TreeHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// unmountOverlaysAtCleanup unmounts, at the test's end, the overlays the
// test's commands mounted in the state directory beside the ledger.
func unmountOverlaysAtCleanup(t *testing.T, tb *testbed) {
	t.Cleanup(func() {
		data, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], tb.dir) {
				unix.Unmount(f[4], unix.MNT_DETACH)
			}
		}
	})
}

// TestWorkspaceOverlay: watcher exec changes an overlay workspace; the
// real directory stays as it was; diff lists exactly the changes;
// snapshot, rollback to it (stopping a command still running), rollback
// and commit behave; System V and POSIX IPC made in the sandbox never
// reach the host; each operation is in the agent's ledger with its paths
// and the result's hash.
func TestWorkspaceOverlay(t *testing.T) {
	if _, err := exec.LookPath("ipcmk"); err != nil {
		t.Skip("ipcmk (util-linux) not installed")
	}
	tb := newTestbed(t, "    workspace_options: {mode: overlay, max_snapshots: 2}\n", "{enabled: false}")
	unmountOverlaysAtCleanup(t, tb)
	ws := tb.ws
	for p, s := range map[string]string{"keep.txt": "keep\n", "edit.txt": "old\n", "gone.txt": "bye\n", "sub/b.txt": "b\n"} {
		os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755)
		os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644)
	}
	before := mustHash(t, ws)
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	shmName := "watcher-e2e-" + filepath.Base(tb.cgroup)
	state := filepath.Join(tb.dir, "workspaces")

	out, code := tb.watcher("exec", "--socket", ctl, "--", "sh", "-c", "cd "+ws+
		" && echo new > edit.txt && rm gone.txt && echo hi > added.txt && rm -r sub"+
		" && ipcmk -M 4096 >/dev/null && ipcmk -S 2 >/dev/null && ipcs -m && ipcs -s && echo x > /dev/shm/"+shmName+
		// The upper layers are out of reach: the state directory is an
		// empty read-only tmpfs in the command's mount namespace.
		" && test -z \"$(ls -A "+state+")\" && ! touch "+state+"/x 2>/dev/null && echo state-hidden")
	if code != 0 {
		t.Fatalf("exec: %d\n%s", code, out)
	}
	if h := mustHash(t, ws); h != before {
		t.Fatal("the real workspace changed before commit")
	}
	if !strings.Contains(out, "state-hidden") {
		t.Fatalf("the state directory is visible in the sandbox:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(state, "agents", "layers")); err != nil {
		t.Fatalf("no state on the host: %v", err)
	}
	keys := ipcKeys(out)
	if len(keys) != 2 {
		t.Fatalf("want a shm and a sem key in the run's ipcs output, got %v:\n%s", keys, out)
	}
	for _, k := range keys {
		if hostHasIPCKey(t, k) {
			t.Errorf("IPC object %s made in the sandbox is in the host's namespace", k)
		}
	}
	if _, err := os.Stat("/dev/shm/" + shmName); err == nil {
		os.Remove("/dev/shm/" + shmName)
		t.Error("POSIX shm made in the sandbox is in the host's /dev/shm")
	}

	out, code = tb.watcher("workspace", "diff", "--socket", ctl, "--json", "agents")
	if code != 0 {
		t.Fatalf("diff: %d\n%s", code, out)
	}
	var changes []workspace.Change
	if err := json.Unmarshal([]byte(out), &changes); err != nil {
		t.Fatalf("diff output: %v\n%s", err, out)
	}
	want := []workspace.Change{
		{Kind: workspace.Added, Path: ws + "/added.txt", Size: 3},
		{Kind: workspace.Changed, Path: ws + "/edit.txt", Size: 4},
		{Kind: workspace.Deleted, Path: ws + "/gone.txt", Size: 4},
		{Kind: workspace.Deleted, Path: ws + "/sub", Dir: true, Size: 2},
	}
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("diff:\n got %+v\nwant %+v", changes, want)
	}
	if out, code = tb.watcher("workspace", "snapshot", "--socket", ctl, "agents", "s1"); code != 0 {
		t.Fatalf("snapshot: %d\n%s", code, out)
	}

	// A command still running when the workspace is rolled back is
	// stopped first.
	loop := exec.Command(tb.bin, "exec", "--socket", ctl, "--", "sh", "-c", "while :; do date >> "+ws+"/loop.txt; sleep 0.1; done")
	if err := loop.Start(); err != nil {
		t.Fatal(err)
	}
	loopDone := make(chan error, 1)
	go func() { loopDone <- loop.Wait() }()
	if !poll.Within(30*time.Second, func() bool {
		out, _ = tb.watcher("workspace", "diff", "--socket", ctl, "agents")
		return strings.Contains(out, "loop.txt")
	}) {
		t.Fatalf("the looping command never wrote:\n%s", out)
	}
	if out, code = tb.watcher("workspace", "rollback", "--socket", ctl, "agents", "s1"); code != 0 {
		t.Fatalf("rollback to s1: %d\n%s", code, out)
	}
	select {
	case <-loopDone:
	case <-time.After(30 * time.Second):
		loop.Process.Kill()
		t.Fatal("rollback left the running command alive")
	}
	out, _ = tb.watcher("workspace", "diff", "--socket", ctl, "--json", "agents")
	changes = nil
	json.Unmarshal([]byte(out), &changes)
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("after rollback to s1 diff:\n got %+v\nwant %+v", changes, want)
	}

	out, code = tb.watcher("workspace", "rollback", "--socket", ctl, "agents")
	if code != 0 || !strings.Contains(out, "result sha256:"+before) {
		t.Fatalf("rollback: %d, want result hash %s\n%s", code, before, out)
	}
	if h := mustHash(t, ws); h != before {
		t.Fatal("rollback changed the real directory")
	}
	out, _ = tb.watcher("workspace", "diff", "--socket", ctl, "agents")
	if !strings.Contains(out, "0 added, 0 changed, 0 deleted") {
		t.Fatalf("diff after rollback:\n%s", out)
	}

	// Change again and commit.
	if out, code = tb.watcher("exec", "--socket", ctl, "--", "sh", "-c", "cd "+ws+" && echo committed > edit.txt && rm gone.txt && mkdir -p d && echo z > d/z.txt"); code != 0 {
		t.Fatalf("exec: %d\n%s", code, out)
	}
	if out, code = tb.watcher("workspace", "commit", "--socket", ctl, "agents"); code != 0 {
		t.Fatalf("commit: %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(ws + "/edit.txt"); string(b) != "committed\n" {
		t.Errorf("edit.txt after commit: %q", b)
	}
	if b, _ := os.ReadFile(ws + "/d/z.txt"); string(b) != "z\n" {
		t.Errorf("d/z.txt after commit: %q", b)
	}
	if _, err := os.Stat(ws + "/gone.txt"); err == nil {
		t.Error("gone.txt survived the commit")
	}
	committed := mustHash(t, ws)
	tb.stopAgent(syscall.SIGTERM)

	// The ledger has each operation with its paths and result hash.
	out, code = tb.watcher("ledger", "cat", "--kind", "workspace", "--json", tb.ledger)
	if code != 0 {
		t.Fatalf("ledger cat: %d\n%s", code, out)
	}
	var ops []string
	var recs []audit.Event
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e audit.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Workspace == nil {
			t.Fatalf("ledger record: %v\n%s", err, sc.Text())
		}
		ops = append(ops, e.Workspace.Op+":"+e.Workspace.Snapshot)
		recs = append(recs, e)
	}
	if !reflect.DeepEqual(ops, []string{"snapshot:s1", "rollback:s1", "rollback:", "commit:"}) {
		t.Fatalf("ledger workspace ops: %v", ops)
	}
	if r := recs[2].Workspace; r.Hash != before || !reflect.DeepEqual(r.Deleted, []string{ws + "/gone.txt", ws + "/sub"}) ||
		!reflect.DeepEqual(r.Added, []string{ws + "/added.txt"}) || !reflect.DeepEqual(r.Changed, []string{ws + "/edit.txt"}) {
		t.Errorf("rollback record: %+v", r)
	}
	if r := recs[3].Workspace; r.Hash != committed || !reflect.DeepEqual(r.Added, []string{ws + "/d"}) {
		t.Errorf("commit record: %+v (want hash %s)", r, committed)
	}

	// Without an overlay workspace too, a command's IPC objects are its
	// own: every watcher exec runs in an IPC namespace of its own (issue
	// 25), so none outlives it on the host.
	out, code = tb.watcher("exec", "--preset", "dev", "--workspace", ws, "--", "sh", "-c", "ipcmk -M 4096 >/dev/null && ipcs -m")
	if code != 0 {
		t.Fatalf("direct exec: %d\n%s", code, out)
	}
	// The namespace's only segment: its key, as ipcs prints it (hex).
	var key int64 = -1
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "0x") {
			key, _ = strconv.ParseInt(f[0], 0, 64)
		}
	}
	if key <= 0 {
		t.Fatalf("direct exec: no segment listed inside\n%s", out)
	}
	data, _ := os.ReadFile("/proc/sysvipc/shm")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == strconv.FormatInt(int64(int32(key)), 10) {
			t.Errorf("direct exec: its segment (key %#x) is on the host: %s\n%s", key, line, out)
		}
	}
	if !strings.Contains(out, "ns=mnt,pid,uts,ipc") {
		t.Errorf("direct exec: the verdict does not name the IPC namespace:\n%s", out)
	}
}

// TestWorkspacePrepareForRuntime: without an agent, `workspace prepare`
// mounts the overlay for a container runtime; a container process (in the
// sandbox cgroup) writes through it; rollback stops that process first,
// throws its change away and records both operations in the policy's
// ledger.
func TestWorkspacePrepareForRuntime(t *testing.T) {
	tb := newTestbed(t, "    workspace_options: {mode: overlay}\n", "{enabled: false}")
	unmountOverlaysAtCleanup(t, tb)
	os.WriteFile(filepath.Join(tb.ws, "a.txt"), []byte("a\n"), 0o644)
	before := mustHash(t, tb.ws)
	out, code := tb.watcher("workspace", "prepare", "--policy", tb.policy, "agents")
	if code != 0 {
		t.Fatalf("prepare: %d\n%s", code, out)
	}
	lower, merged, ok := strings.Cut(strings.TrimSpace(out), "\t")
	if !ok || lower != tb.ws {
		t.Fatalf("prepare printed %q, want LOWER<TAB>MERGED", out)
	}
	if b, err := os.ReadFile(filepath.Join(merged, "a.txt")); err != nil || string(b) != "a\n" {
		t.Fatalf("the prepared overlay does not show the workspace: %q %v", b, err)
	}
	// What a runtime would bind into the container, written from inside
	// the sandbox cgroup by a process that keeps running.
	c := inSandbox(t, tb.cgAbs, "c1", "echo from-container > "+merged+"/c.txt; exec sleep 60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	poll.Eventually(t, 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(merged, "c.txt"))
		return err == nil
	}, "the container process never wrote")
	if _, err := os.Stat(filepath.Join(tb.ws, "c.txt")); err == nil {
		t.Fatal("the container's write reached the real workspace")
	}
	out, code = tb.watcher("workspace", "rollback", "--policy", tb.policy, "agents")
	if code != 0 || !strings.Contains(out, "1 cgroups stopped") || !strings.Contains(out, "result sha256:"+before) {
		t.Fatalf("rollback: %d\n%s", code, out)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("rollback did not stop the container process")
	}
	if _, err := os.Stat(filepath.Join(merged, "c.txt")); err == nil {
		t.Error("c.txt still visible after rollback")
	}
	out, _ = tb.watcher("ledger", "cat", "--kind", "workspace", tb.ledger)
	if !strings.Contains(out, "overlay of 1 workspace directories mounted") || !strings.Contains(out, "rollback: 1 paths") {
		t.Errorf("ledger lacks prepare and rollback:\n%s", out)
	}
}

// ipcmkIDs parses what ipcmk printed: kind ("shm", "sem", "msg") -> ids.
func ipcmkIDs(out string) map[string][]string {
	m := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		for prefix, kind := range map[string]string{"Shared memory id: ": "shm", "Semaphore id: ": "sem", "Message queue id: ": "msg"} {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				m[kind] = append(m[kind], strings.TrimSpace(rest))
			}
		}
	}
	return m
}

// sysvListed reports whether /proc/sysvipc/KIND lists id.
func sysvListed(t *testing.T, kind, id string) bool {
	t.Helper()
	file := map[string]string{"shm": "shm", "sem": "sem", "msg": "msg"}[kind]
	data, err := os.ReadFile("/proc/sysvipc/" + file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[1] == id {
			return true
		}
	}
	return false
}

func ipcrmAll(ids map[string][]string) {
	flag := map[string]string{"shm": "-m", "sem": "-s", "msg": "-q"}
	for kind, l := range ids {
		for _, id := range l {
			exec.Command("ipcrm", flag[kind], id).Run()
		}
	}
}

// TestWorkspaceRollbackIPC: processes a runtime placed in the sandbox
// cgroup, in the host's IPC namespace and /dev/shm, create a shared
// memory segment, a semaphore set, a message queue and a /dev/shm file
// each; one is still running at rollback, the other exited before. A
// host process outside the sandbox creates the same kinds. Rollback (to a
// snapshot) stops
// the running one, removes exactly the sandbox's eight objects, leaves
// the host's, and the ledger's rollback record lists what it removed.
func TestWorkspaceRollbackIPC(t *testing.T) {
	if _, err := exec.LookPath("ipcmk"); err != nil {
		t.Skip("ipcmk (util-linux) not installed")
	}
	tb := newTestbed(t, "    workspace_options: {mode: overlay}\n", "{enabled: false}")
	unmountOverlaysAtCleanup(t, tb)
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	suffix := filepath.Base(tb.cgroup)
	mk := "ipcmk -M 4096 && ipcmk -S 2 && ipcmk -Q"

	// The host's objects, made outside every sandbox.
	hostOut, err := exec.Command("sh", "-c", mk).CombinedOutput()
	if err != nil {
		t.Fatalf("host ipcmk: %v\n%s", err, hostOut)
	}
	host := ipcmkIDs(string(hostOut))
	t.Cleanup(func() { ipcrmAll(host) })
	hostFile := "/dev/shm/" + suffix + "-host"
	if err := os.WriteFile(hostFile, []byte("host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostFile) })

	// One sandbox process exits after creating, one keeps running.
	sbFiles := []string{"/dev/shm/" + suffix + "-exited", "/dev/shm/" + suffix + "-running"}
	t.Cleanup(func() {
		for _, f := range sbFiles {
			os.Remove(f)
		}
	})
	exitedOut, err := inSandbox(t, tb.cgAbs, "c1", mk+" && echo x > "+sbFiles[0]).CombinedOutput()
	sb := ipcmkIDs(string(exitedOut))
	t.Cleanup(func() { ipcrmAll(sb) }) // sb grows below; removed whatever fails
	if err != nil {
		t.Fatalf("sandbox ipcmk: %v\n%s", err, exitedOut)
	}
	outFile := filepath.Join(t.TempDir(), "running.out") // /tmp: writable in the restricted preset
	running := inSandbox(t, tb.cgAbs, "c2", "("+mk+" && echo x > "+sbFiles[1]+" && echo ready) > "+outFile+" 2>&1; exec sleep 60")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- running.Wait() }()
	var runningOut []byte
	poll.Within(30*time.Second, func() bool {
		runningOut, _ = os.ReadFile(outFile)
		return strings.Contains(string(runningOut), "ready")
	})
	for k, v := range ipcmkIDs(string(runningOut)) {
		sb[k] = append(sb[k], v...)
	}
	if !strings.Contains(string(runningOut), "ready") {
		t.Fatalf("the running sandbox process did not create its objects:\n%s", runningOut)
	}
	for _, kind := range []string{"shm", "sem", "msg"} {
		if len(sb[kind]) != 2 || len(host[kind]) != 1 {
			t.Fatalf("ipcmk ids: sandbox %v host %v", sb, host)
		}
	}

	// Rolling back to a snapshot removes them too (the plain rollback
	// after it finds nothing left).
	if out, code := tb.watcher("workspace", "snapshot", "--socket", ctl, "agents", "s0"); code != 0 {
		t.Fatalf("snapshot: %d\n%s", code, out)
	}
	out, code := tb.watcher("workspace", "rollback", "--socket", ctl, "agents", "s0")
	if code != 0 || !strings.Contains(out, "8 IPC objects removed") {
		t.Fatalf("rollback: %d, want 8 IPC objects removed\n%s", code, out)
	}
	t.Logf("rollback:\n%s", out)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("rollback did not stop the running sandbox process")
	}
	for kind, ids := range sb {
		for _, id := range ids {
			if sysvListed(t, kind, id) {
				t.Errorf("sandbox %s %s survived the rollback", kind, id)
			}
		}
	}
	for kind, ids := range host {
		for _, id := range ids {
			if !sysvListed(t, kind, id) {
				t.Errorf("host %s %s was removed", kind, id)
			}
		}
	}
	for _, f := range sbFiles {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("sandbox file %s survived the rollback", f)
		}
	}
	if _, err := os.Stat(hostFile); err != nil {
		t.Errorf("host file: %v", err)
	}

	// A second rollback has nothing left to remove.
	if out, code = tb.watcher("workspace", "rollback", "--socket", ctl, "agents"); code != 0 || strings.Contains(out, "IPC objects removed") {
		t.Errorf("second rollback: %d\n%s", code, out)
	}
	tb.stopAgent(syscall.SIGTERM)
	out, code = tb.watcher("ledger", "cat", "--kind", "workspace", "--json", tb.ledger)
	if code != 0 {
		t.Fatalf("ledger cat: %d\n%s", code, out)
	}
	var first *audit.WorkspaceDetail
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e audit.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Workspace != nil && e.Workspace.Op == "rollback" && e.Workspace.Snapshot == "s0" {
			first = e.Workspace
			break
		}
	}
	if first == nil || len(first.IPC) != 8 {
		t.Fatalf("the rollback record lists %v, want 8 IPC objects\n%s", first, out)
	}
	joined := strings.Join(first.IPC, "\n")
	for kind, ids := range sb {
		for _, id := range ids {
			if !strings.Contains(joined, kind+" id "+id+" ") {
				t.Errorf("the record lacks %s %s:\n%s", kind, id, joined)
			}
		}
	}
	for _, f := range sbFiles {
		if !strings.Contains(joined, "shm_file "+f+" ") {
			t.Errorf("the record lacks %s:\n%s", f, joined)
		}
	}
}
