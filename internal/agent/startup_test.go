package agent

import (
	"testing"
	"time"
)

func TestFormatStartup(t *testing.T) {
	got := FormatStartup([]StartupStage{{"open sinks", 3 * time.Millisecond}, {"load backstop", 1500 * time.Millisecond},
		{"plan", 20 * time.Millisecond}})
	if want := "1.523s (load backstop 1.5s, plan 20ms)"; got != want {
		t.Errorf("FormatStartup: %q, want %q", got, want)
	}
	c := newStartupClock(time.Now().Add(-time.Second))
	c.done("a")
	c.done("b")
	if len(c.stages) != 2 || c.stages[0].Took < time.Second || c.stages[1].Took >= time.Second {
		t.Errorf("stages %+v: want a >= 1s (since the clock's start), b short", c.stages)
	}
}
