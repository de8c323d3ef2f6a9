package lsm

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// opMax is one past the last operation (LSM_OP_MAX in bpf/include/lsm_rules.h).
const opMax lsmrules.Op = 30

// PathOp is what a file_op event changed (enum path_op in bpf/include/lsm_path.h).
type PathOp uint32

var pathOpNames = [...]string{"", "truncate", "create", "mkdir", "unlink", "rmdir", "symlink",
	"link_source", "link", "rename_from", "rename_to", "chmod", "chown", "setxattr", "removexattr",
	"exec", "mmap_exec", "utimes", "notify_mark"}

func (p PathOp) String() string {
	if int(p) < len(pathOpNames) && p != 0 {
		return pathOpNames[p]
	}
	return fmt.Sprintf("path_op(%d)", uint32(p))
}

// Checks of lsm_syscall_checks (CHECK_* in bpf/include/lsm_syscall.h); capabilities are
// their own number.
const (
	checkKey   = 64
	checkEntry = 65
	// syscallCompat: i386 numbers are keyed as syscallCompat + nr.
	syscallCompat = 0x10000
	// syscallTag marks a task event's mode as a syscall-scoped decision.
	syscallTag = 0x80000000
)

// groupOp is the op whose rule decides a dangerous-list entry judged in
// its syscall: the rule of its policy group.
func groupOp(o dangerous.Op) lsmrules.Op {
	switch {
	case o.Group == dangerous.GroupMount:
		return lsmrules.OpMount
	case o.Group == dangerous.GroupModule:
		return lsmrules.OpKernelLoadData
	case o.Group == dangerous.GroupIOUring:
		return lsmrules.OpIOUring
	case o.Hook == dangerous.HookKeyPermission:
		return lsmrules.OpKeyring
	}
	return lsmrules.OpKernelIface
}

// SyscallChecks lists lsm_syscall_checks' entries, from the one dangerous
// list: per syscall number (both tables) and check, the op deciding it.
func SyscallChecks() map[lsmSyscallCheckKey]lsmrules.Op {
	out := map[lsmSyscallCheckKey]lsmrules.Op{}
	for _, o := range dangerous.Ops {
		var checks []uint32
		switch {
		case o.Hook == dangerous.HookCapable:
			for _, c := range o.Caps() {
				checks = append(checks, uint32(c))
			}
		case o.Hook == dangerous.HookKeyPermission:
			checks = []uint32{checkKey}
		case o.AtEntry():
			checks = []uint32{checkEntry}
		}
		for _, c := range checks {
			if o.NR64 != dangerous.None {
				out[lsmSyscallCheckKey{Nr: uint32(o.NR64), Check: c}] = groupOp(o)
			}
			if o.NR32 != dangerous.None {
				out[lsmSyscallCheckKey{Nr: syscallCompat + uint32(o.NR32), Check: c}] = groupOp(o)
			}
		}
	}
	return out
}

// syscallName names a syscall-scoped decision's syscall (task event mode
// without syscallTag).
func syscallName(nr uint32) string {
	compat := nr >= syscallCompat
	for _, o := range dangerous.Ops {
		if !compat && o.NR64 != dangerous.None && uint32(o.NR64) == nr {
			return o.Name
		}
		if compat && o.NR32 != dangerous.None && uint32(o.NR32) == nr-syscallCompat {
			return o.Name + " (i386)"
		}
	}
	return fmt.Sprintf("syscall %d", nr)
}

// writeSyscallChecks fills lsm_syscall_checks (the same content for every
// agent: the list is compiled in). Stale entries are removed after the
// new ones are written.
func writeSyscallChecks(coll *ebpf.Collection) error {
	m := coll.Maps["lsm_syscall_checks"]
	if m == nil {
		return errors.New("lsm_syscall_checks map missing")
	}
	want := SyscallChecks()
	for k, op := range want {
		if err := m.Put(k, uint32(op)); err != nil {
			return fmt.Errorf("write lsm_syscall_checks: %w", err)
		}
	}
	var k lsmSyscallCheckKey
	var v uint32
	var stale []lsmSyscallCheckKey
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		m.Delete(k)
	}
	return nil
}

const pathKeyLen = len(lsmPathKey{}.Path)

// kernelDev converts a stat st_dev to the kernel's internal dev_t.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}

func checkDecision(d lsmrules.Decision) error {
	if d.Action > enforce.ActionKill {
		return fmt.Errorf("action %d out of range", d.Action)
	}
	return nil
}

