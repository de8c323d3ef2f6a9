package backstop

import (
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// SandboxRuleEntries returns bs_sb_rules as sandbox id -> "what" (sbr* |
// number) -> rule, for tests that check a reload leaves no stale entry.
func (b *Backstop) SandboxRuleEntries() (map[uint32]map[uint32]backstoprules.Rule, error) {
	out := map[uint32]map[uint32]backstoprules.Rule{}
	var k backstopSbRuleKey
	var v backstopCategoryRule
	it := b.maps("bs_sb_rules").Iterate()
	for it.Next(&k, &v) {
		if out[k.SandboxId] == nil {
			out[k.SandboxId] = map[uint32]backstoprules.Rule{}
		}
		out[k.SandboxId][k.What] = backstoprules.Rule{Action: v.Action, ID: v.RuleId}
	}
	return out, it.Err()
}

// Keys of SandboxRuleEntries.
const (
	SBRSyscall     = sbrSyscall
	SBRSyscall32   = sbrSyscall32
	SBRCategory    = sbrCategory
	CatIOUring     = catIOUring
	CatCompat      = catCompat
	CatPacket      = catPacketSocket
	CatCgroupWrite = catCgroupWrite
)

// ClearSandboxRules empties bs_sb_rules: the pins an agent from before the
// per-sandbox rules leaves (only the host-wide arrays hold actions).
func (b *Backstop) ClearSandboxRules() error {
	return enforce.PruneMap(b.maps("bs_sb_rules"), func(backstopSbRuleKey) bool { return false })
}
