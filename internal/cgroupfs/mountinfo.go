package cgroupfs

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo file (proc(5)).
type Mount struct {
	ID, Parent uint64
	// Major and Minor are the filesystem's device (st_dev).
	Major, Minor uint32
	// Root is the path inside the filesystem mounted here; Point the mount
	// point, relative to the reading process's root (unescaped).
	Root, Point string
	// Options are the per-mount options (ro, nosuid, ...).
	Options string
	FSType  string
	Source  string
	// SuperOptions are the superblock's options.
	SuperOptions string
}

// ReadMountinfo parses a mountinfo file (/proc/self/mountinfo,
// /proc/PID/mountinfo). Malformed lines are skipped.
func ReadMountinfo(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		pre, post := strings.Fields(line[:sep]), strings.Fields(line[sep+3:])
		if len(pre) < 6 || len(post) < 1 {
			continue
		}
		id, err1 := strconv.ParseUint(pre[0], 10, 64)
		parent, err2 := strconv.ParseUint(pre[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		var major, minor uint64
		if ma, mi, ok := strings.Cut(pre[2], ":"); ok {
			major, err1 = strconv.ParseUint(ma, 10, 32)
			minor, err2 = strconv.ParseUint(mi, 10, 32)
		}
		if err1 != nil || err2 != nil {
			continue
		}
		m := Mount{ID: id, Parent: parent, Major: uint32(major), Minor: uint32(minor), Root: UnescapeMount(pre[3]), Point: UnescapeMount(pre[4]), Options: pre[5], FSType: post[0]}
		if len(post) > 1 {
			m.Source = UnescapeMount(post[1])
		}
		if len(post) > 2 {
			m.SuperOptions = post[2]
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}
