package egress

import "testing"

func TestProbe(t *testing.T) {
	for name, err := range Probe() {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else {
			t.Logf("%s loads", name)
		}
	}
}
