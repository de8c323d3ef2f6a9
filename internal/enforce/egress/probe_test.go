package egress

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestProbe(t *testing.T) {
	var uts unix.Utsname
	unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	for name, err := range Probe() {
		switch {
		case err == nil:
			t.Logf("%s loads", name)
		case strings.HasSuffix(name, "_unix") && kernelBefore(release, 6, 7):
			// The cgroup unix socket hooks came with 6.7: optional.
			t.Logf("%s does not load on %s (optional before 6.7): %v", name, release, err)
		default:
			t.Errorf("%s: %v", name, err)
		}
	}
}

func kernelBefore(release string, major, minor int) bool {
	var ma, mi int
	for i, part := range strings.SplitN(release, ".", 3)[:2] {
		n := 0
		for _, c := range part {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		if i == 0 {
			ma = n
		} else {
			mi = n
		}
	}
	return ma < major || ma == major && mi < minor
}
