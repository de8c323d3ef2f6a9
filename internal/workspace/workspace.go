// Package workspace keeps overlay workspaces: each workspace directory of a
// sandbox is shown to sandboxed commands through an overlayfs whose lower
// layer is the real directory and whose upper layer this package keeps, so
// the changes can be listed (Diff), merged into the real directory (Commit),
// thrown away (Rollback), and saved and restored by name (Snapshot,
// RollbackTo).
//
// Layout under the state directory, one per sandbox:
//
//	SANDBOX/lock                    flock held by every operation
//	SANDBOX/layers/ID/lower         the real directory's path (text)
//	SANDBOX/layers/ID/upper, work   the overlay's upper and work dirs
//	SANDBOX/layers/ID/merged        where the overlay is mounted
//	SANDBOX/snapshots/NAME/ID/      copies of the upper layers
//	SANDBOX/snapshots/NAME/meta.json
//
// The overlay is mounted once per workspace directory, in the host's mount
// namespace, at merged; `watcher exec` bind-mounts it over the real path in
// the command's own mount namespace, and a container runtime can bind-mount
// it into a container (Prepare). Changing the upper layer under a mounted
// overlay is undefined behaviour in overlayfs, so Commit and Rollback
// unmount it first; the caller stops the sandbox's processes before that.
package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// Workspace is one sandbox's overlay workspaces. Methods take the sandbox's
// lock for their duration; a Workspace is not for concurrent use.
type Workspace struct {
	// Sandbox is the sandbox's name.
	Sandbox string
	// Dir is the sandbox's state directory.
	Dir string
	// Layers are the overlays, one per workspace directory, in the
	// policy's order.
	Layers []Layer
	// Progress, when set, is called now and then (at most every 250 ms)
	// while a long operation runs.
	Progress func(Progress)
}

func (w *Workspace) meter(ctx context.Context, op string) *meter {
	return newMeter(ctx, op, w.Progress)
}

// stopped wraps the error that stopped op; a cancellation says how far
// it got (errors.Is(err, context.Canceled) holds).
func (w *Workspace) stopped(m *meter, op string, err error) error {
	if cerr := m.ctx.Err(); cerr != nil {
		if err == nil || !errors.Is(err, cerr) {
			err = errors.Join(cerr, err)
		}
		return fmt.Errorf("workspace %s: %s interrupted after %s: %w", w.Sandbox, op, m.p, err)
	}
	return fmt.Errorf("workspace %s: %s: %w", w.Sandbox, op, err)
}

// Layer is the overlay of one workspace directory.
type Layer struct {
	// ID names the layer's directory: the base name of Lower and a hash of
	// its path.
	ID string
	// Lower is the real workspace directory.
	Lower string
	// Upper, Work and Merged are the overlay's directories.
	Upper, Work, Merged string
}

// ErrDifferentFilesystems is returned when a layer's upper and work
// directories are on different filesystems, which overlayfs refuses.
var ErrDifferentFilesystems = errors.New("upper and work directories must be on one filesystem")

var nameChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func layerID(lower string) string {
	sum := sha256.Sum256([]byte(lower))
	base := nameChars.ReplaceAllString(filepath.Base(lower), "_")
	if len(base) > 40 {
		base = base[:40]
	}
	return base + "-" + hex.EncodeToString(sum[:4])
}

