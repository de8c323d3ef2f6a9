package ipcobj

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// Outcome is what Remove did with each object.
type Outcome struct {
	// Removed were deleted now (a shared memory segment still attached
	// by a process outside the sandbox is marked and goes at its last
	// detach, as with ipcrm).
	Removed []Object
	// Gone were no longer there as recorded: removed by someone, their
	// namespace or filesystem gone, or the id, key, creator or inode now
	// belongs to another object (left alone).
	Gone []Object
}

// Remove deletes the objects that are still the ones recorded. Run it
// after the sandbox's processes are stopped. System V objects and POSIX
// message queues are removed in their own IPC namespace (entered through
// a live process in it when it is not this process's); a namespace no
// process holds is gone with its objects. /dev/shm files are found by
// device and inode among the mounts of this process's mount namespace.
func Remove(objs []Object) (Outcome, error) {
	var out Outcome
	var errs []error
	byNS := map[uint32][]Object{}
	var files []Object
	for _, o := range objs {
		if o.Kind == KindShmFile {
			files = append(files, o)
		} else {
			byNS[o.NS] = append(byNS[o.NS], o)
		}
	}
	nss := make([]uint32, 0, len(byNS))
	for ns := range byNS {
		nss = append(nss, ns)
	}
	sort.Slice(nss, func(i, j int) bool { return nss[i] < nss[j] })
	for _, ns := range nss {
		removed, gone, err := removeInNS(ns, byNS[ns])
		out.Removed = append(out.Removed, removed...)
		out.Gone = append(out.Gone, gone...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(files) > 0 {
		mounts, err := mountsByDev()
		if err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		for _, o := range files {
			ok, err := removeFile(o, mounts[o.Dev])
			switch {
			case err != nil:
				errs = append(errs, err)
			case ok:
				out.Removed = append(out.Removed, o)
			default:
				out.Gone = append(out.Gone, o)
			}
		}
	}
	return out, errors.Join(errs...)
}

func nsInode(path string) (uint32, error) {
	s, err := os.Readlink(path)
	if err != nil {
		return 0, err
	}
	var n uint32
	if _, err := fmt.Sscanf(s, "ipc:[%d]", &n); err != nil {
		return 0, fmt.Errorf("%s: %q is not an ipc namespace", path, s)
	}
	return n, nil
}

// processInNS returns a process whose IPC namespace is ns, or 0.
func processInNS(ns uint32) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if n, err := nsInode(filepath.Join("/proc", e.Name(), "ns", "ipc")); err == nil && n == ns {
			return pid
		}
	}
	return 0
}

// removeInNS removes System V objects and message queues of the IPC
// namespace ns.
func removeInNS(ns uint32, objs []Object) (removed, gone []Object, err error) {
	// This thread's namespace (a goroutine that entered another and
	// ended on the main thread leaves that thread there: /proc/self is
	// not necessarily this thread's), kept while removing.
	runtime.LockOSThread()
	own, err := nsInode("/proc/thread-self/ns/ipc")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, nil, fmt.Errorf("own ipc namespace: %w", err)
	}
	if ns == own {
		defer runtime.UnlockOSThread()
		return removeHere(objs)
	}
	runtime.UnlockOSThread()
	pid := processInNS(ns)
	if pid == 0 {
		return nil, objs, nil // no process holds it: gone with its objects
	}
	type result struct {
		removed, gone []Object
		err           error
	}
	done := make(chan result, 1)
	go func() {
		// The thread stays locked and so ends with the goroutine: it is
		// never returned to the runtime in the other namespace.
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/ipc", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{gone: objs} // the process ended: so did its namespace, or another holds it
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWIPC); err != nil {
			done <- result{err: fmt.Errorf("enter ipc:[%d]: %w", ns, err)}
			return
		}
		if n, err := nsInode("/proc/thread-self/ns/ipc"); err != nil || n != ns {
			// The pid was reused by a process of another namespace.
			done <- result{gone: objs}
			return
		}
		r, g, err := removeHere(objs)
		done <- result{r, g, err}
	}()
	r := <-done
	return r.removed, r.gone, r.err
}

// removeHere removes the objects in the current thread's IPC namespace.
func removeHere(objs []Object) (removed, gone []Object, err error) {
	var sysv, mq []Object
	for _, o := range objs {
		if o.Kind == KindMqueue {
			mq = append(mq, o)
		} else {
			sysv = append(sysv, o)
		}
	}
	var errs []error
	if len(sysv) > 0 {
		r, g, err := removeSysV(sysv)
		removed, gone = append(removed, r...), append(gone, g...)
		errs = append(errs, err)
	}
	if len(mq) > 0 {
		r, g, err := removeMqueues(mq)
		removed, gone = append(removed, r...), append(gone, g...)
		errs = append(errs, err)
	}
	return removed, gone, errors.Join(errs...)
}

// sysvEntry is one line of /proc/sysvipc/{shm,sem,msg}.
type sysvEntry struct {
	key  int32
	cpid uint32 // shm only
}

