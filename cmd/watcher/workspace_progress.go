package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/workspace"
)

// progressQuiet is how long work runs before progress is shown when
// stderr is not a terminal (a log): short work prints nothing.
const progressQuiet = 2 * time.Second

// progressPrinter shows a workspace operation's progress on stderr: on a
// terminal one line rewritten in place (the workspace package reports at
// most 4 times a second), elsewhere a line every 2 s once the work took
// longer than 2 s.
type progressPrinter struct {
	w       io.Writer
	tty     bool
	start   time.Time
	mu      sync.Mutex
	last    time.Time
	printed bool
}

func newProgressPrinter(w io.Writer) *progressPrinter {
	p := &progressPrinter{w: w, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

// report is a workspace.Progress func.
func (p *progressPrinter) report(pr workspace.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	line := fmt.Sprintf("%s: %d entries, %s read (%s)", pr.Op, pr.Entries, policy.FormatBytes(pr.Bytes), now.Sub(p.start).Truncate(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", line)
		p.printed = true
		return
	}
	if now.Sub(p.start) < progressQuiet || now.Sub(p.last) < progressQuiet {
		return
	}
	p.last = now
	fmt.Fprintln(p.w, line)
}

// done ends the progress line on a terminal.
func (p *progressPrinter) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.printed {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.printed = false
	}
}
