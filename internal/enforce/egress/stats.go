package egress

import "fmt"

// Stats are the hook group's counters.
type Stats struct {
	DNSRedirects   uint64 // queries redirected to the proxy
	Denied         uint64 // refused operations
	Recorded       uint64 // operations record-only mode let through
	AllowedAnswer  uint64 // allowed by an answered address
	AllowedRule    uint64 // allowed by a CIDR or service rule
	Addresses      int    // answered addresses held, all sandboxes
	Overflow       uint64 // unexpired addresses evicted because a sandbox's share was full
	OverflowBySbox map[uint32]uint64
}

// Stats returns the counters.
func (e *Egress) Stats() (Stats, error) {
	var s Stats
	dst := []*uint64{&s.DNSRedirects, &s.Denied, &s.Recorded, &s.AllowedAnswer, &s.AllowedRule}
	for i, p := range dst {
		var per []uint64
		if err := e.objs.EgressCounters.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("egress stats: %w", err)
		}
		for _, v := range per {
			*p += v
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s.Addresses = e.total
	s.OverflowBySbox = map[uint32]uint64{}
	for id, st := range e.sandboxes {
		s.Overflow += st.overflow
		if st.overflow > 0 {
			s.OverflowBySbox[id] = st.overflow
		}
	}
	return s, nil
}