func accessOrAll(a lsmrules.Access) lsmrules.Access {
	if a == 0 {
		return lsmrules.AccessAll
	}
	return a
}

// merge applies d to the accesses in a, keeping the stricter decision.
func merge(r *lsmAccessRule, set *lsmrules.Access, a lsmrules.Access, d lsmrules.Decision) {
	if a&lsmrules.AccessRead != 0 && (*set&lsmrules.AccessRead == 0 || d.Action > r.ReadAction) {
		r.ReadAction, r.ReadRule = d.Action, d.RuleID
	}
	if a&lsmrules.AccessWrite != 0 && (*set&lsmrules.AccessWrite == 0 || d.Action > r.WriteAction) {
		r.WriteAction, r.WriteRule = d.Action, d.RuleID
	}
	*set |= a
}

type pathEntry struct {
	key  string // path bytes, with a trailing NUL for exact rules
	rule lsmAccessRule
	set  lsmrules.Access
}

// buildPaths turns path rules into LPM entries, filling each entry's
// unspecified access from the longest enclosing prefix entry.
func buildPaths(rules []lsmrules.PathRule) (map[string]*pathEntry, error) {
	entries := map[string]*pathEntry{}
	add := func(key string, a lsmrules.Access, d lsmrules.Decision) {
		e := entries[key]
		if e == nil {
			e = &pathEntry{key: key}
			entries[key] = e
		}
		merge(&e.rule, &e.set, a, d)
	}
	for _, r := range rules {
		if !strings.HasPrefix(r.Path, "/") {
			return nil, fmt.Errorf("path rule %q: not absolute", r.Path)
		}
		if strings.IndexByte(r.Path, 0) >= 0 {
			return nil, fmt.Errorf("path rule %q: contains NUL", r.Path)
		}
		if len(r.Path)+1 > pathKeyLen {
			return nil, fmt.Errorf("path rule %q: longer than %d bytes", r.Path, pathKeyLen-1)
		}
		if err := checkDecision(r.Decision); err != nil {
			return nil, fmt.Errorf("path rule %q: %w", r.Path, err)
		}
		a := accessOrAll(r.Access)
		if !r.Prefix {
			add(r.Path+"\x00", a, r.Decision)
			continue
		}
		add(r.Path, a, r.Decision)
		if len(r.Path) > 1 && strings.HasSuffix(r.Path, "/") {
			add(strings.TrimSuffix(r.Path, "/")+"\x00", a, r.Decision)
		}
	}
	// Inherit, longest enclosing first: process keys by length so each
	// enclosing entry is complete before its children read it.
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) < len(keys[j]) })
	for _, k := range keys {
		e := entries[k]
		if e.set == lsmrules.AccessAll {
			continue
		}
		var parent *pathEntry
		for _, pk := range keys {
			if len(pk) >= len(k) {
				break
			}
			if !strings.HasSuffix(pk, "\x00") && strings.HasPrefix(k, pk) {
				parent = entries[pk] // keys are sorted: the last hit is the longest
			}
		}
		if parent == nil {
			continue
		}
		if e.set&lsmrules.AccessRead == 0 {
			e.rule.ReadAction, e.rule.ReadRule = parent.rule.ReadAction, parent.rule.ReadRule
		}
		if e.set&lsmrules.AccessWrite == 0 {
			e.rule.WriteAction, e.rule.WriteRule = parent.rule.WriteAction, parent.rule.WriteRule
		}
		e.set = lsmrules.AccessAll
	}
	return entries, nil
}

// prefixInodes adds inode entries for the files below prefix rules that
// judge reads, each with the rule its own path gets (the longest matching
// entry: an allowed file below a protected directory stays allowed), as
// the files are now (each entry with the file's generation: a file
// deleted later does not lend its entry to the next file given the
// number). A file created, moved in or replaced later needs another
// SetRules (the agent watches these directories). Exact rules' entries
// win over these.
func prefixInodes(sid uint32, entries map[string]*pathEntry, inodes map[lsmInoKey]lsmInoRule) error {
	var prefixes []string
	for key, e := range entries {
		if !strings.HasSuffix(key, "\x00") && e.rule.ReadAction != enforce.ActionAllow && key != "/" {
			prefixes = append(prefixes, key)
		}
	}
	sort.Strings(prefixes)
	budget := enforce.MaxTreeInodes
	exact := map[lsmInoKey]bool{}
	for k := range inodes {
		exact[k] = true
	}
	for _, pfx := range prefixes {
		_, err := enforce.TreeInodes(strings.TrimSuffix(pfx, "/"), &budget, func(path string, id *enforce.FileID) {
			e := longestEntry(entries, path, id.Mode&unix.S_IFMT == unix.S_IFDIR)
			if e == nil || (e.rule.ReadAction == enforce.ActionAllow && e.rule.WriteAction == enforce.ActionAllow) {
				return
			}
			ik := lsmInoKey{SandboxId: sid, Dev: kernelDev(id.Dev), Ino: id.Ino}
			if !exact[ik] {
				inodes[ik] = lsmInoRule{Rule: e.rule, Generation: id.Generation, Ftype: id.Mode & unix.S_IFMT}
			}
		})
		if err != nil {
			return fmt.Errorf("inodes below %q: %w", pfx, err)
		}
	}
	return nil
}

