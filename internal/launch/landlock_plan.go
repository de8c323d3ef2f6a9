package launch

import (
	"errors"
	"fmt"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Landlock rights of each planner class, on directories and on files
// (the kernel refuses directory rights on a file).
const (
	readDirRights  = ll.AccessFSReadFile | ll.AccessFSReadDir
	readFileRights = ll.AccessFSReadFile
	writeDirRights = ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile |
		ll.AccessFSMakeChar | ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo |
		ll.AccessFSMakeBlock | ll.AccessFSMakeSym | ll.AccessFSRefer
	writeFileRights = ll.AccessFSWriteFile | ll.AccessFSTruncate
	execRights      = ll.AccessFSExecute
)

// grantRights returns the Landlock rights of g on a directory or a file.
func grantRights(g Grant, dir bool) uint64 {
	var r uint64
	if g.ListDir && dir {
		r |= ll.AccessFSReadDir
	}
	if g.Classes&ClassRead != 0 {
		r |= readFileRights
		if dir {
			r |= readDirRights
		}
	}
	if g.Classes&ClassWrite != 0 {
		r |= writeFileRights
		if dir {
			r |= writeDirRights
		}
	}
	if g.Classes&ClassExec != 0 {
		r |= execRights
	}
	return r
}

// addPlanRules adds the plan's grants to the ruleset. Paths are opened
// with O_NOFOLLOW, so a symlink put in place after planning grants
// nothing; paths gone since are skipped. It returns how many rules it
// added.
func addPlanRules(rulesetFD int, handled uint64, plan FilePlan) (int, error) {
	n := 0
	for _, g := range plan.Grants {
		fd, err := unix.Open(g.Path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
				continue
			}
			return n, fmt.Errorf("landlock rule %s: %w", g.Path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return n, fmt.Errorf("landlock rule %s: %w", g.Path, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(fd)
			continue
		}
		rights := grantRights(g, st.Mode&unix.S_IFMT == unix.S_IFDIR) & handled
		if rights != 0 {
			err = ll.LandlockAddPathBeneathRule(rulesetFD, &ll.PathBeneathAttr{ParentFd: fd, AllowedAccess: rights}, 0)
		}
		unix.Close(fd)
		if err != nil {
			return n, fmt.Errorf("landlock rule %s: %w", g.Path, err)
		}
		if rights != 0 {
			n++
		}
	}
	return n, nil
}
