package backstop

import (
	"fmt"
)

// The verdict cache (bpf/backstop.c, "Verdict cache") keeps the allowed
// verdicts of opens of single-named files, keyed by inode, mount, root,
// sandbox and access, so repeated opens in a sandbox skip the path walk.
// An entry is valid under the rules generation (written here, odd while
// rules are written or while the cache is off) and the name generation
// (bumped by the programs on every directory change and mount-family
// syscall of the host). The name generation relies on the inode-change
// programs: without them attached the cache stays off.

// Indexes of bs_vcache_ctl and bs_vcache_stats (enum vc_ctl, vc_stat).
const (
	vcRulesGen  = 0
	vcNameGen   = 1
	vcBusy      = 2
	vcStatHits  = 0
	vcStatStore = 1
)

// ctimePrograms signal changes of names (directories' ctime); the cache
// is sound only while all of them run.
var ctimePrograms = []string{ProgCtimeSet, ProgCtimeXchg, ProgCtimeSkip}

// advanceRulesGen moves the rules generation past every value an entry
// may hold: to the next odd value (off) or even value (on).
func (b *Backstop) advanceRulesGen(on bool) error {
	m := b.maps("bs_vcache_ctl")
	var g uint64
	if err := m.Lookup(uint32(vcRulesGen), &g); err != nil {
		return fmt.Errorf("verdict cache generation: %w", err)
	}
	next := g + 1
	if (next%2 == 0) != on {
		next++
	}
	if err := m.Put(uint32(vcRulesGen), next); err != nil {
		return fmt.Errorf("verdict cache generation: %w", err)
	}
	return nil
}

// cacheReadyLocked reports whether this Backstop holds every program the
// cache's invalidation needs attached.
func (b *Backstop) cacheReadyLocked() bool {
	if b.cacheForced {
		return true
	}
	if !b.links.Held(ProgSysEnter) {
		return false
	}
	for _, name := range ctimePrograms {
		if !b.links.Held(name) {
			return false
		}
	}
	return true
}

// SetVerdictCache turns the verdict cache on or off for callers that
// attach the programs themselves (bench/syscall). On is sound only while
// the inode-change programs (ProgCtime*) and ProgSysEnter run whenever
// ProgSysExit does; Attach manages the cache by itself.
func (b *Backstop) SetVerdictCache(on bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cacheForced = on
	return b.advanceRulesGen(on)
}

// VerdictCacheStats returns how many opens the verdict cache answered and
// how many verdicts it stored, summed over CPUs.
func (b *Backstop) VerdictCacheStats() (hits, stores uint64, err error) {
	m := b.maps("bs_vcache_stats")
	sum := func(i uint32) (uint64, error) {
		var per []uint64
		if err := m.Lookup(i, &per); err != nil {
			return 0, fmt.Errorf("verdict cache stats: %w", err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n, nil
	}
	if hits, err = sum(vcStatHits); err != nil {
		return 0, 0, err
	}
	stores, err = sum(vcStatStore)
	return hits, stores, err
}

// VerdictCacheOn reports whether the cache is in use (the rules
// generation is even and not 0).
func (b *Backstop) VerdictCacheOn() (bool, error) {
	var g uint64
	if err := b.maps("bs_vcache_ctl").Lookup(uint32(vcRulesGen), &g); err != nil {
		return false, fmt.Errorf("verdict cache generation: %w", err)
	}
	return g != 0 && g%2 == 0, nil
}
