package ipcobj_test

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/ipcobj"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/test/adversarial"
)

const (
	nr32Semget = 393
	nr32Shmget = 395
	nr32Msgget = 399
	nr32IPC    = 117
)

// randKey is a System V key unlikely to collide with other tests' keys.
func randKey() int32 {
	var b [4]byte
	rand.Read(b[:])
	return int32(binary.LittleEndian.Uint32(b[:])&0x3fffffff | 0x40000000)
}

func semget(key int32, flags int) (int, error) {
	id, _, errno := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 1, uintptr(flags))
	if errno != 0 {
		return -1, errno
	}
	return int(id), nil
}

func msgget(key int32, flags int) (int, error) {
	id, _, errno := unix.Syscall(unix.SYS_MSGGET, uintptr(key), uintptr(flags), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(id), nil
}

// objects is a set of IPC objects made by one process: ids by kind.
type objects struct {
	Shm, Sem, Msg int
	File          string
}

// create makes a shared memory segment, semaphore set and message queue
// with key (IPC_PRIVATE when 0) and the file /dev/shm/name.
func create(key int32, name string) (objects, error) {
	var o objects
	var err error
	if o.Shm, err = unix.SysvShmGet(int(key), 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o600); err != nil {
		return o, fmt.Errorf("shmget: %w", err)
	}
	if o.Sem, err = semget(key, unix.IPC_CREAT|unix.IPC_EXCL|0o600); err != nil {
		return o, fmt.Errorf("semget: %w", err)
	}
	if o.Msg, err = msgget(key, unix.IPC_CREAT|unix.IPC_EXCL|0o600); err != nil {
		return o, fmt.Errorf("msgget: %w", err)
	}
	if name != "" {
		o.File = "/dev/shm/" + name
		fd, err := unix.Open(o.File, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return o, fmt.Errorf("create %s: %w", o.File, err)
		}
		unix.Close(fd)
	}
	return o, nil
}

func rmObjects(o objects) {
	unix.SysvShmCtl(o.Shm, unix.IPC_RMID, nil)
	unix.Syscall6(unix.SYS_SEMCTL, uintptr(o.Sem), 0, unix.IPC_RMID, 0, 0, 0)
	unix.Syscall(unix.SYS_MSGCTL, uintptr(o.Msg), unix.IPC_RMID, 0)
	if o.File != "" {
		os.Remove(o.File)
	}
}

// TestHelper is the child's side: it runs only with WATCHER_TEST_HELPER.
func TestHelper(t *testing.T) {
	mode := os.Getenv("WATCHER_TEST_HELPER")
	if mode == "" {
		t.Skip("helper process only")
	}
	key64, _ := strconv.ParseInt(os.Getenv("IPC_KEY"), 10, 32)
	key := int32(key64)
	fail := func(err error) {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	switch mode {
	case "create":
		// Objects of its own, 64-bit calls.
		o, err := create(key, os.Getenv("IPC_FILE"))
		if err != nil {
			fail(err)
		}
		// Opening the host's objects, IPC_CREAT included (the usual
		// create-or-attach idiom), creates nothing.
		hostKey, _ := strconv.ParseInt(os.Getenv("IPC_HOST_KEY"), 10, 32)
		if _, err := unix.SysvShmGet(int(hostKey), 4096, unix.IPC_CREAT|0o600); err != nil {
			fail(fmt.Errorf("open host shm: %w", err))
		}
		if _, err := semget(int32(hostKey), unix.IPC_CREAT|0o600); err != nil {
			fail(fmt.Errorf("open host sem: %w", err))
		}
		if _, err := msgget(int32(hostKey), unix.IPC_CREAT|0o600); err != nil {
			fail(fmt.Errorf("open host msg: %w", err))
		}
		if fd, err := unix.Open(os.Getenv("IPC_HOST_FILE"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600); err != nil {
			fail(fmt.Errorf("open host file: %w", err))
		} else {
			unix.Close(fd)
		}
		// A private segment, and one created and removed again.
		priv, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
		if err != nil {
			fail(err)
		}
		tmp, err := semget(unix.IPC_PRIVATE, unix.IPC_CREAT|0o600)
		if err != nil {
			fail(err)
		}
		unix.Syscall6(unix.SYS_SEMCTL, uintptr(tmp), 0, unix.IPC_RMID, 0, 0, 0)
		made := fmt.Sprintf("shm=%d sem=%d msg=%d shm=%d", o.Shm, o.Sem, o.Msg, priv)
		// 32-bit entries: the direct calls and ipc(2), where the test
		// found the kernel running int 0x80 (IPC_INT80).
		if os.Getenv("IPC_INT80") != "" {
			sem32 := adversarial.Int80(nr32Semget, uintptr(key+1), 1, unix.IPC_CREAT|0o600, 0, 0)
			shm32 := adversarial.Int80(nr32Shmget, uintptr(key+1), 4096, unix.IPC_CREAT|0o600, 0, 0)
			msg32 := adversarial.Int80(nr32Msgget, uintptr(key+1), unix.IPC_CREAT|0o600, 0, 0, 0)
			ipcsem := adversarial.Int80(nr32IPC, 2 /* SEMGET */, uintptr(key+2), 1, unix.IPC_CREAT|0o600, 0)
			if sem32 < 0 || shm32 < 0 || msg32 < 0 || ipcsem < 0 {
				fail(fmt.Errorf("int 0x80: sem %d shm %d msg %d ipc(SEMGET) %d", sem32, shm32, msg32, ipcsem))
			}
			made += fmt.Sprintf(" sem=%d shm=%d msg=%d sem=%d", sem32, shm32, msg32, ipcsem)
		}
		fmt.Printf("IDS %s\n", made)
		if os.Getenv("IPC_WAIT") != "" {
			time.Sleep(time.Minute)
		}
	case "nextid":
		// A namespace of its own where the id is chosen through
		// kernel.shm_next_id (checkpoint/restore), not allocated in turn.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWIPC); err != nil {
			fail(err)
		}
		if err := os.WriteFile("/proc/sys/kernel/shm_next_id", []byte(os.Getenv("IPC_NEXT_ID")), 0); err != nil {
			fail(err)
		}
		id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
		if err != nil {
			fail(err)
		}
		next, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
		if err != nil {
			fail(err)
		}
		fmt.Printf("IDS shm=%d shm=%d\n", id, next)
	case "join":
		// Enter the IPC namespace of another process and create there.
		runtime.LockOSThread()
		fd, err := unix.Open("/proc/"+os.Getenv("IPC_NS_PID")+"/ns/ipc", unix.O_RDONLY, 0)
		if err != nil {
			fail(err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWIPC); err != nil {
			fail(err)
		}
		id, err := unix.SysvShmGet(int(key), 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
		if err != nil {
			fail(err)
		}
		fmt.Printf("IDS shm=%d\n", id)
	}
	os.Exit(0)
}

// ids parses the helper's "IDS kind=id ..." line into "kind:id" strings.
func ids(t *testing.T, out string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "IDS "); ok {
			var r []string
			for _, f := range strings.Fields(rest) {
				r = append(r, strings.Replace(f, "=", ":", 1))
			}
			sort.Strings(r)
			return r
		}
	}
	t.Fatalf("helper printed no ids:\n%s", out)
	return nil
}

// listed returns the ids of kind in the calling thread's namespace.
func listed(t *testing.T, kind string) map[int]bool {
	t.Helper()
	f, err := os.Open("/proc/sysvipc/" + kind)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int]bool{}
	sc := bufio.NewScanner(f)
	sc.Scan()
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) > 1 {
			id, _ := strconv.Atoi(fl[1])
			out[id] = true
		}
	}
	return out
}