// listSysV reads the current thread's namespace's objects of a kind.
func listSysV(k Kind) (map[int32]sysvEntry, error) {
	name := map[Kind]string{KindShm: "shm", KindSem: "sem", KindMsg: "msg"}[k]
	f, err := os.Open("/proc/sysvipc/" + name)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return nil, fmt.Errorf("list %s: empty", name)
	}
	col := map[string]int{}
	for i, h := range strings.Fields(sc.Text()) {
		col[h] = i
	}
	idCol := map[Kind]string{KindShm: "shmid", KindSem: "semid", KindMsg: "msqid"}[k]
	ki, ok1 := col["key"]
	ii, ok2 := col[idCol]
	ci, hasCpid := col["cpid"]
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("list %s: unexpected header %q", name, sc.Text())
	}
	out := map[int32]sysvEntry{}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) <= max(ki, ii) {
			continue
		}
		key, err1 := strconv.ParseInt(f[ki], 10, 64)
		id, err2 := strconv.ParseInt(f[ii], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		e := sysvEntry{key: int32(key)}
		if hasCpid && ci < len(f) {
			if p, err := strconv.ParseUint(f[ci], 10, 32); err == nil {
				e.cpid = uint32(p)
			}
		}
		out[int32(id)] = e
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("list %s: %w", name, err)
	}
	return out, nil
}

// removeSysV removes, in the current thread's IPC namespace, the objects
// whose id still has the recorded key (and, for shared memory, creator).
// An id carries a sequence number the kernel bumps per creation, so a new
// object has the same id only after the sequence wrapped (65536 creations
// of the kind in the namespace), and then the key must match too.
func removeSysV(objs []Object) (removed, gone []Object, err error) {
	lists := map[Kind]map[int32]sysvEntry{}
	var errs []error
	for _, o := range objs {
		l, ok := lists[o.Kind]
		if !ok {
			var err error
			if l, err = listSysV(o.Kind); err != nil {
				return removed, gone, err
			}
			lists[o.Kind] = l
		}
		e, ok := l[o.ID]
		if !ok || e.key != o.Key || (o.Kind == KindShm && e.cpid != o.PID) {
			gone = append(gone, o)
			continue
		}
		var rerr error
		switch o.Kind {
		case KindShm:
			_, rerr = unix.SysvShmCtl(int(o.ID), unix.IPC_RMID, nil)
		case KindSem:
			_, _, errno := unix.Syscall6(unix.SYS_SEMCTL, uintptr(o.ID), 0, unix.IPC_RMID, 0, 0, 0)
			if errno != 0 {
				rerr = errno
			}
		case KindMsg:
			_, _, errno := unix.Syscall(unix.SYS_MSGCTL, uintptr(o.ID), unix.IPC_RMID, 0)
			if errno != 0 {
				rerr = errno
			}
		}
		switch {
		case rerr == nil:
			removed = append(removed, o)
		case errors.Is(rerr, unix.EINVAL) || errors.Is(rerr, unix.EIDRM):
			gone = append(gone, o)
		default:
			errs = append(errs, fmt.Errorf("remove %s: %w", o, rerr))
		}
	}
	return removed, gone, errors.Join(errs...)
}

// mountsByDev maps kernel dev_t (MAJOR<<20|MINOR) to the mount points of
// this mount namespace on that device.
func mountsByDev() (map[uint32][]string, error) {
	mounts, err := cgroupfs.ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	out := map[uint32][]string{}
	for _, m := range mounts {
		dev := m.Major<<20 | m.Minor
		out[dev] = append(out[dev], m.Point)
	}
	return out, nil
}

func kernelDev(d uint64) uint32 { return unix.Major(d)<<20 | unix.Minor(d) }

// removeFile unlinks the file with the object's device and inode: at its
// creation name below a mount of that device, else wherever a bounded
// walk of the mount finds it (renamed). It reports whether it removed it.
func removeFile(o Object, mounts []string) (bool, error) {
	rel := strings.TrimPrefix(o.Path, "/dev/shm/")
	for _, mp := range mounts {
		if ok, err := unlinkIf(filepath.Join(mp, rel), o); ok || err != nil {
			return ok, err
		}
	}
	for _, mp := range mounts {
		var found string
		seen := 0
		filepath.WalkDir(mp, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if seen++; seen > 100000 || strings.Count(strings.TrimPrefix(p, mp), "/") > 8 {
				return filepath.SkipAll
			}
			if d.IsDir() {
				var st unix.Stat_t
				if unix.Lstat(p, &st) == nil && kernelDev(st.Dev) != o.Dev {
					return filepath.SkipDir // another mount below
				}
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Ino == o.Ino {
				found = p
				return filepath.SkipAll
			}
			return nil
		})
		if found != "" {
			return unlinkIf(found, o)
		}
	}
	return false, nil
}

// unlinkIf removes path when it is (still) the object's file; directories
// are left alone.
func unlinkIf(path string, o Object) (bool, error) {
	dfd, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil
	}
	defer unix.Close(dfd)
	name := filepath.Base(path)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, nil
	}
	if kernelDev(st.Dev) != o.Dev || st.Ino != o.Ino || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return false, nil
	}
	if err := unix.Unlinkat(dfd, name, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	return true, nil
}
