package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	good := `mode: record
grace: 10s
services:
  - name: postgres
    port: 5432
  - name: dev
    port: "8000-8010"
    protocol: any
allow:
  - cidr: 10.20.0.0/16
    ports: 443
    protocol: tcp
  - cidr: "2001:db8::/32"
  - cidr: 192.0.2.7
`
	p, err := ParsePolicy([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	cfg, names, err := p.Config(10)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.RecordOnly || len(cfg.Rules) != 7 || len(names) != 5 {
		t.Fatalf("config %+v names %v", cfg, names)
	}
	if r := cfg.Rules[0]; r.Prefix != netip.MustParsePrefix("127.0.0.0/8") || r.Ports != (PortRange{Lo: 5432, Hi: 5432}) || r.Protocol != ProtoTCP || r.ID != 10 {
		t.Errorf("service rule %+v", r)
	}
	if r := cfg.Rules[6]; r.Prefix != netip.MustParsePrefix("192.0.2.7/32") || r.Ports != (PortRange{}) || r.ID != 14 {
		t.Errorf("bare address rule %+v", r)
	}
	if names[2].Name != "allow:10.20.0.0/16" {
		t.Errorf("names %v", names)
	}

	bad := []struct{ doc, line, want string }{
		{"allow:\n  - cidr: 10.0.0.0/8\n  - cidr: 10.0.0.300/8\n", "line 3:", "invalid CIDR"},
		{"allow:\n  - cidr: 10.0.0.0/33\n", "line 2:", "invalid CIDR"},
		{"allow:\n  - cidr: 10.0.0.0/8\n    ports: 9000-80\n", "line 3:", "invalid port range"},
		{"allow:\n  - cidr: 10.0.0.0/8\n    ports: 70000\n", "line 3:", "outside 1-65535"},
		{"services:\n  - name: db\n    port: abc\n", "line 3:", "not a port number"},
		{"services:\n  - name: db\n", "line 2:", "without a port"},
		{"allow:\n  - cidr: 10.0.0.0/8\n    protocol: icmp\n", "line 3:", "protocol"},
		{"mode: block\n", "line 1:", "mode"},
		{"grace: soon\n", "line 1:", "grace"},
		{"mode: enforce\nallow:\n  - cidr: 10.0.0.0/8\n    port: 80\n", "[4:", "unknown field"},
	}
	for _, b := range bad {
		_, err := ParsePolicy([]byte(b.doc))
		if err == nil {
			t.Errorf("accepted:\n%s", b.doc)
			continue
		}
		if !strings.Contains(err.Error(), b.line) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("error %q, want %q and %q", err, b.line, b.want)
		}
	}
}

func TestCIDRMerge(t *testing.T) {
	rules := []Rule{
		{ID: 1, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: PortRange{Lo: 443, Hi: 443}, Protocol: ProtoTCP},
		{ID: 2, Prefix: netip.MustParsePrefix("10.1.0.0/16"), Ports: PortRange{Lo: 53, Hi: 53}, Protocol: ProtoUDP},
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
	var many []Rule
	for i := range 9 {
		many = append(many, Rule{ID: uint32(i), Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: PortRange{Lo: uint16(i + 1), Hi: uint16(i + 1)}})
	}
	if _, err := cidrEntries(1, many); err == nil {
		t.Error("9 ranges on one prefix accepted")
	}
}