// Open prepares the state of sandbox's workspaces below stateDir (creating
// directories as needed) and checks them; it mounts nothing.
func Open(stateDir, sandbox string, dirs []string) (*Workspace, error) {
	if len(dirs) == 0 {
		return nil, fmt.Errorf("workspace %s: no workspace directories", sandbox)
	}
	w := &Workspace{Sandbox: sandbox, Dir: filepath.Join(stateDir, sandbox)}
	for _, d := range dirs {
		d = filepath.Clean(d)
		st, err := os.Stat(d)
		if err != nil {
			return nil, fmt.Errorf("workspace %s: %w", sandbox, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("workspace %s: %s is not a directory", sandbox, d)
		}
		id := layerID(d)
		base := filepath.Join(w.Dir, "layers", id)
		l := Layer{ID: id, Lower: d, Upper: filepath.Join(base, "upper"), Work: filepath.Join(base, "work"), Merged: filepath.Join(base, "merged")}
		for _, p := range []string{l.Upper, l.Work, l.Merged} {
			if err := os.MkdirAll(p, 0o700); err != nil {
				return nil, fmt.Errorf("workspace %s: %w", sandbox, err)
			}
		}
		if err := os.WriteFile(filepath.Join(base, "lower"), []byte(d+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", sandbox, err)
		}
		if err := checkSameFS(l.Upper, l.Work); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", sandbox, err)
		}
		if err := matchRoot(&l); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", sandbox, err)
		}
		if within(l.Upper, l.Lower) || within(l.Lower, l.Upper) {
			return nil, fmt.Errorf("workspace %s: state directory %s and workspace %s overlap; put the state elsewhere", sandbox, w.Dir, d)
		}
		w.Layers = append(w.Layers, l)
	}
	return w, nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func checkSameFS(upper, work string) error {
	var a, b unix.Stat_t
	if err := unix.Stat(upper, &a); err != nil {
		return fmt.Errorf("stat %s: %w", upper, err)
	}
	if err := unix.Stat(work, &b); err != nil {
		return fmt.Errorf("stat %s: %w", work, err)
	}
	if a.Dev != b.Dev {
		return fmt.Errorf("%w: upper %s is on device %d:%d, work %s on %d:%d (keep the state directory on one filesystem, without mounts inside it)",
			ErrDifferentFilesystems, upper, unix.Major(a.Dev), unix.Minor(a.Dev), work, unix.Major(b.Dev), unix.Minor(b.Dev))
	}
	return nil
}

// lock takes the sandbox's lock (exclusive); the returned func releases it.
func (w *Workspace) lock() (func(), error) {
	if err := os.MkdirAll(w.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace %s: %w", w.Sandbox, err)
	}
	f, err := os.OpenFile(filepath.Join(w.Dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("workspace %s: lock: %w", w.Sandbox, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("workspace %s: lock: %w", w.Sandbox, err)
	}
	return func() { f.Close() }, nil
}

// overlayOptions keeps the upper layer plain: no redirects, no metacopy
// and no index, so it holds whole files, whiteouts and opaque directories
// only, which Diff and Commit read and a copy preserves.
func (l *Layer) overlayOptions() string {
	esc := func(s string) string { return strings.NewReplacer(`\`, `\\`, `,`, `\,`, `:`, `\:`).Replace(s) }
	return "lowerdir=" + esc(l.Lower) + ",upperdir=" + esc(l.Upper) + ",workdir=" + esc(l.Work) +
		",redirect_dir=off,index=off,metacopy=off"
}

// Mount mounts every layer's overlay at its merged directory (layers
// already mounted are left as they are).
func (w *Workspace) Mount() error {
	unlock, err := w.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return w.mountLocked()
}

func (w *Workspace) mountLocked() error {
	mounted, err := overlayMounts()
	if err != nil {
		return err
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		if mounted[l.Merged] {
			continue
		}
		if err := checkSameFS(l.Upper, l.Work); err != nil {
			return fmt.Errorf("workspace %s: %w", w.Sandbox, err)
		}
		if err := unix.Mount("overlay", l.Merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, l.overlayOptions()); err != nil {
			return fmt.Errorf("workspace %s: mount overlay of %s at %s: %w", w.Sandbox, l.Lower, l.Merged, explainMount(err, l))
		}
	}
	return nil
}

func explainMount(err error, l *Layer) error {
	if errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("%w (overlayfs is not available in this kernel)", err)
	}
	if errors.Is(err, syscall.EINVAL) {
		if cerr := checkSameFS(l.Upper, l.Work); cerr != nil {
			return fmt.Errorf("%w: %w", err, cerr)
		}
		return fmt.Errorf("%w (the kernel refused the options %q; its log says why)", err, l.overlayOptions())
	}
	return err
}

// Unmount unmounts every layer's overlay at merged. It fails with EBUSY
// when a process still uses it: stop the sandbox first.
func (w *Workspace) Unmount() error {
	unlock, err := w.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return w.unmountLocked()
}

func (w *Workspace) unmountLocked() error {
	mounted, err := overlayMounts()
	if err != nil {
		return err
	}
	for _, l := range w.Layers {
		for mounted[l.Merged] {
			if err := unix.Unmount(l.Merged, 0); err != nil {
				if errors.Is(err, syscall.EBUSY) {
					return fmt.Errorf("workspace %s: unmount %s: %w (a process still uses the workspace; stop the sandbox first)", w.Sandbox, l.Merged, err)
				}
				return fmt.Errorf("workspace %s: unmount %s: %w", w.Sandbox, l.Merged, err)
			}
			if mounted, err = overlayMounts(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Mounted reports whether every layer's overlay is mounted.
func (w *Workspace) Mounted() (bool, error) {
	mounted, err := overlayMounts()
	if err != nil {
		return false, err
	}
	for _, l := range w.Layers {
		if !mounted[l.Merged] {
			return false, nil
		}
	}
	return true, nil
}

// overlayMounts returns the mount points of overlay filesystems in this
// process's mount namespace.
func overlayMounts() (map[string]bool, error) {
	mounts, err := cgroupfs.ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range mounts {
		if m.FSType == "overlay" {
			out[m.Point] = true
		}
	}
	return out, nil
}

// Binds returns, for each layer, the merged directory and the real path
// it is to be bind-mounted over in a command's mount namespace.
func (w *Workspace) Binds() [][2]string {
	out := make([][2]string, len(w.Layers))
	for i, l := range w.Layers {
		out[i] = [2]string{l.Merged, l.Lower}
	}
	return out
}

// resetUpper empties a layer's upper and work directories (overlay
// unmounted).
func resetUpper(l *Layer) error {
	for _, d := range []string{l.Upper, l.Work} {
		if err := removeTree(d); err != nil {
			// The work dir's "work" subdirectory is mode 000: root
			// opens it all the same.
			return fmt.Errorf("clear %s: %w", d, err)
		}
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("clear %s: %w", d, err)
		}
	}
	return matchRoot(l)
}

// matchRoot gives the upper directory the real directory's owner and
// mode: the overlay's root shows the upper root's attributes.
func matchRoot(l *Layer) error {
	var st unix.Stat_t
	if err := unix.Stat(l.Lower, &st); err != nil {
		return fmt.Errorf("stat %s: %w", l.Lower, err)
	}
	if err := os.Lchown(l.Upper, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", l.Upper, err)
	}
	if err := unix.Chmod(l.Upper, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", l.Upper, err)
	}
	return nil
}
