package plan

// Rule ids: the kernel maps carry ids, events carry names.

import (
	"sync"
)

// RuleTable assigns stable ids (> 0) to rule names: the kernel maps carry
// the id, events are labelled with the name. The agent keeps one table for
// its lifetime, so an id keeps its meaning across policy reloads (events
// already in flight still resolve). The zero value is ready to use.
type RuleTable struct {
	mu    sync.RWMutex
	ids   map[string]uint32
	names []string // names[id-1]
}

// NewRuleTable returns an empty table.
func NewRuleTable() *RuleTable { return &RuleTable{} }

// ID returns the id of name, assigning the next one on first use. The
// empty name has id 0 (no rule).
func (t *RuleTable) ID(name string) uint32 {
	if name == "" {
		return 0
	}
	t.mu.RLock()
	id, ok := t.ids[name]
	t.mu.RUnlock()
	if ok {
		return id
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[name]; ok {
		return id
	}
	if t.ids == nil {
		t.ids = map[string]uint32{}
	}
	t.names = append(t.names, name)
	id = uint32(len(t.names))
	t.ids[name] = id
	return id
}

// Name returns the name of id, or "" for 0 and unknown ids. Safe for
// concurrent use with ID (the event reader calls it).
func (t *RuleTable) Name(id uint32) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if id == 0 || int(id) > len(t.names) {
		return ""
	}
	return t.names[id-1]
}
