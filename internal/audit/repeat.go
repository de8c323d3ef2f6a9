package audit

import (
	"hash/maphash"
	"time"
)

// RepeatDetail says a record stands for Count identical operations (same
// process, kind, verdict, rule and details; see SameOperation) seen between
// First and Last and folded into one record. A burst's first operation has
// its own record; the ones after it are counted here.
type RepeatDetail struct {
	Count uint64    `json:"count"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// Count is how many operations the event stands for: Repeat.Count for a
// folded burst, 1 otherwise. Sums of Count over records are exact totals.
func (e *Event) Count() uint64 {
	if e.Repeat != nil {
		return e.Repeat.Count
	}
	return 1
}

// OperationHash hashes the fields SameOperation compares (time, thread id
// and parent excluded), so bursts can be found without building keys.
func OperationHash(h *maphash.Hash, e *Event) uint64 {
	h.Reset()
	h.WriteString(string(e.Kind))
	h.WriteByte(0)
	h.WriteString(string(e.Verdict))
	h.WriteByte(0)
	h.WriteString(e.Rule)
	h.WriteByte(0)
	h.WriteString(e.Mechanism)
	h.WriteByte(0)
	h.WriteString(e.Process.Comm)
	h.WriteByte(0)
	var b [8 * 4]byte
	put64(b[0:], e.Sandbox.CgroupID)
	put64(b[8:], e.Process.CgroupID)
	put64(b[16:], uint64(e.Process.TGID)<<32|uint64(e.Process.UID))
	var d uint64
	switch {
	case e.File != nil:
		h.WriteString(e.File.Path)
		d = uint64(e.File.Flags)<<32 | uint64(e.File.Dev)
	case e.Net != nil:
		h.WriteString(e.Net.Addr)
		h.WriteString(e.Net.Op)
		d = uint64(e.Net.Port)<<48 | uint64(e.Net.Family)<<32 | uint64(e.Net.Type)<<16 | uint64(e.Net.Protocol)
	case e.Syscall != nil:
		d = uint64(e.Syscall.Nr)<<32 ^ uint64(e.Syscall.Ret)
	case e.Target != nil:
		h.WriteString(e.Target.Comm)
		d = uint64(e.Target.PID)<<32 | uint64(e.Target.Mode)
	case e.Mount != nil:
		h.WriteString(e.Mount.Source)
		h.WriteString(e.Mount.Target)
	}
	put64(b[24:], d)
	h.Write(b[:])
	return h.Sum64()
}

func put64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// SameOperation reports whether b repeats a: the same process (by process
// id, thread ids may differ), cgroup, kind, verdict, rule, layer and
// details. Times and counts are not compared.
func SameOperation(a, b *Event) bool {
	if a.Kind != b.Kind || a.Verdict != b.Verdict || a.Rule != b.Rule || a.RuleID != b.RuleID || a.Mechanism != b.Mechanism ||
		a.Sandbox.CgroupID != b.Sandbox.CgroupID || a.Sandbox.ID != b.Sandbox.ID || a.Sandbox.Name != b.Sandbox.Name ||
		a.Process.TGID != b.Process.TGID || a.Process.UID != b.Process.UID ||
		a.Process.CgroupID != b.Process.CgroupID || a.Process.Comm != b.Process.Comm ||
		a.Process.Exe != b.Process.Exe || len(a.Process.Args) != 0 || len(b.Process.Args) != 0 ||
		a.Message != b.Message || a.Repeat != nil || b.Repeat != nil {
		return false
	}
	return eqPtr(a.File, b.File) && eqPtr(a.Target, b.Target) && eqPtr(a.Mount, b.Mount) &&
		eqPtr(a.Syscall, b.Syscall) && eqPtr(a.Net, b.Net) &&
		a.DNS == nil && b.DNS == nil && a.Loss == nil && b.Loss == nil && a.Summary == nil && b.Summary == nil &&
		a.Workspace == nil && b.Workspace == nil && a.Limit == nil && b.Limit == nil
}

// eqPtr compares two optional details by value.
func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
