package limits

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the hogs the limits must stop.
func TestMain(m *testing.M) {
	switch os.Getenv("WATCHER_LIMITS_HOG") {
	case "memory":
		// Touch memory page by page until killed.
		var keep [][]byte
		for {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
	case "small":
		b := make([]byte, 4<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		os.Exit(0)
	case "high":
		// 32M in 1M steps, above a 16M memory.high: throttled, not killed.
		var keep [][]byte
		for i := 0; i < 32; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		os.Exit(len(keep) - 32)
	case "io":
		// 4 MiB of direct writes (throttling in v1 sees only direct I/O).
		f, err := os.OpenFile(os.Getenv("WATCHER_LIMITS_FILE"), os.O_WRONLY|os.O_CREATE|syscall.O_DIRECT, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		buf, _ := syscall.Mmap(-1, 0, 64<<10, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		for i := 0; i < 64; i++ {
			if _, err := f.Write(buf); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
		}
		f.Close()
		os.Exit(0)
	case "cpu":
		end := time.Now().Add(2 * time.Second)
		for time.Now().Before(end) {
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func testHost(t *testing.T) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup limits need root")
	}
	h, err := Detect()
	if err != nil {
		t.Fatal(err)
	}
	if h.V2 == "" {
		t.Skip("no cgroup2 hierarchy: commands are placed in cgroup2 leaves")
	}
	return h
}

func needController(t *testing.T, h *Host, c string) {
	t.Helper()
	if h.Mechanism(c) == None {
		t.Skipf("no %s controller on this host, neither cgroup2 nor v1", c)
	}
	t.Logf("%s controller: %s", c, h.Mechanism(c))
}

// testGroup applies lim to a fresh sandbox cgroup and to a leaf below it.
func testGroup(t *testing.T, h *Host, lim Limits) (sandbox, leaf *Group) {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	rel := "/watcher-limits-test-" + hex.EncodeToString(b)
	var err error
	if sandbox, err = h.Apply(rel, lim, true); err != nil {
		t.Fatal(err)
	}
	if leaf, err = h.Apply(rel+"/leaf", lim, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(leaf.V2, "cgroup.kill"), []byte("1"), 0)
		if err := leaf.Remove(); err != nil {
			t.Error(err)
		}
		for i := 0; i < 300; i++ {
			if err := syscall.Rmdir(leaf.V2); err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := sandbox.Remove(); err != nil {
			t.Error(err)
		}
		if err := syscall.Rmdir(sandbox.V2); err != nil {
			t.Errorf("remove %s: %v", sandbox.V2, err)
		}
	})
	return sandbox, leaf
}

// start runs cmd in the leaf: in its cgroup2 directory from the first
// instruction, and in its v1 groups before it goes past reading stdin.
func start(t *testing.T, g *Group, cmd *exec.Cmd) {
	t.Helper()
	fd, err := os.Open(g.V2)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Enter(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	stdin.Close()
}

func hog(kind string) *exec.Cmd {
	self, _ := os.Executable()
	// The hog waits for the line on stdin: it runs only once it is in all
	// its cgroups.
	cmd := exec.Command("/bin/sh", "-c", "read x && exec \"$0\"", self)
	cmd.Env = append(os.Environ(), "WATCHER_LIMITS_HOG="+kind)
	return cmd
}

func TestMemoryHogIsOOMKilledAtItsLimit(t *testing.T) {
	h := testHost(t)
	needController(t, h, Memory)
	const limit = 48 << 20
	_, leaf := testGroup(t, h, Limits{Memory: limit})

	// The benign neighbour: a command well below the limit runs to its end.
	small := hog("small")
	start(t, leaf, small)
	if err := small.Wait(); err != nil {
		t.Fatalf("a 4M command under a 48M limit: %v", err)
	}
	if u := leaf.Usage(); u.OOMKills != 0 {
		t.Fatalf("OOM kills after the small command: %d", u.OOMKills)
	}

	klog, err := OpenKernelLog()
	if err != nil {
		t.Logf("no kernel log (%v): the victim is not named", err)
	}
	defer klog.Close()
	big := hog("memory")
	start(t, leaf, big)
	err = big.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("memory hog ended with %v, want SIGKILL from the OOM killer", err)
	}
	u := leaf.Usage()
	t.Logf("usage: %+v", u)
	if u.OOMKills < 1 {
		t.Errorf("oom_kill counter %d, want at least 1", u.OOMKills)
	}
	if u.MemoryPeak > limit || u.MemoryPeak < limit*9/10 {
		t.Errorf("peak %d, want just at the limit %d", u.MemoryPeak, limit)
	}
	if klog != nil {
		victims := klog.OOMKills(leaf.Rel)
		t.Logf("kernel log: %+v", victims)
		found := false
		for _, v := range victims {
			if v.PID == big.Process.Pid {
				found = true
			}
		}
		if !found {
			t.Errorf("kernel log names no OOM kill of pid %d in %s: %+v", big.Process.Pid, leaf.Rel, victims)
		}
	}
}

func TestForkBombStopsAtThePidsLimit(t *testing.T) {
	h := testHost(t)
	needController(t, h, PIDs)
	const limit = 24
	_, leaf := testGroup(t, h, Limits{PIDs: limit})
	bomb := exec.Command("/bin/sh", "-c", "read x; bomb() { bomb | bomb & }; bomb; sleep 60")
	start(t, leaf, bomb)
	defer func() {
		os.WriteFile(filepath.Join(leaf.V2, "cgroup.kill"), []byte("1"), 0)
		bomb.Wait()
	}()
	var u Usage
	if !poll.Within(60*time.Second, func() bool { u = leaf.Usage(); return u.PIDsMaxHits > 0 }) {
		t.Fatalf("the fork bomb never hit the pids limit: %+v", u)
	}
	// The host stays responsive: it can still start processes of its own
	// while the bomb keeps trying.
	for i := 0; i < 5; i++ {
		if out, err := exec.Command("/bin/sh", "-c", "echo ok").Output(); err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("host could not run a command during the fork bomb: %v %q", err, out)
		}
	}
	u = leaf.Usage()
	t.Logf("usage: %+v", u)
	if u.PIDs > limit {
		t.Errorf("%d tasks alive, above the limit %d", u.PIDs, limit)
	}
}

func TestCPUHogGetsItsShare(t *testing.T) {
	h := testHost(t)
	needController(t, h, CPU)
	const share = 0.1
	_, leaf := testGroup(t, h, Limits{CPU: share})
	// Two spinning processes for 2 s: unlimited they would take up to two
	// cores between them.
	a, b := hog("cpu"), hog("cpu")
	began := time.Now()
	start(t, leaf, a)
	start(t, leaf, b)
	a.Wait()
	b.Wait()
	wall := time.Since(began).Seconds()
	u := leaf.Usage()
	if u.CPUSeconds == 0 {
		t.Skip("this host reports no CPU usage for the group (no cpuacct)")
	}
	ratio := u.CPUSeconds / wall
	t.Logf("cpu %.3fs in %.3fs wall: %.3f cores against a limit of %.2f; throttled %d periods (%s)", u.CPUSeconds, wall, ratio, share, u.CPUThrottled, h.Mechanism(CPU))
	// The quota allows share*period per period; the last partial period
	// and process start-up add a little.
	if ratio > share*1.5 {
		t.Errorf("the hog used %.3f cores, more than its share of %.2f", ratio, share)
	}
	// Using about its whole share, it must have been throttled (on a host
	// too busy to give it that much, it may not be).
	if u.CPUThrottled == 0 && ratio > share*0.9 {
		t.Errorf("no throttled periods at %.3f cores: the CPU limit never applied", ratio)
	}
}

func TestMemoryHighThrottlesWithoutKilling(t *testing.T) {
	h := testHost(t)
	if h.Mechanism(Memory) != Cgroup2 {
		t.Skipf("memory.high needs the memory controller on cgroup2 (here: %s; v1 maps memory_high to the soft limit)", h.Mechanism(Memory))
	}
	_, leaf := testGroup(t, h, Limits{Memory: 256 << 20, MemoryHigh: 16 << 20})
	cmd := hog("high")
	start(t, leaf, cmd)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("a command above memory.high but below memory.max: %v, want it throttled, not killed", err)
	}
	u := leaf.Usage()
	t.Logf("usage: %+v", u)
	if u.MemoryHighHits == 0 || u.OOMKills != 0 {
		t.Errorf("memory.events high=%d oom_kill=%d, want high > 0 and no kill", u.MemoryHighHits, u.OOMKills)
	}
}

// wholeDisk is the MAJOR:MINOR of the disk holding path (throttling
// applies to whole disks, not partitions).
func wholeDisk(t *testing.T, path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	sys := "/sys/dev/block/" + dev
	if _, err := os.Stat(sys); err != nil {
		t.Skipf("%s is not on a block device (%s): nothing to throttle", path, dev)
	}
	if _, err := os.Stat(sys + "/partition"); err == nil {
		b, err := os.ReadFile(sys + "/../dev")
		if err != nil {
			t.Fatal(err)
		}
		dev = strings.TrimSpace(string(b))
	}
	return dev
}

func TestIOIsThrottled(t *testing.T) {
	h := testHost(t)
	needController(t, h, IO)
	dir := t.TempDir()
	dev := wholeDisk(t, dir)
	const bps = 1 << 20
	_, leaf := testGroup(t, h, Limits{IO: []IOLimit{{Device: dev, WriteBPS: bps}}})
	cmd := hog("io")
	cmd.Env = append(cmd.Env, "WATCHER_LIMITS_FILE="+filepath.Join(dir, "f"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	start(t, leaf, cmd)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("io writer: %v %s", err, out.String())
	}
	rate := float64(4<<20) / time.Since(began).Seconds()
	t.Logf("4 MiB of direct writes at %.0f KiB/s against a limit of %d KiB/s on %s (%s)", rate/1024, bps/1024, dev, h.Mechanism(IO))
	// The throttle lets a little burst through at the start.
	if rate > bps*1.5 {
		t.Errorf("writes ran at %.0f B/s, above the %d B/s limit", rate, bps)
	}
}

func TestLayersSayWhichMechanism(t *testing.T) {
	h := &Host{V2: "/sys/fs/cgroup/unified", V2Controllers: map[string]bool{"hugetlb": true}, V1: map[string]string{"memory": "/m", "pids": "/p"}}
	got := fmt.Sprint(h.Layers(Limits{Memory: 1 << 30, PIDs: 10, CPU: 1}))
	for _, want := range []string{"limits.cpu none", "limits.memory cgroup1", "limits.pids cgroup1"} {
		if !strings.Contains(got, want) {
			t.Errorf("layers %s lack %q", got, want)
		}
	}
	h.V2Controllers["memory"] = true
	if got := fmt.Sprint(h.Layers(Limits{MemoryHigh: 1 << 20})); !strings.Contains(got, "cgroup2 memory.high") {
		t.Errorf("with memory on cgroup2: %s", got)
	}
}

func TestParseOOMLine(t *testing.T) {
	o, ok := parseOOMLine("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/w/leaf,task_memcg=/w/leaf,task=tail,pid=5348,uid=0")
	if !ok || o.PID != 5348 || o.Comm != "tail" || o.Memcg != "/w/leaf" || o.TaskMemcg != "/w/leaf" {
		t.Errorf("%+v %v", o, ok)
	}
	if _, ok := parseOOMLine("Memory cgroup out of memory: Killed process 5348 (tail)"); ok {
		t.Error("parsed a line that is not oom-kill:")
	}
}

// TestForeignLimitsNeverLoosened: on a cgroup watcher did not make (a
// container's), a lower pids.max or memory limit its runtime set is kept
// and reported, a higher or absent one is replaced by the policy's; on
// watcher's own cgroups the policy's value is written either way (a
// policy may raise what an earlier one set).
func TestForeignLimitsNeverLoosened(t *testing.T) {
	h := testHost(t)
	needController(t, h, PIDs)
	needController(t, h, Memory)
	own, _ := testGroup(t, h, Limits{PIDs: 50, Memory: 64 << 20})
	read := func(g *Group, c, name string) string {
		t.Helper()
		dir := g.V2
		if h.Mechanism(c) == Cgroup1 {
			dir = g.V1[v1Name[c]]
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	memFile := "memory.max"
	if h.Mechanism(Memory) == Cgroup1 {
		memFile = "memory.limit_in_bytes"
	}

	// The "runtime" set pids 50 and memory 64M; the policy asks for more.
	g, err := h.ApplyForeign(own.Rel, Limits{PIDs: 4096, Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if got := read(g, PIDs, "pids.max"); got != "50" {
		t.Errorf("foreign pids.max %s, want the runtime's 50 kept", got)
	}
	if got := read(g, Memory, memFile); got != strconv.Itoa(64<<20) {
		t.Errorf("foreign %s %s, want the runtime's 64M kept", memFile, got)
	}
	if g.Limits.PIDs != 50 || g.Limits.Memory != 64<<20 || len(g.Kept) != 2 {
		t.Errorf("group limits %+v kept %q, want pids 50, memory 64M, two kept", g.Limits, g.Kept)
	}
	// The policy asks for less: written.
	if g, err = h.ApplyForeign(own.Rel, Limits{PIDs: 20, Memory: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := read(g, PIDs, "pids.max"); got != "20" || len(g.Kept) != 0 {
		t.Errorf("foreign pids.max %s kept %q, want the policy's lower 20", got, g.Kept)
	}
	if got := read(g, Memory, memFile); got != strconv.Itoa(32<<20) {
		t.Errorf("foreign %s %s, want the policy's lower 32M", memFile, got)
	}
	// Watcher's own cgroup: raised as the policy says.
	if g, err = h.Apply(own.Rel, Limits{PIDs: 4096, Memory: 1 << 30}, false); err != nil {
		t.Fatal(err)
	}
	if got := read(g, PIDs, "pids.max"); got != "4096" || len(g.Kept) != 0 {
		t.Errorf("own pids.max %s kept %q, want 4096", got, g.Kept)
	}
}
