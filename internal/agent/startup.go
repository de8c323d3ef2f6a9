package agent

import (
	"fmt"
	"strings"
	"time"
)

// StartupStage is one step of the agent's start and how long it took.
type StartupStage struct {
	// Name says what the step does ("load backstop").
	Name string
	// Took is its wall time.
	Took time.Duration
}

// startupClock times Start step by step, so a slow start (BPF loads under
// emulation take tens of seconds) says where its time went.
type startupClock struct {
	last   time.Time
	stages []StartupStage
}

func newStartupClock(t time.Time) *startupClock { return &startupClock{last: t} }

// done ends the step that ran since the last call.
func (c *startupClock) done(name string) {
	now := time.Now()
	c.stages = append(c.stages, StartupStage{Name: name, Took: now.Sub(c.last)})
	c.last = now
}

// Startup returns the steps of the agent's start, in order.
func (a *Agent) Startup() []StartupStage { return a.startup.stages }

// FormatStartup renders stages as one line: "total (step time, ...)",
// leaving out steps under 10 ms.
func FormatStartup(stages []StartupStage) string {
	var total time.Duration
	var parts []string
	for _, s := range stages {
		total += s.Took
		if s.Took >= 10*time.Millisecond {
			parts = append(parts, fmt.Sprintf("%s %s", s.Name, s.Took.Round(time.Millisecond)))
		}
	}
	return fmt.Sprintf("%s (%s)", total.Round(time.Millisecond), strings.Join(parts, ", "))
}
