package launch

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Isolation gives the command its own namespaces and mounts, set up in the
// child before the restrictions (Landlock and the seccomp filter forbid
// mounting afterwards).
type Isolation struct {
	// Namespaces are CLONE_NEW* flags for the child. With CLONE_NEWNS its
	// mount namespace is a copy of the launcher's in which the mounts
	// below are made; host mounts still propagate in, none propagate out.
	// With CLONE_NEWIPC it gets System V IPC objects of its own, gone when
	// its last process exits.
	Namespaces uintptr `json:"-"`
	// Mounts are made in order in the child's mount namespace (requires
	// CLONE_NEWNS).
	Mounts []Mount `json:"mounts,omitempty"`
}

// Mount is one mount(2) call.
type Mount struct {
	Source string  `json:"source"`
	Target string  `json:"target"`
	FSType string  `json:"fstype,omitempty"`
	Flags  uintptr `json:"flags,omitempty"`
	Data   string  `json:"data,omitempty"`
	// IfExists skips the mount when Target does not exist.
	IfExists bool `json:"if_exists,omitempty"`
}

// applyMounts makes the child's mounts, after turning its copy of the
// mount tree into slaves so nothing propagates back to the host.
func applyMounts(ms []Mount) error {
	if len(ms) == 0 {
		return nil
	}
	// The working directory is re-resolved after the mounts: one inside a
	// workspace must land in the overlay bound over it, not stay in the
	// directory below.
	wd, wdErr := os.Getwd()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	for _, m := range ms {
		if m.IfExists {
			if _, err := os.Stat(m.Target); err != nil {
				continue
			}
		}
		if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.Source, m.Target, err)
		}
	}
	if wdErr == nil {
		if err := unix.Chdir(wd); err != nil {
			return fmt.Errorf("chdir %s after mounts: %w", wd, err)
		}
	}
	return nil
}
