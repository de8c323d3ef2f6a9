package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// TreeHash is a SHA-256 over a directory tree: each entry's relative
// path, type, permissions, owner, size and content (a symlink's target, a
// device's number), in lexical order. Times are not part of it.
func TreeHash(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st, err := lstat(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %o %d %d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			c := sha256.New()
			n, err := io.Copy(c, f)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %d %x", n, c.Sum(nil))
		case unix.S_IFLNK:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", t)
		case unix.S_IFCHR, unix.S_IFBLK:
			fmt.Fprintf(h, " dev %d", st.Rdev)
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashDirs is TreeHash of one directory, or a hash of the hashes of
// several.
func hashDirs(dirs []string) (string, error) {
	if len(dirs) == 1 {
		return TreeHash(dirs[0])
	}
	h := sha256.New()
	for _, d := range dirs {
		s, err := TreeHash(d)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %s\n", s, d)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
