package main

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/tail"
)

// tailLedger prints the ledger's records that pass f; with follow it keeps
// polling for new records (rereading from the start but printing only
// sequence numbers not seen yet, so rotation and compression do not matter).
func tailLedger(ctx context.Context, dir string, follow bool, f *tail.Filter, print func(*audit.Event) error) error {
	var next uint64 // first sequence number not printed yet
	for {
		r, err := ledger.NewReader(dir)
		if err != nil && !follow {
			return err
		}
		if err == nil {
			for {
				rec, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					// A writer may be mid-append at the tail: retry on the next poll.
					if follow {
						break
					}
					r.Close()
					return err
				}
				if rec.Seq < next {
					continue
				}
				next = rec.Seq + 1
				if f.Match(&rec.Event) {
					if err := print(&rec.Event); err != nil {
						r.Close()
						return err
					}
				}
			}
			r.Close()
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}
