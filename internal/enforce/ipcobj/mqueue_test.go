package ipcobj_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/ipcobj"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/test/adversarial"
)

const nr32MqOpen = 277

// mqOpen is mq_open(2); name without the leading slash, as the kernel
// takes it.
func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags|unix.O_CLOEXEC), 0o600, 0, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

func mqUnlink(name string) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// mqExists reports whether the queue name is in the calling thread's IPC
// namespace.
func mqExists(name string) bool {
	fd, err := mqOpen(name, unix.O_RDONLY)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// TestMqueueHelper is the child's side of the message queue tests: it
// runs only with WATCHER_TEST_HELPER, in the sandbox cgroup.
func TestMqueueHelper(t *testing.T) {
	mode := os.Getenv("WATCHER_TEST_HELPER")
	if mode == "" {
		t.Skip("helper process only")
	}
	fail := func(err error) {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	base := os.Getenv("MQ_NAME")
	mk := func(name string, flags int) {
		fd, err := mqOpen(name, flags)
		if err != nil {
			fail(fmt.Errorf("mq_open %s: %w", name, err))
		}
		unix.Close(fd)
	}
	switch mode {
	case "mq-create":
		// The host's queue, the newest inode of the filesystem at entry,
		// opened with O_CREAT (create-or-open): not created, not
		// recorded.
		mk(os.Getenv("MQ_HOST"), unix.O_CREAT|unix.O_RDWR)
		mk(base+"-own", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
		// Longer than the 63 bytes the record keeps.
		mk(base+"-long-"+strings.Repeat("x", 80), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
		// And again with newer queues made since.
		mk(os.Getenv("MQ_HOST"), unix.O_CREAT|unix.O_RDWR)
		// Created and unlinked again by the sandbox.
		mk(base+"-tmp", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
		if err := mqUnlink(base + "-tmp"); err != nil {
			fail(err)
		}
		// Without O_CREAT: an open only.
		mk(base+"-own", unix.O_RDONLY)
		if os.Getenv("MQ_INT80") != "" {
			mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
			if err != nil {
				fail(err)
			}
			copy(mem, base+"-int80\x00")
			if fd := adversarial.Int80(nr32MqOpen, uintptr(unsafe.Pointer(&mem[0])), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o600, 0, 0); fd < 0 {
				fail(fmt.Errorf("int 0x80 mq_open: %d", fd))
			}
		}
		// open(O_CREAT) on a mounted mqueue filesystem makes a queue
		// too (a mount of its own, in a mount namespace of its own).
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			fail(err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fail(err)
		}
		dir := os.Getenv("MQ_MOUNT")
		if err := unix.Mount("mqueue", dir, "mqueue", 0, ""); err != nil {
			fail(err)
		}
		fd, err := unix.Open(filepath.Join(dir, base+"-vfs"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			fail(err)
		}
		unix.Close(fd)
		fmt.Println("MQ done")
	case "mq-join":
		runtime.LockOSThread()
		fd, err := unix.Open("/proc/"+os.Getenv("IPC_NS_PID")+"/ns/ipc", unix.O_RDONLY, 0)
		if err != nil {
			fail(err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWIPC); err != nil {
			fail(err)
		}
		mk(base+"-there", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
		fmt.Println("MQ done")
	}
	os.Exit(0)
}

func mqName() string { return "watcher-mq-" + strconv.FormatInt(int64(randKey()), 16) }

func mqueues(objs []ipcobj.Object) []string {
	var out []string
	for _, o := range objs {
		if o.Kind == ipcobj.KindMqueue {
			out = append(out, o.Path)
		}
	}
	sort.Strings(out)
	return out
}

// TestMqueuesRemoved: a sandbox process in the host's IPC namespace
// creates POSIX message queues (mq_open, 64-bit and int 0x80, a name
// longer than the record keeps, and open(O_CREAT) on a mounted mqueue
// filesystem), opens the host's queue with O_CREAT, creates and unlinks
// one. The table lists exactly the queues it created; Remove deletes
// those still there, reports the unlinked one gone and leaves the host's.
func TestMqueuesRemoved(t *testing.T) {
	f := setup(t)
	base := mqName()
	host := base + "-host"
	fd, err := mqOpen(host, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
	if err != nil {
		t.Fatalf("mq_open: %v", err)
	}
	unix.Close(fd)
	long := base + "-long-" + strings.Repeat("x", 80)
	t.Cleanup(func() {
		for _, n := range []string{host, base + "-own", long, base + "-tmp", base + "-int80", base + "-vfs"} {
			mqUnlink(n)
		}
	})
	env := []string{"MQ_NAME=" + base, "MQ_HOST=" + host, "MQ_MOUNT=" + t.TempDir()}
	want := []string{"/" + base + "-own", "/" + base + "-tmp", "/" + base + "-vfs", ("/" + long)[:63]}
	if err := ia32.Available(); err == nil {
		env = append(env, "MQ_INT80=1")
		want = append(want, "/"+base+"-int80")
	} else {
		t.Run("int80_mqueue", func(t *testing.T) { t.Skip(err.Error()) })
	}
	sort.Strings(want)
	cmd := enforcetest.SelfCommand(t, f.cg, "TestMqueueHelper", "mq-create", env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "MQ done") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	objs, tab := f.sandboxObjects(t)
	if got := mqueues(objs); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("tracked queues %q, want exactly the sandbox's %q (not the host's /%s)", got, want, host)
	}
	runtime.LockOSThread()
	own, _ := os.Readlink("/proc/thread-self/ns/ipc")
	runtime.UnlockOSThread()
	for _, o := range objs {
		if o.PID != uint32(cmd.Process.Pid) || fmt.Sprintf("ipc:[%d]", o.NS) != own || o.Ino == 0 {
			t.Errorf("%s: pid %d ns %d ino %d, want pid %d in %s", o, o.PID, o.NS, o.Ino, cmd.Process.Pid, own)
		}
	}
	res, err := ipcobj.Remove(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != len(want)-1 || len(res.Gone) != 1 || res.Gone[0].Path != "/"+base+"-tmp" {
		t.Errorf("removed %v, gone %v; want all but the unlinked one removed", res.Removed, res.Gone)
	}
	t.Logf("removed: %v", res.Removed)
	for _, n := range []string{base + "-own", long, base + "-int80", base + "-vfs"} {
		if mqExists(n) {
			t.Errorf("queue %s survived", n)
		}
	}
	if !mqExists(host) {
		t.Error("the host's queue was removed")
	}
	// A queue made again under a recorded name is another: left alone.
	fd, err = mqOpen(base+"-own", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	res, err = ipcobj.Remove(objs)
	if err != nil || len(res.Removed) != 0 || len(res.Gone) != len(objs) {
		t.Errorf("second pass: removed %v gone %d err %v", res.Removed, len(res.Gone), err)
	}
	if !mqExists(base + "-own") {
		t.Error("a new queue under a recorded name was removed")
	}
	if err := tab.Forget(objs); err != nil {
		t.Fatal(err)
	}
	if left, _ := tab.Sandbox(f.sbName, nil); len(left) != 0 {
		t.Errorf("entries after Forget: %v", left)
	}
}

// TestMqueueOtherNamespace: a queue a sandbox process made in an IPC
// namespace a process outside holds is removed there (setns), and the
// host's namespace has no queue of that name.
func TestMqueueOtherNamespace(t *testing.T) {
	f := setup(t)
	holder := ipcHolder(t)
	base := mqName()
	out, err := enforcetest.SelfCommand(t, f.cg, "TestMqueueHelper", "mq-join", "MQ_NAME="+base,
		fmt.Sprintf("IPC_NS_PID=%d", holder.Process.Pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	objs, tab := f.sandboxObjects(t)
	defer tab.Forget(objs)
	theirNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/ipc", holder.Process.Pid))
	if len(objs) != 1 || objs[0].Kind != ipcobj.KindMqueue || fmt.Sprintf("ipc:[%d]", objs[0].NS) != theirNS {
		t.Fatalf("tracked %v, want one queue in %s", objs, theirNS)
	}
	if mqExists(base + "-there") {
		t.Fatal("the queue is in the host's namespace")
	}
	inThere := func() bool {
		done := make(chan bool)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/ipc", holder.Process.Pid), unix.O_RDONLY, 0)
			if err != nil || unix.Setns(fd, unix.CLONE_NEWIPC) != nil {
				t.Error("enter the holder's namespace:", err)
				done <- false
				return
			}
			done <- mqExists(base + "-there")
		}()
		return <-done
	}
	if !inThere() {
		t.Fatal("the queue is not in the holder's namespace")
	}
	res, err := ipcobj.Remove(objs)
	if err != nil || len(res.Removed) != 1 {
		t.Fatalf("remove: %+v %v", res, err)
	}
	if inThere() {
		t.Error("the queue survived in its namespace")
	}
}
