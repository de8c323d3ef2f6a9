package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"

	"golang.org/x/sys/unix"
)

// TreeHash is a SHA-256 over a directory tree: each entry's relative
// path, type, permissions, owner, size and content (a symlink's target, a
// device's number; a regular file's content digest, which reads its data
// extents only: see contentDigest), in lexical order. Times are not part
// of it. Devices, FIFOs and sockets are never opened.
func TreeHash(dir string) (string, error) {
	return treeHash(newMeter(context.Background(), "hash", nil), dir)
}

func treeHash(m *meter, dir string) (string, error) {
	h := sha256.New()
	if err := hashEntry(m, h, dir, ".", nil); err != nil {
		return "", fmt.Errorf("hash %s: %w", dir, err)
	}
	err := walkTree(m, dir, true, func(rel string, st *unix.Stat_t, _ bool) (bool, bool, error) {
		return true, false, hashEntry(m, h, dir, rel, st)
	}, nil)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashEntry writes the line of one entry (st nil: lstat it).
func hashEntry(m *meter, h hash.Hash, dir, rel string, st *unix.Stat_t) error {
	p := dir + "/" + rel
	if st == nil {
		st = new(unix.Stat_t)
		if err := unix.Lstat(p, st); err != nil {
			return err
		}
	}
	fmt.Fprintf(h, "%q %o %d %d", rel, st.Mode, st.Uid, st.Gid)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		var fst unix.Stat_t
		err = unix.Fstat(fd, &fst)
		var sum []byte
		if err == nil {
			if fst.Mode&unix.S_IFMT != unix.S_IFREG {
				err = fmt.Errorf("%s: %w", p, errMoved) // swapped since listed
			} else {
				sum, err = contentDigest(m, fd, fst.Size)
			}
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		fmt.Fprintf(h, " %d %x", fst.Size, sum)
	case unix.S_IFLNK:
		t, err := readlink(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, " -> %q", t)
	case unix.S_IFCHR, unix.S_IFBLK:
		fmt.Fprintf(h, " dev %d", st.Rdev)
	}
	h.Write([]byte{'\n'})
	return nil
}

// hashDirs is the tree hash of one directory, or a hash of the hashes of
// several.
func hashDirs(m *meter, dirs []string) (string, error) {
	if len(dirs) == 1 {
		return treeHash(m, dirs[0])
	}
	h := sha256.New()
	for _, d := range dirs {
		s, err := treeHash(m, d)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %s\n", s, d)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readlink(p string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlink(p, buf)
		if err != nil {
			return "", fmt.Errorf("readlink %s: %w", p, err)
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}
