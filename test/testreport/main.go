// Command testreport reads `go test -json` on standard input and prints
// what a person reading a CI log needs: each package's result line as it
// comes, the whole output of every failed test, and at the end every
// skipped test with its reason, grouped by reason (a skip is not a pass:
// the count of skips per reason is part of the result). It exits 1 when a
// test or package failed, or when the input ends in the middle of a
// package (go test killed), so it can stand at the end of a pipe.
//
// Usage: go test -json ./... | go run ./test/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

// report accumulates what is printed at the end.
type report struct {
	out       io.Writer
	output    map[key][]string // output lines per test (and per package: test "")
	skips     map[string][]string
	failed    int
	passedPkg map[string]bool
	openPkg   map[string]bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, output: map[key][]string{}, skips: map[string][]string{},
		passedPkg: map[string]bool{}, openPkg: map[string]bool{}}
}

func (r *report) add(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "start":
		r.openPkg[e.Package] = true
	case "output":
		r.output[k] = append(r.output[k], e.Output)
	case "build-output":
		fmt.Fprint(r.out, e.Output) // a compile error, as go test prints it
	case "skip":
		if e.Test != "" {
			reason := skipReason(r.output[k])
			r.skips[reason] = append(r.skips[reason], e.Package+" "+e.Test)
		}
		if e.Test == "" {
			delete(r.openPkg, e.Package)
			fmt.Fprintf(r.out, "?   \t%s\t[no test files or all skipped]\n", e.Package)
		}
		delete(r.output, k)
	case "pass":
		if e.Test == "" {
			delete(r.openPkg, e.Package)
			fmt.Fprintf(r.out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
		}
		delete(r.output, k)
	case "fail":
		r.failed++
		if e.Test != "" {
			fmt.Fprintf(r.out, "--- FAIL: %s %s (%.2fs)\n", e.Package, e.Test, e.Elapsed)
			for _, l := range r.output[k] {
				fmt.Fprint(r.out, "    ", l)
			}
		} else {
			delete(r.openPkg, e.Package)
			// The package's own output: a timeout's stack, a build error.
			for _, l := range r.output[k] {
				fmt.Fprint(r.out, l)
			}
			fmt.Fprintf(r.out, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
		}
		delete(r.output, k)
	}
}

// skipReason is the message a test gave t.Skip: the output lines between
// its === RUN and its --- SKIP line, without the file:line prefix when
// they are the test's own log lines.
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		msg = append(msg, t)
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	last := msg[len(msg)-1] // t.Skip's message is the test's last line
	if i := strings.Index(last, ": "); i > 0 && strings.Contains(last[:i], ".go:") {
		last = last[i+2:]
	}
	return last
}

// finish prints the skips and says whether everything passed.
func (r *report) finish() bool {
	reasons := make([]string, 0, len(r.skips))
	total := 0
	for reason, tests := range r.skips {
		reasons = append(reasons, reason)
		total += len(tests)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if a, b := len(r.skips[reasons[i]]), len(r.skips[reasons[j]]); a != b {
			return a > b
		}
		return reasons[i] < reasons[j]
	})
	fmt.Fprintf(r.out, "\n== skipped: %d tests and subtests, %d reasons\n", total, len(reasons))
	for _, reason := range reasons {
		tests := r.skips[reason]
		sort.Strings(tests)
		fmt.Fprintf(r.out, "%4d  %s\n", len(tests), reason)
		for _, t := range tests {
			fmt.Fprintf(r.out, "        %s\n", t)
		}
	}
	open := make([]string, 0, len(r.openPkg))
	for p := range r.openPkg {
		open = append(open, p)
	}
	sort.Strings(open)
	for _, p := range open {
		fmt.Fprintf(r.out, "FAIL\t%s\t(no result: the run ended before the package did)\n", p)
		for _, l := range r.output[key{p, ""}] {
			fmt.Fprint(r.out, l)
		}
	}
	ok := r.failed == 0 && len(open) == 0
	if ok {
		fmt.Fprintln(r.out, "== PASS")
	} else {
		fmt.Fprintf(r.out, "== FAIL: %d failed tests or packages, %d packages without a result\n", r.failed, len(open))
	}
	return ok
}

func main() {
	r := newReport(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			// Not test2json: a build error or go's own message; show it.
			fmt.Println(sc.Text())
			continue
		}
		r.add(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport: read:", err)
		os.Exit(1)
	}
	if !r.finish() {
		os.Exit(1)
	}
}
