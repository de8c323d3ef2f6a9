package canary

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A run's scratch directory lives in the temporary directory (the sandbox
// must be able to read its fixtures; the agent's own directories are
// refused to it) and is named after the agent's PID, so an agent killed
// during a run leaves a directory the next agent can tell is stale.

// scratchPrefix is the name prefix of this process's scratch directories.
func scratchPrefix() string { return fmt.Sprintf("watcher-canary-%d-", os.Getpid()) }

// RemoveStaleScratch removes the scratch directories under dir (the
// temporary directory when "") whose agent no longer runs. It returns how
// many it removed.
func RemoveStaleScratch(dir string) (int, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	matches, err := filepath.Glob(filepath.Join(dir, "watcher-canary-*-*"))
	if err != nil {
		return 0, fmt.Errorf("canary scratch: %w", err)
	}
	removed := 0
	var errs []error
	for _, m := range matches {
		rest := strings.TrimPrefix(filepath.Base(m), "watcher-canary-")
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 {
			continue // not a scratch directory of ours
		}
		if st, err := os.Lstat(m); err != nil || !st.IsDir() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil || !errors.Is(err, os.ErrNotExist) {
			continue // its agent (or a process with its PID) runs
		}
		if err := os.RemoveAll(m); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("canary scratch: %w", err)
	}
	return removed, nil
}
