package cgroupfs

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// rmdirWait bounds how long RemoveDir waits for a cgroup to empty: the
// kernel answers EBUSY while exiting tasks (or their css) still hold it,
// which takes milliseconds after a kill, rarely more.
const (
	rmdirTries = 300
	rmdirPause = 10 * time.Millisecond
)

// RemoveDir removes one empty cgroup directory (v2 or v1), retrying for up
// to 3 s while the kernel answers EBUSY. A directory already gone counts as
// removed. The error is rmdir's, unwrapped, for the caller to name the
// directory.
func RemoveDir(dir string) error {
	var err error
	for range rmdirTries {
		err = syscall.Rmdir(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(rmdirPause)
	}
	return err
}