type fixture struct {
	eng    *enforce.Engine
	cg     string
	cgID   uint64
	track  *ipcobj.Tracker
	sbName string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	eng := enforcetest.Engine(t)
	f := &fixture{eng: eng, cg: enforcetest.Cgroup(t, "sb"), sbName: "sb-" + strconv.Itoa(os.Getpid())}
	var err error
	if f.cgID, err = eng.AddSandbox(f.cg, 1, 0); err != nil {
		t.Fatal(err)
	}
	if f.track, err = ipcobj.Load(eng); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.track.Close() })
	if err := f.track.NameRoot(f.cgID, f.sbName); err != nil {
		t.Fatal(err)
	}
	if err := f.track.SetAttached(true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.track.SetAttached(false) })
	return f
}

func (f *fixture) sandboxObjects(t *testing.T) ([]ipcobj.Object, *ipcobj.Table) {
	t.Helper()
	tab, err := ipcobj.OpenTable(f.eng.PinDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.Close() })
	objs, err := tab.Sandbox(f.sbName, nil)
	if err != nil {
		t.Fatal(err)
	}
	return objs, tab
}

func kindIDs(objs []ipcobj.Object) (sysv []string, files []string) {
	for _, o := range objs {
		if o.Kind == ipcobj.KindShmFile {
			files = append(files, o.Path)
		} else {
			sysv = append(sysv, fmt.Sprintf("%s:%d", o.Kind, o.ID))
		}
	}
	sort.Strings(sysv)
	return sysv, files
}

