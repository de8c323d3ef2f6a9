package lsm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/watcherhq/watcher/internal/testkit/poll"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// opSpec is one operation the helper child performs.
type opSpec struct {
	Name  string // unique per run, reported back
	Kind  string // what to do, see doOp
	Path  string
	Path2 string
	PID   int
	Num   uint64
}

// opResult is "OK" or an errno name ("EPERM"), or "ERR: ..." for a
// failure that is not an errno.
type opResults map[string]string

const helperEnv = "WATCHER_LSM_OPS"

// TestLSMHelper is the child side: it runs the operations in
// WATCHER_LSM_OPS and prints one RESULT line per operation.
func TestLSMHelper(t *testing.T) {
	if os.Getenv("WATCHER_TEST_HELPER") != "ops" {
		t.Skip("helper process for the LSM tests")
	}
	var ops []opSpec
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &ops); err != nil {
		fmt.Printf("RESULT {\"name\":\"decode\",\"res\":%q}\n", err.Error())
		os.Exit(2)
	}
	for _, op := range ops {
		res := doOp(op)
		b, _ := json.Marshal(map[string]string{"name": op.Name, "res": res})
		fmt.Printf("RESULT %s\n", b)
	}
	os.Exit(0)
}

func errnoResult(err error) string {
	if err == nil {
		return "OK"
	}
	var en unix.Errno
	if errors.As(err, &en) {
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
		return "errno " + strconv.Itoa(int(en))
	}
	return "ERR: " + err.Error()
}

