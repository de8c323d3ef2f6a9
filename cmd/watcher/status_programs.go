package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/enforce"
)

// printProgramCosts is `watcher status --programs`: what each of the
// agent's BPF programs ran in a window, as the kernel counts it.
func printProgramCosts(ctx context.Context, stdout, stderr io.Writer, pinDir string, window time.Duration, asJSON bool) error {
	if window <= 0 {
		return &exitError{Code: 2, Err: fmt.Errorf("--for must be positive, got %v", window)}
	}
	ids, err := enforce.OwnPrograms(pinDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "measuring %d programs for %v (BPF statistics on for the window only)...\n", len(ids), window)
	costs, err := enforce.MeasurePrograms(ctx, ids, window)
	if err != nil {
		return err
	}
	if asJSON {
		type row struct {
			enforce.ProgramCost
			NsPerRun float64 `json:"ns_per_run"`
		}
		rows := make([]row, len(costs))
		for i, c := range costs {
			rows[i] = row{c, c.NsPerRun()}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PROGRAM\tTYPE\tLINKS\tRUNS\tRUNS/S\tNS/RUN\tCPU %\t")
	var total time.Duration
	var runs uint64
	for _, c := range costs {
		total += c.Runtime
		runs += c.Runs
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.0f\t%.3f\t\n", c.Name, c.Type, c.Links, c.Runs,
			float64(c.Runs)/window.Seconds(), c.NsPerRun(), 100*c.Runtime.Seconds()/window.Seconds())
	}
	fmt.Fprintf(tw, "total\t\t\t%d\t%.0f\t\t%.3f\t\n", runs, float64(runs)/window.Seconds(), 100*total.Seconds()/window.Seconds())
	tw.Flush()
	fmt.Fprintln(stdout, "CPU % is of one CPU; the statistics add two clock reads to each run while on.")
	return nil
}
