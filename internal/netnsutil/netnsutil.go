// Package netnsutil does things inside another network namespace: a socket
// belongs to the namespace of the thread that created it, so listeners and
// dialers for a namespace are made on a locked OS thread that joined it,
// and served from any goroutine afterwards.
package netnsutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// ID identifies a network namespace while it exists: the device and inode
// of its nsfs file.
type ID struct {
	Dev, Ino uint64
}

func (id ID) String() string { return fmt.Sprintf("net:[%d]", id.Ino) }

// Of is the namespace of the nsfs file at path (/proc/PID/ns/net,
// /run/netns/NAME).
func Of(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ID{}, fmt.Errorf("netns of %s: %w", path, err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// TaskPath is the nsfs file of process pid's network namespace.
func TaskPath(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/ns/net" }

// Self is the calling process's network namespace (its main thread's).
func Self() (ID, error) { return Of("/proc/self/ns/net") }

// Do runs f on an OS thread that joined the network namespace of the nsfs
// file f opened at path, on a goroutine of its own. Sockets f creates
// belong to that namespace. The thread is given back to the runtime only
// when it returned to the caller's namespace; otherwise it exits with the
// goroutine.
func Do(path string, f func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer target.Close()
	return DoFile(target, f)
}

// DoFile is Do with the namespace file already open (it stays open).
func DoFile(target *os.File, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netns: %w", err)
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("setns %s: %w", target.Name(), err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// Locked and never unlocked: the thread ends with this goroutine.
			done <- errors.Join(ferr, fmt.Errorf("netns: return to own namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Cookie is the calling thread's network namespace cookie
// (SO_NETNS_COOKIE, kernel 5.14+): what bpf_get_netns_cookie returns for
// sockets in it.
func Cookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	return c, nil
}

// CookieOf is the cookie of the namespace at path.
func CookieOf(path string) (uint64, error) {
	var c uint64
	err := Do(path, func() error {
		var err error
		c, err = Cookie()
		return err
	})
	return c, err
}
