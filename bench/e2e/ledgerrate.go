package main

import (
	"fmt"
	"os"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
)

// ledgerAlone appends n records like the agent's (a sandboxed process's
// syscall events, one alert in a thousand) to a fresh ledger with the
// agent's options, in this process, and returns records/s up to the Sync
// that acknowledges them all. Run before the agent starts it is the
// ledger's own rate; run beside an agent round it is the rate the ledger
// keeps while the agent records a flood on the same cores.
func ledgerAlone(n int) (float64, error) {
	dir, err := os.MkdirTemp("", "e2e-ledger-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	l, err := ledger.Open(dir, ledger.Options{Compress: true})
	if err != nil {
		return 0, err
	}
	base := audit.Event{Kind: audit.KindSyscall, Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine,
		Mechanism: "tracepoint", Sandbox: audit.Sandbox{CgroupID: 1486699, Name: "bench"},
		Process: audit.Process{PID: 22823, TGID: 22777, PPID: 21261, Comm: "openloop", CgroupID: 1487079},
	}
	var sc audit.SyscallDetail
	start := time.Now()
	for i := 0; i < n; i++ {
		e := base
		e.Time = time.Now()
		sc = audit.SyscallDetail{Nr: int64(i % 2), Count: 2}
		e.Syscall = &sc
		if i%1000 == 999 {
			e.Verdict, e.Severity, e.Rule = audit.VerdictDenied, audit.SeverityAlert, "bench-alert"
		}
		if _, _, err := l.AppendRedacted(&e); err != nil {
			l.Close()
			return 0, err
		}
	}
	if err := l.Sync(); err != nil {
		l.Close()
		return 0, err
	}
	rate := float64(n) / time.Since(start).Seconds()
	if err := l.Close(); err != nil {
		return 0, err
	}
	return rate, nil
}

// printLedgerAlone measures and prints ledgerAlone(n).
func printLedgerAlone(what string, n int) (float64, error) {
	r, err := ledgerAlone(n)
	if err != nil {
		return 0, fmt.Errorf("ledger alone: %w", err)
	}
	fmt.Printf("ledger append alone (%s): %9.0f records/s (%d records of a fresh ledger, this process, appended and acknowledged)\n", what, r, n)
	return r, nil
}
