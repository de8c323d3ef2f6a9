package enforce

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Rule tables are rewritten in place while programs read them, so every
// writer puts the wanted entries first and removes stale ones after: an
// entry wanted before and after never vanishes, and a reload opens no gap.

// SyncMap makes m hold exactly want.
func SyncMap[K comparable, V any](m *ebpf.Map, want map[K]V) error {
	if err := PutAll(m, want); err != nil {
		return err
	}
	return PruneMap(m, func(k K) bool { _, ok := want[k]; return ok })
}

// PutAll writes every entry of entries into m.
func PutAll[K comparable, V any](m *ebpf.Map, entries map[K]V) error {
	for k, v := range entries {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("update %s: %w", m, err)
		}
	}
	return nil
}

// PruneMap deletes the keys of m that keep rejects. Keys are collected
// first: deleting while iterating can restart the iteration.
func PruneMap[K comparable](m *ebpf.Map, keep func(K) bool) error {
	var stale []K
	var k K
	var v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !keep(k) {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", m, err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", m, err)
		}
	}
	return nil
}
