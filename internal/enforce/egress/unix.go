package egress

import (
	"errors"
	"fmt"
	"path"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/enforce"
)

// Unix sockets: connect(2) and sendto(2) of AF_UNIX sockets reach host
// services no network hook sees (systemd-resolved's varlink socket, the
// D-Bus system bus, nscd, the Docker socket). cgroup/connect_unix and
// cgroup/sendmsg_unix (kernel 6.7+) judge the path as the process passed
// it, before the kernel resolves it: it must be absolute, free of "..",
// and inside one of the sandbox's UnixPaths; abstract names (the host's
// network namespace) are refused. A symlink inside an allowed directory
// that points at a host socket is not seen by these hooks.

// UnixErr is nil when the unix socket hooks loaded, or says why not.
func (e *Egress) UnixErr() error { return e.unixErr }

// ProbeUnix reports whether this kernel loads the unix socket hooks (nil)
// or why not, without touching pinned state.
func ProbeUnix() error {
	spec, err := loadEgress()
	if err != nil {
		return err
	}
	for name := range spec.Programs {
		if !strings.HasSuffix(name, "_unix") || strings.Contains(name, "_foreign_") {
			delete(spec.Programs, name)
		}
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for name, err := range enforce.ProbeEach(spec, ebpf.CollectionOptions{}) {
		if err != nil {
			return fmt.Errorf("cgroup unix socket hooks (kernel 6.7+): %s: %w", name, err)
		}
	}
	return nil
}

// mapByName returns the loaded map whose ebpf tag is name.
func (o *objects) mapByName(name string) *ebpf.Map {
	v := reflect.ValueOf(&o.egressMaps).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Tag.Get("ebpf") == name {
			m, _ := v.Field(i).Interface().(*ebpf.Map)
			return m
		}
	}
	return nil
}

// attachable lists the programs that loaded.
func (o *objects) attachable() []namedProgram {
	all := o.programs()
	out := all[:0:0]
	for _, p := range all {
		if p.prog != nil {
			out = append(out, p)
		}
	}
	return out
}

// unixEntries turns allowed socket paths into LPM entries.
func unixEntries(id uint32, paths []string, ruleID uint32) (map[egressUnixKey]uint32, error) {
	out := map[egressUnixKey]uint32{}
	for _, p := range paths {
		dir := strings.HasSuffix(p, "/")
		clean := path.Clean(p)
		if !path.IsAbs(p) || clean == "/" && !dir {
			return nil, fmt.Errorf("unix socket path %q: must be absolute", p)
		}
		if dir && clean != "/" {
			clean += "/"
		}
		var k egressUnixKey
		n := len(clean)
		if !dir {
			n++ // the terminating NUL: this socket only
		}
		if n > len(k.Path) {
			return nil, fmt.Errorf("unix socket path %q: longer than %d bytes", p, len(k.Path)-1)
		}
		k.SandboxId = id
		for i := 0; i < len(clean); i++ {
			k.Path[i] = int8(clean[i])
		}
		k.Prefixlen = uint32(32 + 8*n)
		out[k] = ruleID
	}
	return out, nil
}

// setUnixLocked makes the sandbox's unix path entries exactly want.
func (e *Egress) setUnixLocked(id uint32, st *sandboxState, want map[egressUnixKey]uint32) error {
	for k, v := range want {
		if err := e.objs.EgressUnix.Put(k, v); err != nil {
			return fmt.Errorf("unix paths: %w", err)
		}
		st.unixKeys[k] = struct{}{}
	}
	for k := range st.unixKeys {
		if _, keep := want[k]; keep {
			continue
		}
		if err := e.objs.EgressUnix.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("unix paths: %w", err)
		}
		delete(st.unixKeys, k)
	}
	return nil
}
