package backstop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNothingToUndo means the operation left nothing behind: it failed, or
// is not one that can be reverted.
var ErrNothingToUndo = errors.New("nothing to undo")

// ErrNamespaceGone means no process is left in the mount namespace: the
// namespace (with the mount) went away with its last process.
var ErrNamespaceGone = errors.New("mount namespace has no process left")

// UndoMount unmounts what a killed process mounted, inside its mount
// namespace: it enters the namespace through /proc/PID/ns/mnt of the
// recorded process if it still exists, else of any process in the same
// namespace, and detaches the mount at the recorded target (MNT_DETACH).
// Only successful mount and move_mount calls are undone.
func UndoMount(mk MountKill) error {
	if mk.Op != "mount" && mk.Op != "move_mount" {
		return fmt.Errorf("undo %s: %w", mk.Op, ErrNothingToUndo)
	}
	if mk.Ret != 0 {
		return fmt.Errorf("undo %s (returned %d): %w", mk.Op, mk.Ret, ErrNothingToUndo)
	}
	if !filepath.IsAbs(mk.Target) {
		return fmt.Errorf("undo %s: target %q is not absolute", mk.Op, mk.Target)
	}
	pid, err := processInMountNS(mk.MntNS, int(mk.TGID))
	if err != nil {
		return fmt.Errorf("undo %s at %s: %w", mk.Op, mk.Target, err)
	}
	if err := unmountIn(pid, mk.Target); err != nil {
		return fmt.Errorf("undo %s at %s (via pid %d): %w", mk.Op, mk.Target, pid, err)
	}
	return nil
}

func mountNSOf(pid int) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/mnt", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// processInMountNS finds a live process in mount namespace ns, preferring
// prefer.
func processInMountNS(ns uint64, prefer int) (int, error) {
	if prefer > 0 {
		if got, err := mountNSOf(prefer); err == nil && got == ns {
			return prefer, nil
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := mountNSOf(pid); err == nil && got == ns {
			return pid, nil
		}
	}
	return 0, ErrNamespaceGone
}

// unmountIn detaches target inside pid's mount namespace, from a thread
// that is thrown away afterwards (setns changes only the calling thread,
// which must first stop sharing its fs_struct with the rest of the
// process).
func unmountIn(pid int, target string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is never unlocked: it exits with the goroutine, so no
		// other goroutine runs in the foreign namespace.
		errc <- func() error {
			ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
			if err != nil {
				return err
			}
			defer ns.Close()
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare fs: %w", err)
			}
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("umount: %w", err)
			}
			return nil
		}()
	}()
	return <-errc
}
