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
