package enforce

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// Inode entries name a file, not a number. The LSM and backstop tables
// judge other names of a protected file (hard links, bind mounts) by an
// entry keyed on the file's device and inode number, written when the
// rules are set. The number alone does not identify the file for long:
// once the file is deleted (a ledger segment compressed and removed, a
// key or policy file replaced by rename) ext4 and xfs give the number to
// the next file created nearby, often at once, and the entry, which stays
// until the next reload (the agent does not follow its own busy
// directories), would judge that unrelated file by the protected file's
// rule: npm's debug log recorded, or killed, as one of the agent's files.
//
// So each entry also holds the inode's generation (i_generation), which
// these filesystems draw at random (ext4, xfs, f2fs, tmpfs) whenever they
// hand out a number: the BPF programs compare it with the generation of
// the inode being judged, and an entry made for another file never
// matches. Keying on change times would not do (ctime moves on every
// write and chmod of the protected file itself), nor would birth time (no
// field of struct inode). Removing entries when their file goes away
// would not be exact either: a file outlives its last name while it is
// open, the BPF LSM path has no program on the host's unlinks, and an
// agent that deletes entries from user space races the next file created.
//
// The agent reads the generation from the file handle the filesystem
// encodes (name_to_handle_at on an O_PATH descriptor: no open of the
// file itself, so no device driver, FIFO or socket is touched), whose
// layout is known for the filesystems above and carries i_generation as
// is. Elsewhere (procfs, sysfs, bpffs, overlayfs, btrfs, network and FUSE
// filesystems) the entry holds GenerationAny and the number alone decides,
// as before: those either never reuse numbers soon (procfs, sysfs and
// bpffs count up), or have inode numbers the agent's stat does not share
// with the kernel's inode (btrfs subvolumes), or are not judged by inode
// in the change programs (overlayfs).

// GenerationAny is the generation of an inode entry whose file's
// generation could not be read (GEN_ANY in bpf/): any inode with the
// number matches. A file whose generation is this very value (1 in 2^32
// of random ones) gets the same treatment.
const GenerationAny = ^uint32(0)

// FileID identifies a file for the kernel's inode tables.
type FileID struct {
	// Stat_t is the file's fstat (Dev, Ino, Mode...).
	unix.Stat_t
	// Generation is the inode's i_generation, or GenerationAny.
	Generation uint32
	// Magic is the filesystem's statfs f_type (0 where unread).
	Magic uint32
}

// OverlayfsMagic is overlayfs's f_type. Over two filesystems (no xino)
// its directories get numbers overlayfs draws and its files keep their
// layer's, all under the overlay's device: a directory's (dev, ino) can
// be a file's too.
const OverlayfsMagic = 0x794c7630

// Superblock magics of the filesystems whose file handles carry the
// generation in a known layout.
const (
	ext4Magic  = 0xEF53 // ext2, ext3, ext4
	f2fsMagic  = 0xF2F52010
	xfsMagic   = 0x58465342
	tmpfsMagic = 0x01021994 // tmpfs, devtmpfs, shmem
)

// IdentifyFile identifies the file at path (its target when follow is
// set, else a symlink itself). The file is reached through an O_PATH
// descriptor, so the stat and the generation are of one file even while
// the path is being replaced.
func IdentifyFile(path string, follow bool) (FileID, error) {
	return (&identifier{}).identify(path, follow)
}

// identifier identifies files; it keeps the filesystem type of each
// device seen (one walk of a tree asks once per filesystem).
type identifier struct {
	magic map[uint64]uint32
}

func (r *identifier) identify(path string, follow bool) (FileID, error) {
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return FileID{}, &pathError{op: "open", path: path, err: err}
	}
	defer unix.Close(fd)
	var id FileID
	if err := unix.Fstat(fd, &id.Stat_t); err != nil {
		return FileID{}, &pathError{op: "stat", path: path, err: err}
	}
	magic, ok := r.magic[id.Dev]
	if !ok {
		var sfs unix.Statfs_t
		if unix.Fstatfs(fd, &sfs) == nil {
			magic = uint32(sfs.Type)
			if r.magic == nil {
				r.magic = map[uint64]uint32{}
			}
			r.magic[id.Dev] = magic
		}
	}
	id.Magic = magic
	id.Generation = generation(fd, magic, &id.Stat_t)
	return id, nil
}

// pathError is an error of one path; it unwraps to the errno, so
// errors.Is(err, fs.ErrNotExist) and unix.ENOENT both hold for a missing
// file.
type pathError struct {
	op, path string
	err      error
}

func (e *pathError) Error() string { return fmt.Sprintf("%s %s: %v", e.op, e.path, e.err) }
func (e *pathError) Unwrap() error { return e.err }

// generation reads the i_generation of fd's inode (on a filesystem of
// superblock magic) from its file handle, or returns GenerationAny. The handle's inode number must be st's: a
// layout this code misreads gives GenerationAny, never a wrong
// generation.
func generation(fd int, magic uint32, st *unix.Stat_t) uint32 {
	switch magic {
	case ext4Magic, f2fsMagic, xfsMagic, tmpfsMagic:
	default:
		return GenerationAny // no layout known: no handle asked for
	}
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return GenerationAny
	}
	gen, ino, ok := parseHandle(magic, h.Type(), h.Bytes())
	if !ok || ino != st.Ino {
		return GenerationAny
	}
	return gen
}

// File handle types (include/linux/exportfs.h).
const (
	fileIDIno32Gen    = 1    // FILEID_INO32_GEN: u32 ino, u32 gen (tmpfs: see below)
	fileIDXFSIno64Gen = 0x81 // FILEID_INO32_GEN | XFS_FILEID_TYPE_64FLAG: u64 ino, u32 gen
)

// parseHandle returns the generation and inode number a file handle of a
// filesystem (by superblock magic) holds.
func parseHandle(magic uint32, typ int32, b []byte) (gen uint32, ino uint64, ok bool) {
	le := binary.LittleEndian // handles are in host order; watcher's BPF targets amd64
	switch {
	case (magic == ext4Magic || magic == f2fsMagic || magic == xfsMagic) && typ == fileIDIno32Gen && len(b) == 8:
		// export_encode_fh (ext2/3/4, f2fs) and xfs_fs_encode_fh
		// (32-bit inode numbers): {ino, i_generation}.
		return le.Uint32(b[4:]), uint64(le.Uint32(b)), true
	case magic == xfsMagic && typ == fileIDXFSIno64Gen && len(b) == 12:
		// xfs_fid64: {u64 ino, u32 i_generation}, packed.
		return le.Uint32(b[8:]), le.Uint64(b), true
	case magic == tmpfsMagic && typ == fileIDIno32Gen && len(b) == 12:
		// shmem_encode_fh: {i_generation, ino low, ino high}.
		return le.Uint32(b), uint64(le.Uint32(b[4:])) | uint64(le.Uint32(b[8:]))<<32, true
	}
	return 0, 0, false
}
