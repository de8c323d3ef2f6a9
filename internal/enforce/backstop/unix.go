package backstop

import (
	"errors"
	"fmt"
	"strings"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// opConnect marks an allowed socket path in bs_unix_paths (OP_CONNECT).
const opConnect = 8

// setUnixPaths writes bs_unix_paths: per restricted sandbox a marker (the
// sandbox id alone, which every path of the sandbox matches when nothing
// longer does) and its allowed paths. New entries before stale ones are
// removed, so a reload never opens a gap.
func (b *Backstop) setUnixPaths(sets []backstoprules.UnixPaths) error {
	m := b.maps("bs_unix_paths")
	want := map[backstopPathKey]backstopPathRule{}
	for _, set := range sets {
		if set.SandboxID == 0 {
			return errors.New("backstop unix paths: sandbox id 0")
		}
		want[backstopPathKey{Prefixlen: 32, SandboxId: set.SandboxID}] = backstopPathRule{RuleId: set.Rule}
		for _, p := range set.Paths {
			k, err := pathKey(backstoprules.PathRule{Path: p, Prefix: strings.HasSuffix(p, "/"), SandboxID: set.SandboxID})
			if err != nil {
				return fmt.Errorf("backstop unix path: %w", err)
			}
			want[k] = backstopPathRule{RuleId: set.Rule, Ops: opConnect}
		}
	}
	if err := enforce.SyncMap(m, want); err != nil {
		return fmt.Errorf("backstop unix paths: %w", err)
	}
	return nil
}
