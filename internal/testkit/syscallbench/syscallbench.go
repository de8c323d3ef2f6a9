// Package syscallbench is the measured workload of watcher's syscall-cost
// benchmarks (bench/syscall, make bench-vm's TestBenchVM, TestAgentTax): a
// loop of openat+close, stat and getpid run in a child process, its result
// as one line of output, and the medians of interleaved rounds.
//
// It links only golang.org/x/sys/unix: the loop runs inside sandboxes,
// where the kill backstop answers bpf(2) (which cilium/ebpf's package
// initialisers call) with SIGKILL.
package syscallbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ops are the measured operations, in the order tables print them.
var Ops = []string{"openat+close", "stat", "getpid"}

// Result is nanoseconds per operation, keyed by the names in Ops.
type Result map[string]float64

// atFDCWD is AT_FDCWD (-100) as a raw syscall argument.
var atFDCWD = uintptr(^uint64(99))

// Loop runs each operation iters times on file (after iters/10 warm-up
// rounds) with raw syscalls and returns ns/op.
func Loop(iters int, file string) (Result, error) {
	path, err := unix.BytePtrFromString(file)
	if err != nil {
		return nil, fmt.Errorf("loop file %q: %w", file, err)
	}
	p := uintptr(unsafe.Pointer(path))
	var st unix.Stat_t
	res := Result{}
	run := func(name string, f func()) { res[name] = NsPerOp(iters, f) }
	run("openat+close", func() {
		fd, _, _ := unix.RawSyscall6(unix.SYS_OPENAT, atFDCWD, p, unix.O_RDONLY, 0, 0, 0)
		unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	})
	run("stat", func() {
		unix.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, p, uintptr(unsafe.Pointer(&st)), 0, 0, 0)
	})
	run("getpid", func() { unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0) })
	return res, nil
}

// NsPerOp runs f iters times (after iters/10 warm-up runs) and returns
// the nanoseconds per run.
func NsPerOp(iters int, f func()) float64 {
	for i := 0; i < iters/10; i++ {
		f()
	}
	start := time.Now()
	for i := 0; i < iters; i++ {
		f()
	}
	return float64(time.Since(start).Nanoseconds()) / float64(iters)
}

// linePrefix marks the result line among whatever else the child prints
// (a test binary prints its own lines).
const linePrefix = "LOOP "

// Write prints res as the child's result line.
func Write(w io.Writer, res Result) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", linePrefix, b)
	return err
}

// Parse finds the result line Write printed in a child's output.
func Parse(out []byte) (Result, error) {
	for _, line := range bytes.Split(out, []byte("\n")) {
		if s, ok := bytes.CutPrefix(line, []byte(linePrefix)); ok {
			var res Result
			if err := json.Unmarshal(s, &res); err != nil {
				return nil, fmt.Errorf("loop result %q: %w", s, err)
			}
			return res, nil
		}
	}
	return nil, fmt.Errorf("no loop result in the output %q", out)
}

// Rounds collects results per state (a configuration: bare, under an
// agent, ...) in the order the states were first measured.
type Rounds struct {
	order []string
	res   map[string][]Result
}

// Add records one round of state.
func (r *Rounds) Add(state string, res Result) {
	if r.res == nil {
		r.res = map[string][]Result{}
	}
	if _, ok := r.res[state]; !ok {
		r.order = append(r.order, state)
	}
	r.res[state] = append(r.res[state], res)
}

// States returns the states in the order first measured.
func (r *Rounds) States() []string { return r.order }

// Median is the median ns/op of op over the rounds of state (0 for none).
func (r *Rounds) Median(state, op string) float64 {
	var v []float64
	for _, m := range r.res[state] {
		v = append(v, m[op])
	}
	return Median(v)
}

// Ratios are the per-round ratios of op in state to op in base: round i
// of state over round i of base, for as many rounds as both have. Rounds
// that alternate the two states pair each measurement with the baseline
// taken next to it, so slow drift of the machine cancels.
func (r *Rounds) Ratios(state, base, op string) []float64 {
	s, b := r.res[state], r.res[base]
	var v []float64
	for i := 0; i < len(s) && i < len(b); i++ {
		v = append(v, s[i][op]/b[i][op])
	}
	return v
}

// Median returns the median of v (0 for none).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// Iterations is the loop's iteration count: WATCHER_BENCH_ITERS when it
// is a positive number, else def.
func Iterations(def int) int {
	if v, err := strconv.Atoi(os.Getenv("WATCHER_BENCH_ITERS")); err == nil && v > 0 {
		return v
	}
	return def
}

// KernelRelease is the running kernel's release ("?" where uname fails).
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}