// TestSandboxObjectsRemoved: a process in the sandbox cgroup, in the
// host's IPC namespace and /dev/shm, creates a segment, a semaphore set,
// a message queue and a /dev/shm file (64-bit calls), more through int
// 0x80 (direct calls and ipc(2); only where the kernel runs 32-bit calls,
// the subtest int80_objects skipped elsewhere), and opens the host's
// objects of the same kinds with IPC_CREAT; then it exits. A host process
// outside creates the same kinds. The table lists exactly the sandbox's
// objects, with their creator; Remove deletes them and leaves the host's.
func TestSandboxObjectsRemoved(t *testing.T) {
	f := setup(t)
	hostKey := randKey()
	suffix := strconv.FormatInt(int64(randKey()), 16)
	host, err := create(hostKey, "watcher-ipc-host-"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rmObjects(host) })
	sbKey := randKey()
	sbFile := "watcher-ipc-sb-" + suffix
	t.Cleanup(func() { os.Remove("/dev/shm/" + sbFile) })

	env := []string{fmt.Sprintf("IPC_KEY=%d", sbKey), "IPC_FILE=" + sbFile,
		fmt.Sprintf("IPC_HOST_KEY=%d", hostKey), "IPC_HOST_FILE=" + host.File}
	// The helper is on this kernel: decide here whether it makes its
	// int 0x80 objects.
	if err := ia32.Available(); err == nil {
		env = append(env, "IPC_INT80=1")
	} else {
		t.Logf("int80_objects: not made: %v", err)
		t.Run("int80_objects", func(t *testing.T) { t.Skip(err.Error()) })
	}
	cmd := enforcetest.SelfCommand(t, f.cg, "TestHelper", "create", env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	made := ids(t, string(out))
	t.Cleanup(func() {
		for _, k := range made {
			kind, id, _ := strings.Cut(k, ":")
			n, _ := strconv.Atoi(id)
			switch kind {
			case "shm":
				unix.SysvShmCtl(n, unix.IPC_RMID, nil)
			case "sem":
				unix.Syscall6(unix.SYS_SEMCTL, uintptr(n), 0, unix.IPC_RMID, 0, 0, 0)
			case "msg":
				unix.Syscall(unix.SYS_MSGCTL, uintptr(n), unix.IPC_RMID, 0)
			}
		}
	})

	objs, tab := f.sandboxObjects(t)
	sysv, files := kindIDs(objs)
	if strings.Join(sysv, " ") != strings.Join(made, " ") {
		t.Errorf("tracked System V objects %v, want exactly the sandbox's %v (host's: shm:%d sem:%d msg:%d)", sysv, made, host.Shm, host.Sem, host.Msg)
	}
	if len(files) != 1 || files[0] != "/dev/shm/"+sbFile {
		t.Errorf("tracked files %v, want [/dev/shm/%s]", files, sbFile)
	}
	for _, o := range objs {
		if o.PID != uint32(cmd.Process.Pid) || o.SandboxCgroup != f.cgID {
			t.Errorf("%s: creator pid %d cgroup %d, want %d in %d", o, o.PID, o.SandboxCgroup, cmd.Process.Pid, f.cgID)
		}
	}
	// Another sandbox's name lists nothing.
	if other, err := tab.Sandbox("other", nil); err != nil || len(other) != 0 {
		t.Errorf("sandbox other: %v %v", other, err)
	}

	res, err := ipcobj.Remove(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != len(objs) || len(res.Gone) != 0 {
		t.Errorf("removed %d, gone %v; want all %d removed", len(res.Removed), res.Gone, len(objs))
	}
	for kind, m := range map[string]map[int]bool{"shm": listed(t, "shm"), "sem": listed(t, "sem"), "msg": listed(t, "msg")} {
		for _, k := range made {
			if kk, id, _ := strings.Cut(k, ":"); kk == kind {
				if n, _ := strconv.Atoi(id); m[n] {
					t.Errorf("sandbox %s %d survived", kind, n)
				}
			}
		}
	}
	if _, err := os.Stat("/dev/shm/" + sbFile); err == nil {
		t.Error("the sandbox's /dev/shm file survived")
	}
	if !listed(t, "shm")[host.Shm] || !listed(t, "sem")[host.Sem] || !listed(t, "msg")[host.Msg] {
		t.Error("a host object was removed")
	}
	if _, err := os.Stat(host.File); err != nil {
		t.Errorf("the host's /dev/shm file: %v", err)
	}
	// A second pass finds them gone and removes nothing more.
	res, err = ipcobj.Remove(objs)
	if err != nil || len(res.Removed) != 0 || len(res.Gone) != len(objs) {
		t.Errorf("second pass: removed %v gone %d err %v", res.Removed, len(res.Gone), err)
	}
	if err := tab.Forget(objs); err != nil {
		t.Fatal(err)
	}
	if left, _ := tab.Sandbox(f.sbName, nil); len(left) != 0 {
		t.Errorf("entries after Forget: %v", left)
	}
	if n, err := tab.Overflow(); err != nil || n != 0 {
		t.Errorf("overflow %d %v", n, err)
	}
}

// TestRecordedIsNotReused: an entry whose object was removed and whose id
// now names another object (same id impossible without wrap, so a host
// object with a different key at a recorded id is simulated by changing
// the recorded key) is left alone.
func TestRecordedKeyMismatchLeftAlone(t *testing.T) {
	key := randKey()
	id, err := unix.SysvShmGet(int(key), 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	own, _ := os.Readlink("/proc/self/ns/ipc")
	var ns uint32
	fmt.Sscanf(own, "ipc:[%d]", &ns)
	for _, o := range []ipcobj.Object{
		{Kind: ipcobj.KindShm, NS: ns, ID: int32(id), Key: key + 1, PID: uint32(os.Getpid())},
		{Kind: ipcobj.KindShm, NS: ns, ID: int32(id), Key: key, PID: uint32(os.Getpid()) + 1},
	} {
		res, err := ipcobj.Remove([]ipcobj.Object{o})
		if err != nil || len(res.Removed) != 0 || len(res.Gone) != 1 {
			t.Errorf("%+v: removed %v gone %v err %v", o, res.Removed, res.Gone, err)
		}
	}
	if !listed(t, "shm")[id] {
		t.Fatal("a segment whose key or creator differ from the record was removed")
	}
}

// TestOtherNamespace: a sandbox process that joined an IPC namespace a
// process outside the sandbox holds creates a segment there; Remove
// enters that namespace (setns) and removes it, and the test process's
// own namespace is untouched. A namespace no process holds any more is
// reported gone.
func TestOtherNamespace(t *testing.T) {
	f := setup(t)
	holder := ipcHolder(t)
	key := randKey()
	out, err := enforcetest.SelfCommand(t, f.cg, "TestHelper", "join", fmt.Sprintf("IPC_KEY=%d", key),
		fmt.Sprintf("IPC_NS_PID=%d", holder.Process.Pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	objs, tab := f.sandboxObjects(t)
	hostNS, _ := os.Readlink("/proc/self/ns/ipc")
	theirNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/ipc", holder.Process.Pid))
	if len(objs) != 1 || objs[0].Kind != ipcobj.KindShm || fmt.Sprintf("ipc:[%d]", objs[0].NS) != theirNS || theirNS == hostNS {
		t.Fatalf("tracked %v, want one segment in %s (host %s)", objs, theirNS, hostNS)
	}
	res, err := ipcobj.Remove(objs)
	if err != nil || len(res.Removed) != 1 {
		t.Fatalf("remove: %v %v", res, err)
	}
	// Look from inside: the holder's namespace has no segment left.
	if n := segmentsIn(t, holder.Process.Pid); n != 0 {
		t.Errorf("the namespace still has %d segments", n)
	}
	// With the namespace gone, its objects are gone.
	holder.Process.Kill()
	holder.Wait()
	res, err = ipcobj.Remove(objs)
	if err != nil || len(res.Gone) != 1 {
		t.Errorf("after the namespace ended: %v %v", res, err)
	}
	tab.Forget(objs)
}

// segmentsIn counts the shared memory segments in the IPC namespace of
// pid, read from a thread that entered it (and is never reused).
func segmentsIn(t *testing.T, pid int) int {
	t.Helper()
	n := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/ipc", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			n <- -1
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWIPC); err != nil {
			n <- -1
			return
		}
		data, err := os.ReadFile("/proc/sysvipc/shm")
		if err != nil {
			n <- -1
			return
		}
		n <- strings.Count(strings.TrimSpace(string(data)), "\n")
	}()
	c := <-n
	if c < 0 {
		t.Fatal("could not read the namespace's segments")
	}
	return c
}

// TestNextID: an id picked through kernel.shm_next_id is recorded like
// one allocated in turn.
func TestNextID(t *testing.T) {
	f := setup(t)
	want := 5<<15 + 1000
	out, err := enforcetest.SelfCommand(t, f.cg, "TestHelper", "nextid", fmt.Sprintf("IPC_NEXT_ID=%d", want)).CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	made := ids(t, string(out))
	if !slices.Contains(made, fmt.Sprintf("shm:%d", want)) {
		t.Fatalf("the kernel did not use shm_next_id: %v", made)
	}
	objs, tab := f.sandboxObjects(t)
	sysv, _ := kindIDs(objs)
	if strings.Join(sysv, " ") != strings.Join(made, " ") {
		t.Errorf("tracked %v, want %v", sysv, made)
	}
	tab.Forget(objs) // the namespace died with the helper, and its objects
}

// TestAttachDetach: the programs run only while attached (the kernel's
// link table says so), and a creation while detached is not recorded.
func TestAttachDetach(t *testing.T) {
	f := setup(t)
	ids, err := f.track.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	linked := func() int {
		m, err := enforce.LinkedPrograms()
		if err != nil {
			t.Fatal(err)
		}
		return m[ids[ipcobj.ProgSysEnter]] + m[ids[ipcobj.ProgSysExit]]
	}
	if n := linked(); n != 2 {
		t.Fatalf("attached: %d links, want 2", n)
	}
	if err := f.track.SetAttached(false); err != nil {
		t.Fatal(err)
	}
	if n := linked(); n != 0 {
		t.Fatalf("detached: %d links, want 0", n)
	}
	if _, err := os.Stat(filepath.Join(enforce.LinkPinDir(f.eng.PinDir(), ipcobj.Group), ipcobj.ProgSysExit)); err == nil {
		t.Error("a pin survived detach")
	}
	_ = cgroupfs.Abs
}

// ipcHolder starts a process outside the sandbox holding an IPC namespace
// of its own (ended at cleanup).
func ipcHolder(t *testing.T) *exec.Cmd {
	t.Helper()
	holder := enforcetest.Command(t, "", "sleep", "60")
	holder.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWIPC}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	return holder
}
