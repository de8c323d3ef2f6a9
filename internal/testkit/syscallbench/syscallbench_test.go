package syscallbench

import (
	"bytes"
	"testing"
)

// TestLoopResultRoundTrip: the loop measures every op, and its result line
// is found again among other output of the child.
func TestLoopResultRoundTrip(t *testing.T) {
	res, err := Loop(200, "/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range Ops {
		if res[op] <= 0 {
			t.Errorf("%s: %v ns/op", op, res[op])
		}
	}
	var out bytes.Buffer
	out.WriteString("=== RUN   TestX\n")
	if err := Write(&out, res); err != nil {
		t.Fatal(err)
	}
	out.WriteString("PASS\n")
	got, err := Parse(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range Ops {
		if got[op] != res[op] {
			t.Errorf("%s: parsed %v, wrote %v", op, got[op], res[op])
		}
	}
	if _, err := Parse([]byte("PASS\n")); err == nil {
		t.Error("Parse found a result in output without one")
	}
}

func TestRoundsMedian(t *testing.T) {
	var r Rounds
	for _, v := range []float64{5, 1, 3} {
		r.Add("bare", Result{"getpid": v})
	}
	r.Add("agent", Result{"getpid": 7})
	if m := r.Median("bare", "getpid"); m != 3 {
		t.Errorf("median %v, want 3", m)
	}
	if s := r.States(); len(s) != 2 || s[0] != "bare" || s[1] != "agent" {
		t.Errorf("states %v, want [bare agent]", s)
	}
	if m := r.Median("none", "getpid"); m != 0 {
		t.Errorf("median of nothing %v", m)
	}
}

func TestIterations(t *testing.T) {
	t.Setenv("WATCHER_BENCH_ITERS", "")
	if n := Iterations(7); n != 7 {
		t.Errorf("unset: %d, want the default 7", n)
	}
	t.Setenv("WATCHER_BENCH_ITERS", "1200")
	if n := Iterations(7); n != 1200 {
		t.Errorf("WATCHER_BENCH_ITERS=1200: %d", n)
	}
	t.Setenv("WATCHER_BENCH_ITERS", "-3")
	if n := Iterations(7); n != 7 {
		t.Errorf("WATCHER_BENCH_ITERS=-3: %d, want the default", n)
	}
}

func TestRoundsRatios(t *testing.T) {
	var r Rounds
	for _, v := range [][2]float64{{2, 4}, {4, 4}, {1, 3}} {
		r.Add("bare", Result{"mmap": v[0]})
		r.Add("hooked", Result{"mmap": v[1]})
	}
	r.Add("hooked", Result{"mmap": 9}) // no bare round to pair with
	got := r.Ratios("hooked", "bare", "mmap")
	if len(got) != 3 || got[0] != 2 || got[1] != 1 || got[2] != 3 {
		t.Errorf("ratios %v, want [2 1 3] (round by round, the unpaired one left out)", got)
	}
	if m := Median(got); m != 2 {
		t.Errorf("median ratio %v, want 2", m)
	}
	if got := r.Ratios("hooked", "none", "mmap"); len(got) != 0 {
		t.Errorf("ratios to a state never measured: %v", got)
	}
}

func TestNsPerOp(t *testing.T) {
	n := 0
	NsPerOp(100, func() { n++ })
	if n != 110 {
		t.Errorf("f ran %d times, want 110 (100 timed after 10 warm-up runs)", n)
	}
}