// longestEntry returns the entry the kernel's longest prefix match picks
// for path (a directory also as path + "/").
func longestEntry(entries map[string]*pathEntry, path string, dir bool) *pathEntry {
	if e, ok := entries[path+"\x00"]; ok {
		return e
	}
	var best *pathEntry
	bestLen := -1
	for key, e := range entries {
		if strings.HasSuffix(key, "\x00") || len(key) <= bestLen {
			continue
		}
		if strings.HasPrefix(path, key) || (dir && strings.HasPrefix(path+"/", key)) {
			best, bestLen = e, len(key)
		}
	}
	return best
}

func pathKey(sid uint32, key string) lsmPathKey {
	k := lsmPathKey{SandboxId: sid, Prefixlen: uint32(32 + 8*len(key))}
	for i := 0; i < len(key); i++ {
		k.Path[i] = int8(key[i])
	}
	return k
}

// SetRules replaces the rules of sandbox id sid (0: the defaults). New
// entries are written before stale ones are removed, so a rule present in
// both the old and the new set is never absent.
func (l *LSM) SetRules(sid uint32, r lsmrules.Rules) error {
	if err := l.setRules(sid, r); err != nil {
		return fmt.Errorf("set lsm rules for sandbox %d: %w", sid, err)
	}
	return nil
}

