package egress

import (
	"net/netip"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

func TestCIDRMerge(t *testing.T) {
	rules := []egressrules.Rule{
		{ID: 1, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: egressrules.PortRange{Lo: 443, Hi: 443}, Protocol: egressrules.ProtoTCP},
		{ID: 2, Prefix: netip.MustParsePrefix("10.1.0.0/16"), Ports: egressrules.PortRange{Lo: 53, Hi: 53}, Protocol: egressrules.ProtoUDP},
	}
	got, err := cidrEntries(7, rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d entries", len(got))
	}
	for k, v := range got {
		switch k.Prefixlen {
		case 32 + 96 + 8:
			if v.N != 1 || v.R[0].RuleId != 1 {
				t.Errorf("/8 carries %+v", v)
			}
		case 32 + 96 + 16:
			// The longer prefix also carries the /8's range: an LPM lookup
			// sees only the longest match.
			if v.N != 2 {
				t.Errorf("/16 carries %+v", v)
			}
		default:
			t.Errorf("unexpected key %+v", k)
		}
		if k.SandboxId != 7 {
			t.Errorf("sandbox id %d", k.SandboxId)
		}
	}
	var many []egressrules.Rule
	for i := range 9 {
		many = append(many, egressrules.Rule{ID: uint32(i), Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: egressrules.PortRange{Lo: uint16(i + 1), Hi: uint16(i + 1)}})
	}
	if _, err := cidrEntries(1, many); err == nil {
		t.Error("9 ranges on one prefix accepted")
	}
}