func doOp(op opSpec) string {
	switch op.Kind {
	case "open", "open_write":
		flags := unix.O_RDONLY
		if op.Kind == "open_write" {
			flags = unix.O_WRONLY
		}
		fd, err := unix.Open(op.Path, flags|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "open_opath_proc":
		pfd, err := unix.Open(op.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return "ERR: O_PATH open: " + err.Error()
		}
		defer unix.Close(pfd)
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "openat2":
		fd, err := unix.Openat2(unix.AT_FDCWD, op.Path, &unix.OpenHow{
			Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "uring":
		en, err := uringOpenat(op.Path, int(op.Num))
		if err != nil {
			return "ERR: " + err.Error()
		}
		if en == 0 {
			return "OK"
		}
		return errnoResult(en)
	case "ptrace_seize":
		runtime.LockOSThread()
		// Attached tracees are released when this process exits.
		err := unix.PtraceSeize(op.PID)
		return errnoResult(err)
	case "process_vm_readv":
		buf := make([]byte, 8)
		local := []unix.Iovec{{Base: &buf[0], Len: 8}}
		remote := []unix.RemoteIovec{{Base: uintptr(op.Num), Len: 8}}
		_, err := unix.ProcessVMReadv(op.PID, local, remote, 0)
		return errnoResult(err)
	case "pidfd_getfd":
		pidfd, err := unix.PidfdOpen(op.PID, 0)
		if err != nil {
			return "ERR: pidfd_open: " + err.Error()
		}
		defer unix.Close(pidfd)
		fd, err := unix.PidfdGetfd(pidfd, 0, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "traceme":
		// exec.Cmd's Ptrace does PTRACE_TRACEME in the forked child
		// before exec: a refusal comes back from Start.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
		err := cmd.Start()
		if err == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return errnoResult(err)
	case "mount":
		err := unix.Mount("none", op.Path, "tmpfs", 0, "size=1m")
		if err == nil {
			unix.Unmount(op.Path, unix.MNT_DETACH)
		}
		return errnoResult(err)
	case "umount":
		return errnoResult(unix.Unmount(op.Path, 0))
	case "move_mount":
		err := unix.MoveMount(unix.AT_FDCWD, op.Path, unix.AT_FDCWD, op.Path2, 0)
		if err == nil {
			unix.MoveMount(unix.AT_FDCWD, op.Path2, unix.AT_FDCWD, op.Path, 0)
		}
		return errnoResult(err)
	case "fsconfig":
		fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return "ERR: fsopen: " + err.Error()
		}
		defer unix.Close(fd)
		return errnoResult(unix.FsconfigSetString(fd, "size", "1m"))
	case "pivot_root":
		return errnoResult(unix.PivotRoot(op.Path, op.Path2))
	case "chroot":
		return errnoResult(unix.Chroot(op.Path))
	case "finit_module":
		fd, err := unix.Open(op.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "ERR: open module: " + err.Error()
		}
		defer unix.Close(fd)
		return errnoResult(unix.FinitModule(fd, "", 0))
	case "init_module":
		// Longer than an ELF header, or the kernel refuses it before the hook.
		return errnoResult(unix.InitModule(make([]byte, 512), ""))
	case "bpf_map_create":
		attr := [5]uint32{2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 1, 0}
		fd, _, e := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		if e != 0 {
			return errnoResult(e)
		}
		unix.Close(int(fd))
		return "OK"
	case "kill":
		return errnoResult(unix.Kill(op.PID, syscall.Signal(op.Num)))
	case "raise_nofile":
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return "ERR: getrlimit: " + err.Error()
		}
		rl.Max++ // raising the hard limit needs CAP_SYS_RESOURCE
		return errnoResult(unix.Setrlimit(unix.RLIMIT_NOFILE, &rl))
	}
	if res, ok := doMmapOp(op); ok {
		return res
	}
	if res, ok := doTaskSockOp(op); ok {
		return res
	}
	if res, ok := doCredOp(op); ok {
		return res
	}
	if res, ok := doSubtreeOp(op); ok {
		return res
	}
	return doChangeOp(op)
}

// runOps runs ops in a child started directly in cgPath ("" for none) and
// returns the results and the child's pid.
func runOps(t *testing.T, cgPath string, ops []opSpec) (opResults, int) {
	t.Helper()
	return runOpsFiles(t, cgPath, ops, nil)
}

// runOpsFiles is runOps with files passed to the child as fd 3 and up.
func runOpsFiles(t *testing.T, cgPath string, ops []opSpec, extraFiles []*os.File) (opResults, int) {
	t.Helper()
	b, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	cmd := enforcetest.SelfCommand(t, cgPath, "TestLSMHelper", "ops", helperEnv+"="+string(b))
	cmd.ExtraFiles = extraFiles
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper in %q: %v", cgPath, err)
	}
	res := opResults{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "RESULT ")
		if !ok {
			continue
		}
		var r map[string]string
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("helper output %q: %v", line, err)
		}
		res[r["name"]] = r["res"]
	}
	pid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper in %q: %v (results so far %v)", cgPath, err, res)
	}
	for _, op := range ops {
		if _, ok := res[op.Name]; !ok {
			t.Fatalf("helper in %q reported nothing for %s", cgPath, op.Name)
		}
	}
	return res, pid
}

// startTarget starts a long-running process outside every sandbox, a
// target for ptrace and friends, killed at cleanup.
func startTarget(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := enforcetest.SelfCommand(t, "", "TestLSMSleeper", "sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// TestLSMSleeper is a target process: it sleeps until killed.
func TestLSMSleeper(t *testing.T) {
	if os.Getenv("WATCHER_TEST_HELPER") != "sleep" {
		t.Skip("helper process for the LSM tests")
	}
	time.Sleep(10 * time.Minute)
	os.Exit(0)
}

// firstMapping returns the start address of the first readable mapping
// of pid's program file.
func firstMapping(t *testing.T, pid int) uint64 {
	t.Helper()
	// The target may still be exec'ing: cmd.Start returns once the exec
	// is past the point of no return, before the loader has mapped the
	// program, and the early stack mapping is moved once the arguments are
	// in place (an address taken then gives EFAULT later). Wait for a
	// mapping of the program itself, which stays where it is.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var addr uint64
	found := poll.Within(10*time.Second, func() bool {
		var data []byte
		if data, err = os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err != nil {
			return false
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasPrefix(f[1], "r") || f[5] != self {
				continue
			}
			start, _, _ := strings.Cut(f[0], "-")
			if addr, err = strconv.ParseUint(start, 16, 64); err == nil {
				return true
			}
		}
		return false
	})
	if !found {
		t.Fatalf("no readable mapping in /proc/%d/maps (last error %v)", pid, err)
	}
	return addr
}
