package limits

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OOMKill is one process the kernel's memory cgroup OOM killer killed, as
// its "oom-kill:" log line reports it.
type OOMKill struct {
	// Memcg is the cgroup whose limit was hit (relative to its hierarchy);
	// TaskMemcg the victim's own cgroup.
	Memcg, TaskMemcg string
	// Comm and PID name the victim.
	Comm string
	PID  int
	UID  int
}

// KernelLog reads the kernel log (/dev/kmsg) from where it was opened.
type KernelLog struct{ fd int }

// OpenKernelLog opens /dev/kmsg positioned at its end.
func OpenKernelLog() (*KernelLog, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("limits: open kernel log: %w", err)
	}
	if _, err := unix.Seek(fd, 0, unix.SEEK_END); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("limits: kernel log: %w", err)
	}
	return &KernelLog{fd: fd}, nil
}

// Close closes the log.
func (k *KernelLog) Close() error {
	if k == nil {
		return nil
	}
	return unix.Close(k.fd)
}

// OOMKills returns the OOM kills logged since the last call whose limit
// cgroup or victim's cgroup is rel or below it.
func (k *KernelLog) OOMKills(rel string) []OOMKill {
	var out []OOMKill
	for _, o := range k.AllOOMKills() {
		if o.Under(rel) {
			out = append(out, o)
		}
	}
	return out
}

// Under reports whether the kill's limit cgroup or the victim's cgroup is
// rel or below it.
func (o OOMKill) Under(rel string) bool {
	in := func(p string) bool { return p == rel || strings.HasPrefix(p, rel+"/") }
	return in(o.Memcg) || in(o.TaskMemcg)
}

// AllOOMKills returns every OOM kill logged since the last call.
func (k *KernelLog) AllOOMKills() []OOMKill {
	if k == nil {
		return nil
	}
	var out []OOMKill
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(k.fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records were overwritten; go on with the next
		}
		if err != nil || n <= 0 {
			return out
		}
		_, msg, ok := strings.Cut(string(buf[:n]), ";")
		if !ok {
			continue
		}
		msg, _, _ = strings.Cut(msg, "\n")
		if o, ok := parseOOMLine(msg); ok {
			out = append(out, o)
		}
	}
}

// parseOOMLine parses "oom-kill:constraint=CONSTRAINT_MEMCG,...,
// oom_memcg=/a,task_memcg=/a/b,task=name,pid=1,uid=0".
func parseOOMLine(msg string) (OOMKill, bool) {
	rest, ok := strings.CutPrefix(msg, "oom-kill:")
	if !ok {
		return OOMKill{}, false
	}
	var o OOMKill
	// task= is the last free-text field but comes before pid= and uid=;
	// a comm may contain commas, so cut from the right.
	if i := strings.LastIndex(rest, ",uid="); i >= 0 {
		o.UID, _ = strconv.Atoi(rest[i+5:])
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, ",pid="); i >= 0 {
		o.PID, _ = strconv.Atoi(rest[i+5:])
		rest = rest[:i]
	}
	if i := strings.Index(rest, ",task="); i >= 0 {
		o.Comm = rest[i+6:]
		rest = rest[:i]
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "oom_memcg":
			o.Memcg = v
		case "task_memcg":
			o.TaskMemcg = v
		}
	}
	return o, o.PID != 0
}
