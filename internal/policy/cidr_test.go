package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseCIDR(t *testing.T) {
	cases := []struct {
		in   string
		want string // the prefix, or "" for an error
		err  string // part of the error
	}{
		{"10.0.0.0/8", "10.0.0.0/8", ""},
		{"2001:db8::/32", "2001:db8::/32", ""},
		{"0.0.0.0/0", "0.0.0.0/0", ""},
		{"::/0", "::/0", ""},
		{"192.0.2.7", "192.0.2.7/32", ""},
		{"::1", "::1/128", ""},
		{"192.0.2.7/32", "192.0.2.7/32", ""},
		{"10.1.2.3/8", "", "host bits set (did you mean 10.0.0.0/8?)"},
		{"2001:db8::1/32", "", "host bits set (did you mean 2001:db8::/32?)"},
		{"10.0.0.0/33", "", "not a valid CIDR"},
		{"10.0.0.300/8", "", "not a valid CIDR"},
		{"10.0.0.0/", "", "not a valid CIDR"},
		{"fe80::1%eth0", "", "has a zone (%eth0)"},
		{"fe80::1%eth0/128", "", "not a valid CIDR"},
		{"example.com", "", "not an IP address or CIDR"},
		{" 10.0.0.0/8", "", "not a valid CIDR"},
		{"10.0.0.1 ", "", "not an IP address or CIDR"},
		{"", "", "not an IP address or CIDR"},
	}
	for _, c := range cases {
		p, err := ParseCIDR(c.in)
		if c.want != "" {
			if err != nil || p != netip.MustParsePrefix(c.want) {
				t.Errorf("ParseCIDR(%q) = %v, %v; want %s", c.in, p, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseCIDR(%q) = %v, %v; want an error with %q", c.in, p, err, c.err)
		}
	}
}
