package agent

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
)

// Recording the refusals of `watcher exec` commands (seccomp and Landlock
// act before any hook of ours) takes fexit programs on __secure_computing
// and the security_* functions Landlock refuses from where fexit loads,
// else the raw sys_enter/sys_exit tracepoints, which put every task of
// the host on the syscall slow path (recorder.Recorder.DenialPrograms).
// Either is attached while a command may run: from its PrepareExec, while
// any exec leaf cgroup lives, and for execIdle after both; a private agent
// (Options.RecordExecDenials) keeps them.

// execIdle is how long the recording stays after the last PrepareExec
// with no exec leaf alive: a command's leaf appears right after its
// PrepareExec, and back-to-back commands do not flap the tracepoints.
var execIdle = 10 * time.Second

// execActivity is what says a command may run.
type execActivity struct {
	lastPrepare atomic.Int64 // unix ns of the last PrepareExec
	leaves      sync.Map     // live exec leaf cgroup ids
	leafCount   atomic.Int64
}

func (a *Agent) execLeafAppeared(id uint64) {
	if _, loaded := a.exec.leaves.LoadOrStore(id, struct{}{}); !loaded {
		a.exec.leafCount.Add(1)
	}
}

func (a *Agent) execLeafGone(id uint64) {
	if _, ok := a.exec.leaves.LoadAndDelete(id); ok {
		a.exec.leafCount.Add(-1)
	}
}

// wantDenials says whether exec refusals must be recorded now.
func (a *Agent) wantDenials() bool {
	if a.opts.RecordExecDenials || a.exec.leafCount.Load() > 0 {
		return true
	}
	last := a.exec.lastPrepare.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < execIdle
}

// syncRecording attaches or detaches the recording tracepoints to match
// wantDenials and the plan's syscall stream. Turning on: tracepoints, then
// the config that makes them record; off: the other way round.
func (a *Agent) syncRecording() error {
	a.prepMu.Lock()
	defer a.prepMu.Unlock()
	a.mu.Lock()
	tc, stream := a.plan.Trace, a.plan.SyscallStream
	a.mu.Unlock()
	want := a.wantDenials()
	tc.RecordDenials = want
	opts := recorder.AttachOptions{Syscalls: stream, Denials: want}
	if want {
		if err := a.recorder.SetSyscalls(opts); err != nil {
			return err
		}
		if err := a.recorder.SetConfig(tc); err != nil {
			return err
		}
	} else {
		if err := a.recorder.SetConfig(tc); err != nil {
			return err
		}
		if err := a.recorder.SetSyscalls(opts); err != nil {
			return err
		}
	}
	if a.recorder.denialsOn.Swap(want) != want {
		progs := "syscall tracepoints"
		if a.recorder.FexitError() == nil {
			progs = "fexit programs"
		}
		msg := fmt.Sprintf("recording seccomp and Landlock refusals of watcher exec commands (%s attached)", progs)
		if !want {
			msg = fmt.Sprintf("no watcher exec command for %s: refusal recording detached (%s off)", execIdle, progs)
		}
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Message: msg})
	}
	return nil
}
