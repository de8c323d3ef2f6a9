package workspace

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"

	"golang.org/x/sys/unix"
)

// Files are read by their data extents (lseek SEEK_DATA/SEEK_HOLE): a
// sparse file of 4 TiB with a few bytes written costs those bytes, not
// 4 TiB of zeros. Holes are skipped when comparing and hashing and
// recreated (ftruncate) when copying. Where a filesystem does not know
// SEEK_DATA (EINVAL), the whole file is data.

// eachData calls fn for each data extent [off, end) of the open file fd,
// whose size is size, in order.
func eachData(fd int, size int64, fn func(off, end int64) error) error {
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			return nil // only a hole is left
		case errors.Is(err, unix.EINVAL):
			return fn(off, size)
		case err != nil:
			return fmt.Errorf("seek data: %w", err)
		}
		if d >= size {
			return nil
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil || h > size {
			h = size
		}
		if err := fn(d, h); err != nil {
			return err
		}
		off = h
	}
	return nil
}

// nextData is where data starts at or after off (size when none does).
func nextData(fd int, off, size int64) (int64, error) {
	d, err := unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return size, nil
	case errors.Is(err, unix.EINVAL):
		return off, nil
	case err != nil:
		return 0, fmt.Errorf("seek data: %w", err)
	}
	return min(d, size), nil
}

// preadFull reads len(b) bytes at off (fewer only at the end of file).
func preadFull(fd int, b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pread(fd, b[n:], off+int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			break
		}
		n += k
	}
	return n, nil
}

// copyData copies the data extents of in (size bytes) to out and gives
// out the size, so the holes of in are holes of out.
func copyData(m *meter, in, out int, size int64) error {
	buf := m.buffer()[:copyChunk]
	err := eachData(in, size, func(off, end int64) error {
		for off < end {
			n, err := preadFull(in, buf[:min(int64(len(buf)), end-off)], off)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if n == 0 {
				return nil // shrank meanwhile
			}
			for w := 0; w < n; {
				k, err := unix.Pwrite(out, buf[w:n], off+int64(w))
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil {
					return fmt.Errorf("write: %w", err)
				}
				w += k
			}
			off += int64(n)
			if err := m.read(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(out, size); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

// sameData reports whether the open files a and b, both size bytes, hold
// the same bytes (a hole reads as zeros), reading only where either has
// data.
func sameData(m *meter, a, b int, size int64) (bool, error) {
	buf := m.buffer()
	ba, bb := buf[:copyChunk], buf[copyChunk:2*copyChunk]
	for pos := int64(0); pos < size; {
		da, err := nextData(a, pos, size)
		if err != nil {
			return false, err
		}
		db, err := nextData(b, pos, size)
		if err != nil {
			return false, err
		}
		start := min(da, db)
		if start >= size {
			return true, nil
		}
		want := int(min(int64(copyChunk), size-start))
		na, err := preadFull(a, ba[:want], start)
		if err != nil {
			return false, err
		}
		nb, err := preadFull(b, bb[:want], start)
		if err != nil {
			return false, err
		}
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if err := m.read(na + nb); err != nil {
			return false, err
		}
		if na == 0 {
			return true, nil // both shrank
		}
		pos = start + int64(na)
	}
	return true, nil
}

// hashBlock is the unit of the content digest.
const hashBlock = 64 << 10

// contentDigest hashes the bytes of the open file fd (size bytes) so
// that the digest depends on the bytes only, not on where the holes are:
// the file is cut into 64 KiB blocks and each block that is not all
// zeros contributes its index and bytes. Blocks in holes are never read.
func contentDigest(m *meter, fd int, size int64) ([]byte, error) {
	c := sha256.New()
	buf := m.buffer()[:hashBlock]
	done := int64(0) // blocks below this offset are hashed
	err := eachData(fd, size, func(off, end int64) error {
		for blk := max(off&^(hashBlock-1), done); blk < end; blk += hashBlock {
			n, err := preadFull(fd, buf[:min(int64(hashBlock), size-blk)], blk)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			hashNonZero(c, blk, buf[:n])
			done = blk + hashBlock
			if err := m.read(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c.Sum(nil), nil
}

var zeroBlock [hashBlock]byte

func hashNonZero(c hash.Hash, off int64, b []byte) {
	if bytes.Equal(b, zeroBlock[:len(b)]) {
		return
	}
	fmt.Fprintf(c, "%d %d\n", off, len(b))
	c.Write(b)
}
