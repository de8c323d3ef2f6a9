// Package posture reads the hardening of the processes in a cgroup from the
// kernel: capabilities, no_new_privs, seccomp, user namespace, uid, the
// mounts holding /, /tmp and the workspace directories in the processes'
// own mount namespaces, and the memory, cpu and pids limits of their
// cgroups (v2 or v1, wherever this host keeps each controller). It checks
// the result against the items a sandbox requires.
//
// Every value is the weakest over all threads of all processes: threads
// carry their own credentials, seccomp filters and no_new_privs, so a
// process whose main thread dropped its capabilities while another thread
// kept them counts as holding them.
//
// A reading is a snapshot: a process started a moment later (docker exec)
// is seen at the next reading. Posture reports configuration; refusing
// operations is the enforcement layers' job.
package posture

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/limits"
)

// Seccomp modes as Posture.Seccomp names them, weakest first.
const (
	SeccompDisabled = "disabled"
	SeccompStrict   = "strict"
	SeccompFilter   = "filter"
)

// Reader reads postures on this host.
type Reader struct {
	// Host says where each cgroup controller is mounted.
	Host *limits.Host
	// HostUserNS is the inode of the host's user namespace: the agent's
	// own (it loads BPF programs, which needs the initial user namespace).
	HostUserNS uint64
	// Proc is the procfs mount ("/proc").
	Proc string
	// SkipDir, when set, leaves out the processes of descendant cgroups
	// it returns true for (by directory name), with their subtrees: the
	// agent skips `watcher exec` leaves, whose hardening is its own.
	SkipDir func(name string) bool
}

// NewReader discovers the cgroup mounts and the host's user namespace.
func NewReader() (*Reader, error) {
	h, err := limits.Detect()
	if err != nil {
		return nil, fmt.Errorf("posture: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &st); err != nil {
		return nil, fmt.Errorf("posture: host user namespace: %w", err)
	}
	return &Reader{Host: h, HostUserNS: st.Ino, Proc: "/proc"}, nil
}

// Cgroup reads the posture of every process in the cgroup2 directory abs
// and its descendants. rel is its path relative to the hierarchy root
// (for the record and the container id); workspace lists the sandbox's
// workspace directories.
func (r *Reader) Cgroup(abs, rel string, workspace []string) (audit.Posture, error) {
	pids, err := cgroupfs.SubtreeProcs(abs, r.SkipDir)
	if err != nil {
		return audit.Posture{}, fmt.Errorf("posture: %w", err)
	}
	p := r.PIDs(pids, workspace)
	p.Cgroup = rel
	if info, ok := containers.Identify(rel); ok {
		p.Container = info.ContainerID
	}
	if p.Procs == 0 {
		// Nothing runs: only the cgroup's own limits can be read.
		p.Limits = r.cgroupLimits(rel)
	}
	return p, nil
}

// PIDs reads the posture of the given processes (all their threads).
// Processes that exit while being read are left out.
func (r *Reader) PIDs(pids []int, workspace []string) audit.Posture {
	p := audit.Posture{NoNewPrivs: true, Seccomp: SeccompFilter, UserNS: true}
	agg := newMountAgg(workspace)
	lim := newLimitAgg(r)
	for _, pid := range pids {
		threads, err := r.threads(pid)
		if err != nil {
			if !gone(err) {
				p.Errors = append(p.Errors, err.Error())
			}
			continue
		}
		userNS, uidMap, err := r.userNS(pid)
		if err == nil {
			err = agg.add(r, pid)
		}
		if err == nil {
			err = lim.add(pid)
		}
		if err != nil {
			if !gone(err) {
				p.Errors = append(p.Errors, err.Error())
			}
			continue
		}
		p.Procs++
		p.Threads += len(threads)
		for _, t := range threads {
			p.CapEff |= t.capEff
			p.CapBnd |= t.capBnd
			p.NoNewPrivs = p.NoNewPrivs && t.noNewPrivs
			p.Seccomp = weakerSeccomp(p.Seccomp, t.seccomp)
			p.RootUser = p.RootUser || t.euid == 0
		}
		if !userNS {
			p.UserNS = false
		} else if p.UIDMap == "" {
			p.UIDMap = uidMap
		}
	}
	if p.Procs == 0 {
		// Nothing was read: claim nothing.
		return audit.Posture{Errors: p.Errors}
	}
	if !p.UserNS {
		p.UIDMap = ""
	}
	p.Root, p.Tmp, p.Workspace = agg.result()
	p.Limits = lim.result()
	return p
}

func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// thread is one thread's credentials and filters from its status file.
type thread struct {
	capEff, capBnd uint64
	noNewPrivs     bool
	seccomp        string
	euid           int
}

// threads reads /proc/PID/task/*/status.
func (r *Reader) threads(pid int) ([]thread, error) {
	dir := filepath.Join(r.Proc, strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("threads of %d: %w", pid, err)
	}
	var out []thread
	for _, e := range ents {
		t, err := readStatus(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			if gone(err) {
				continue // the thread exited
			}
			return nil, err
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("threads of %d: %w", pid, fs.ErrNotExist)
	}
	return out, nil
}

// readStatus parses the fields of a task's status file posture needs.
func readStatus(path string) (thread, error) {
	f, err := os.Open(path)
	if err != nil {
		return thread{}, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	t := thread{euid: -1}
	have := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Uid":
			// real effective saved fs, as the reader's user namespace
			// (the host's) sees them.
			if f := strings.Fields(v); len(f) >= 2 {
				t.euid, err = strconv.Atoi(f[1])
			}
		case "CapEff":
			t.capEff, err = strconv.ParseUint(v, 16, 64)
		case "CapBnd":
			t.capBnd, err = strconv.ParseUint(v, 16, 64)
		case "NoNewPrivs":
			t.noNewPrivs = v == "1"
		case "Seccomp":
			switch v {
			case "0":
				t.seccomp = SeccompDisabled
			case "1":
				t.seccomp = SeccompStrict
			case "2":
				t.seccomp = SeccompFilter
			default:
				err = fmt.Errorf("seccomp mode %q", v)
			}
		default:
			continue
		}
		if err != nil {
			return thread{}, fmt.Errorf("%s: %s: %w", path, k, err)
		}
		have++
	}
	if err := sc.Err(); err != nil {
		return thread{}, fmt.Errorf("read %s: %w", path, err)
	}
	// A kernel without one of these fields would make the reading claim
	// hardening it never saw.
	if have < 5 || t.euid < 0 {
		return thread{}, fmt.Errorf("%s: missing Uid, CapEff, CapBnd, NoNewPrivs or Seccomp", path)
	}
	return t, nil
}

func weakerSeccomp(a, b string) string {
	rank := map[string]int{SeccompDisabled: 0, SeccompStrict: 1, SeccompFilter: 2}
	if rank[b] < rank[a] {
		return b
	}
	return a
}

// userNS says whether pid is outside the host's user namespace, with its
// uid_map.
func (r *Reader) userNS(pid int) (bool, string, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(r.Proc, strconv.Itoa(pid), "ns", "user"), &st); err != nil {
		return false, "", fmt.Errorf("user namespace of %d: %w", pid, err)
	}
	if st.Ino == r.HostUserNS {
		return false, "", nil
	}
	b, err := os.ReadFile(filepath.Join(r.Proc, strconv.Itoa(pid), "uid_map"))
	if err != nil {
		return false, "", fmt.Errorf("uid_map of %d: %w", pid, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return true, strings.Join(lines, ", "), nil
}
