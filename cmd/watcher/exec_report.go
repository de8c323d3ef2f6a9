package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/tail"
)

// streamSettle is how long the summary waits for a running agent's
// events after the command ends: events wait at most the reader's
// deadline (50 ms) in the ring, then pass the agent's pipeline.
const streamSettle = 250 * time.Millisecond

// refusalCollector keeps the sandbox's refusals seen during a run.
type refusalCollector struct {
	sandbox string
	mu      sync.Mutex
	events  []audit.Event
	stream  *tail.Stream
	done    chan struct{}
	// hook, when set, also gets each event kept.
	hook func(audit.Event)
}

// add keeps e when it is a refusal (or a record-mode would-refuse) in the
// run's sandbox, and reports whether it did.
func (c *refusalCollector) add(e audit.Event) bool {
	if e.Sandbox.Name != c.sandbox || e.Sandbox.Labels[audit.LabelCanary] != "" {
		return false // another sandbox's, or the canary's probes
	}
	switch e.Verdict {
	case audit.VerdictDenied, audit.VerdictKilled:
	case audit.VerdictRecorded:
		if e.Rule == "" {
			return false
		}
	default:
		return false
	}
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
	if c.hook != nil {
		c.hook(e)
	}
	return true
}

// follow reads a running agent's live events until stop.
func (c *refusalCollector) follow(path string) (stop func(), err error) {
	st, err := tail.Dial(path, tail.Filter{Sandboxes: []string{c.sandbox},
		Verdicts: []audit.Verdict{audit.VerdictDenied, audit.VerdictKilled, audit.VerdictRecorded}})
	if err != nil {
		return func() {}, err
	}
	c.stream, c.done = st, make(chan struct{})
	go func() {
		defer close(c.done)
		for {
			m, err := st.Next()
			if err != nil {
				return
			}
			if m.Event != nil {
				c.add(*m.Event)
			}
		}
	}()
	return func() { st.Close(); <-c.done }, nil
}

// settle waits for the events still on their way from a running agent.
func (c *refusalCollector) settle() {
	if c.stream != nil {
		time.Sleep(streamSettle)
	}
}

// report builds the run's report from the events of its leaf cgroup
// (events without a process, such as DNS answers, count when they carry
// the run's label or came while it ran under a private agent).
func (c *refusalCollector) report(pol *policy.Policy, sb *policy.Sandbox, v launch.Verdict, argv []string) *agent.RunReport {
	c.mu.Lock()
	var mine []audit.Event
	for _, e := range c.events {
		switch {
		case e.Process.CgroupID != 0 && e.Process.CgroupID == v.CgroupID:
		case e.Sandbox.Labels["label"] != "" && v.Label != "" && e.Sandbox.Labels["label"] == v.Label:
		case e.Process.CgroupID == 0 && c.stream == nil:
		default:
			continue
		}
		mine = append(mine, e)
	}
	c.mu.Unlock()
	wd, _ := os.Getwd()
	rep := &agent.RunReport{
		Label: v.Label, Sandbox: sb.Name, Mode: string(sb.Mode), Command: strings.Join(argv, " "),
		Outcome: string(v.Outcome), ExitCode: v.ExitCode,
		Refusals:      append(agent.Refusals(pol, sb, mine, wd), agent.MetadataRefusals(pol, sb, v.MetaRefused, v.MetaDropped)...),
		LandlockNotes: v.Applied.LandlockNotes,
	}
	if rep.Mode == "" {
		rep.Mode = string(policy.ModeEnforce)
	}
	if v.Signal != 0 {
		rep.Signal = v.Signal.String()
	}
	for _, r := range rep.Refusals {
		// An OOM kill at a limit is the kernel's, not the backstop's.
		if r.Result == "killed" && r.Operation != string(audit.KindLimit) {
			rep.Killed = true
		}
	}
	agent.SortRefusals(rep.Refusals)
	return rep
}

func writeReport(path string, rep *agent.RunReport) error {
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
