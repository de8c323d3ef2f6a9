package nslisten

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// CgroupTasks lists the processes in the cgroup directory dir and every
// cgroup below it (a sandbox root and its leaves). A cgroup removed while
// it is read is skipped.
func CgroupTasks(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		f, err := os.Open(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if pid, err := strconv.Atoi(sc.Text()); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}