func (l *LSM) setRules(sid uint32, r lsmrules.Rules) error {
	m := l.maps.Maps
	if err := writeMmapMinAddr(l.maps); err != nil {
		return err
	}
	// Build everything first: invalid rules change nothing.
	ops := map[lsmOpKey]lsmDecision{}
	for op, d := range r.Ops {
		if op == 0 || op >= opMax {
			return fmt.Errorf("unknown op %d", op)
		}
		if err := checkDecision(d); err != nil {
			return fmt.Errorf("op %s: %w", op, err)
		}
		ops[lsmOpKey{SandboxId: sid, Op: uint32(op)}] = lsmDecision{Action: d.Action, RuleId: d.RuleID}
	}
	entries, err := buildPaths(r.Paths)
	if err != nil {
		return err
	}
	paths := map[lsmPathKey]lsmAccessRule{}
	inodes := map[lsmInoKey]lsmInoRule{}
	for key, e := range entries {
		paths[pathKey(sid, key)] = e.rule
		if !strings.HasSuffix(key, "\x00") {
			continue
		}
		// Exact rules also match the file's identity (hard links): its
		// inode number and generation, so the entry never judges a later
		// file given the number (enforce.FileID).
		id, err := enforce.IdentifyFile(strings.TrimSuffix(key, "\x00"), true)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EACCES) {
				continue
			}
			return fmt.Errorf("identify %q: %w", strings.TrimSuffix(key, "\x00"), err)
		}
		ik := lsmInoKey{SandboxId: sid, Dev: kernelDev(id.Dev), Ino: id.Ino}
		if old, ok := inodes[ik]; ok {
			// Two exact paths naming one file: keep the stricter per access.
			set := lsmrules.AccessAll
			merge(&old.Rule, &set, lsmrules.AccessRead, lsmrules.Decision{Action: e.rule.ReadAction, RuleID: e.rule.ReadRule})
			merge(&old.Rule, &set, lsmrules.AccessWrite, lsmrules.Decision{Action: e.rule.WriteAction, RuleID: e.rule.WriteRule})
			inodes[ik] = old
			continue
		}
		inodes[ik] = lsmInoRule{Rule: e.rule, Generation: id.Generation, Ftype: id.Mode & unix.S_IFMT}
	}
	if err := prefixInodes(sid, entries, inodes); err != nil {
		return err
	}
	execs := map[lsmPathKey]lsmDecision{}
	for _, r := range r.Exec {
		if !strings.HasPrefix(r.Path, "/") || strings.IndexByte(r.Path, 0) >= 0 || len(r.Path)+1 > pathKeyLen {
			return fmt.Errorf("exec rule %q: not an absolute path of at most %d bytes", r.Path, pathKeyLen-1)
		}
		if err := checkDecision(r.Decision); err != nil {
			return fmt.Errorf("exec rule %q: %w", r.Path, err)
		}
		key := r.Path
		if !r.Prefix {
			key += "\x00"
		}
		execs[pathKey(sid, key)] = lsmDecision{Action: r.Action, RuleId: r.RuleID}
	}
	socks, err := socketEntries(sid, r.Sockets)
	if err != nil {
		return err
	}
	unixPaths, err := allowPaths(sid, "unix socket", r.UnixPaths)
	if err != nil {
		return err
	}
	notifyPaths, err := allowPaths(sid, "notify mark", r.NotifyPaths)
	if err != nil {
		return err
	}
	fs := map[lsmFsKey]lsmAccessRule{}
	fsSet := map[lsmFsKey]lsmrules.Access{}
	for _, f := range r.FS {
		if err := checkDecision(f.Decision); err != nil {
			return fmt.Errorf("fs rule %#x: %w", f.Magic, err)
		}
		k := lsmFsKey{SandboxId: sid, Magic: f.Magic}
		rule, set := fs[k], fsSet[k]
		merge(&rule, &set, accessOrAll(f.Access), f.Decision)
		fs[k], fsSet[k] = rule, set
	}
	devs := map[lsmDevKey]lsmAccessRule{}
	devSet := map[lsmDevKey]lsmrules.Access{}
	for _, d := range r.Devices {
		if err := checkDecision(d.Decision); err != nil {
			return fmt.Errorf("device rule %d:%d: %w", d.Major, d.Minor, err)
		}
		if d.Major == lsmrules.AnyDevice && d.Minor != lsmrules.AnyDevice {
			return fmt.Errorf("device rule *:%d: a minor needs a major", d.Minor)
		}
		typ := uint32(2)
		if d.Block {
			typ = 1
		}
		k := lsmDevKey{SandboxId: sid, Type: typ, Major: d.Major, Minor: d.Minor}
		rule, set := devs[k], devSet[k]
		merge(&rule, &set, accessOrAll(d.Access), d.Decision)
		devs[k], devSet[k] = rule, set
	}
	var caps lsmCapRules
	for _, c := range r.Caps {
		if c.Cap < 0 || c.Cap >= 64 {
			return fmt.Errorf("capability %d out of range", c.Cap)
		}
		if err := checkDecision(c.Decision); err != nil {
			return fmt.Errorf("capability %d: %w", c.Cap, err)
		}
		bit := uint64(1) << c.Cap
		switch c.Action {
		case enforce.ActionAllow:
			continue
		case enforce.ActionRecord:
			if caps.Block&bit == 0 {
				caps.Record |= bit
				caps.RuleId[c.Cap] = c.RuleID
			}
		default: // block; kill is treated as block for capabilities
			caps.Block |= bit
			caps.RuleId[c.Cap] = c.RuleID
		}
	}

	// Write, then prune.
	if err := enforce.PutAll(m["lsm_op_rules"], ops); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_path_rules"], paths); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_exec_rules"], execs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_inode_rules"], inodes); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_fs_rules"], fs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_dev_rules"], devs); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_sock_rules"], socks); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_unix_rules"], unixPaths); err != nil {
		return err
	}
	if err := enforce.PutAll(m["lsm_notify_paths"], notifyPaths); err != nil {
		return err
	}
	capMap := m["lsm_cap_rules"]
	if caps.Record|caps.Block != 0 {
		if err := capMap.Put(sid, caps); err != nil {
			return fmt.Errorf("lsm_cap_rules: %w", err)
		}
	} else if err := capMap.Delete(sid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lsm_cap_rules: %w", err)
	}
	if err := enforce.PruneMap(m["lsm_op_rules"], func(k lsmOpKey) bool { _, keep := ops[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_path_rules"], func(k lsmPathKey) bool { _, keep := paths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_exec_rules"], func(k lsmPathKey) bool { _, keep := execs[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_inode_rules"], func(k lsmInoKey) bool { _, keep := inodes[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_fs_rules"], func(k lsmFsKey) bool { _, keep := fs[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_sock_rules"], func(k lsmSockKey) bool { _, keep := socks[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_unix_rules"], func(k lsmPathKey) bool { _, keep := unixPaths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	if err := enforce.PruneMap(m["lsm_notify_paths"], func(k lsmPathKey) bool { _, keep := notifyPaths[k]; return k.SandboxId != sid || keep }); err != nil {
		return err
	}
	return enforce.PruneMap(m["lsm_dev_rules"], func(k lsmDevKey) bool { _, keep := devs[k]; return k.SandboxId != sid || keep })
}

// allowPaths builds the LPM entries of sandbox sid allowing paths (what
// names what they are for errors): a path ending in "/" covers the tree
// below it, others exactly that path.
func allowPaths(sid uint32, what string, paths []string) (map[lsmPathKey]lsmDecision, error) {
	out := map[lsmPathKey]lsmDecision{}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 || len(p)+1 > pathKeyLen {
			return nil, fmt.Errorf("%s path %q: not an absolute path of at most %d bytes", what, p, pathKeyLen-1)
		}
		key := p
		if !strings.HasSuffix(p, "/") {
			key += "\x00"
		}
		out[pathKey(sid, key)] = lsmDecision{Action: enforce.ActionAllow}
	}
	return out, nil
}

// socketEntries builds the lsm_sock_rules entries of sandbox sid.
func socketEntries(sid uint32, rules []lsmrules.SocketRule) (map[lsmSockKey]lsmDecision, error) {
	field := func(v int, what string) (uint32, error) {
		switch {
		case v == lsmrules.AnySocket:
			return ^uint32(0), nil
		case v < 0 || v > 0xffff:
			return 0, fmt.Errorf("socket %s %d out of range", what, v)
		}
		return uint32(v), nil
	}
	out := map[lsmSockKey]lsmDecision{}
	for _, r := range rules {
		if err := checkDecision(r.Decision); err != nil {
			return nil, fmt.Errorf("socket rule %d/%d/%d: %w", r.Family, r.Type, r.Protocol, err)
		}
		fam, err := field(r.Family, "family")
		if err != nil {
			return nil, err
		}
		typ, err := field(r.Type, "type")
		if err != nil {
			return nil, err
		}
		proto, err := field(r.Protocol, "protocol")
		if err != nil {
			return nil, err
		}
		if fam == ^uint32(0) && (typ == ^uint32(0) || proto != ^uint32(0)) {
			return nil, fmt.Errorf("socket rule */%d/%d: an any-family rule needs a type and any protocol (it is not looked up otherwise)", r.Type, r.Protocol)
		}
		k := lsmSockKey{SandboxId: sid, Family: fam, Type: typ, Protocol: proto}
		if old, ok := out[k]; ok && old.Action >= r.Action {
			continue // the stricter rule wins
		}
		out[k] = lsmDecision{Action: r.Action, RuleId: r.RuleID}
	}
	return out, nil
}

// ClearRules removes every rule of sandbox sid.
func (l *LSM) ClearRules(sid uint32) error { return l.SetRules(sid, lsmrules.Rules{}) }

// ProtectAgentFiles returns prefix rules refusing every open (read and
// write) of the given agent paths (ledger directory, key files, the bpffs
// pin directory): directories should end in "/".
func ProtectAgentFiles(ruleID uint32, paths ...string) []lsmrules.PathRule {
	out := make([]lsmrules.PathRule, 0, len(paths))
	for _, p := range paths {
		out = append(out, lsmrules.PathRule{Path: p, Prefix: true, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: ruleID}})
	}
	return out
}

// statDev is used by tests and callers building DeviceRules from a node.
func statDev(path string) (block bool, major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, 0, 0, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		block = true
	case unix.S_IFCHR:
	default:
		return false, 0, 0, fmt.Errorf("%s is not a device node", path)
	}
	return block, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), nil
}

// DeviceRuleFor builds a rule for the device node at path.
func DeviceRuleFor(path string, access lsmrules.Access, d lsmrules.Decision) (lsmrules.DeviceRule, error) {
	block, major, minor, err := statDev(path)
	if err != nil {
		return lsmrules.DeviceRule{}, fmt.Errorf("device rule for %s: %w", path, err)
	}
	return lsmrules.DeviceRule{Block: block, Major: major, Minor: minor, Access: access, Decision: d}, nil
}
