package backstop_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// subtreeRules turns on every own-subtree and host-state check.
func subtreeRules(r *backstoprules.Rules) {
	kill := backstoprules.Rule{Action: enforce.ActionKill, ID: 25}
	r.OtherTask, r.TTYInject, r.NetConfig, r.ClockAdjust = kill, kill, kill, kill
	r.Namespaces, r.Syslog, r.Quota = kill, kill, kill
	r.CapUse = map[int]backstoprules.Rule{12: kill, 25: kill}
	for _, name := range []string{"settimeofday", "clock_settime", "sethostname", "setdomainname", "fanotify_init"} {
		r.Syscalls = append(r.Syscalls, backstoprules.SyscallRule{Name: name, Rule: kill})
	}
}

// groupDecoy is a process outside every sandbox, leader of its own process
// group, in a network namespace of its own.
func groupDecoy(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("unshare", "-n", "sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// TestOwnSubtree: from a sandbox (placed as a runtime would: root in the
// host's namespaces), each technique reaching a process outside the
// sandbox's cgroup subtree, a terminal, or host-wide state is killed and
// recorded with its category; its benign neighbour runs. Targets are
// harmless: signal 0 or SIGCONT to a decoy, limits and priorities set to
// what they are, calls that fail after the checks.
func TestOwnSubtree(t *testing.T) {
	f := newFixture(t, subtreeRules)
	decoyPID := groupDecoy(t)
	d := strconv.Itoa(decoyPID)
	killed := []struct {
		name, op string
		args     []string
		category string
	}{
		{"kill", "sig", []string{d, "0"}, "other_process"},
		{"kill_all", "sig", []string{"-1", "0"}, "other_process"},
		{"kill_group", "sig", []string{"-" + d, "18"}, "other_process"},
		{"tgkill", "tgkill", []string{d, d, "0"}, "other_process"},
		{"pidfd_open", "pidfdopen", []string{d}, "other_process"},
		{"pidfd_send_signal_procfd", "procfdsig", []string{d, "0"}, "other_process"},
		{"prlimit", "prlimit", []string{d}, "other_process"},
		{"setpriority", "setprio", []string{"0", d}, "other_process"},
		{"setpriority_user", "setprio", []string{"2", "0"}, "other_process"},
		{"ioprio_set", "ioprio", []string{"1", d}, "other_process"},
		{"sched_setaffinity", "affinity", []string{d}, "other_process"},
		{"kcmp", "kcmp", []string{d}, "other_process"},
		{"f_setown", "setown", []string{d}, "other_process"},
		{"f_setown_ex", "setownex", []string{d}, "other_process"},
		{"fiosetown", "fiosetown", []string{d}, "other_process"},
		{"tiocsti", "tiocsti", nil, "tty_inject"},
		{"tioclinux", "tioclinux", nil, "tty_inject"},
		{"settimeofday", "settimeofday", nil, ""},
		{"clock_settime", "clock_settime_mono", nil, ""},
		{"adjtimex_status", "adjtimex", []string{"16"}, "clock_adjust"},
		{"sethostname", "sethostname_long", nil, ""},
		{"fanotify_init", "fanotify_init", nil, ""},
		{"unshare_uts", "unshare", []string{strconv.Itoa(syscall.CLONE_NEWUTS)}, "namespaces"},
		{"setns_foreign", "setns", []string{fmt.Sprintf("/proc/%d/ns/net", decoyPID)}, "namespaces"},
		{"syslog_console_on", "syslog", []string{"7"}, "syslog"},
		{"quotaon", "quotaon_missing", nil, "quota"},
		{"siocsifflags", "siocsifflags_missing", nil, "net_config"},
		{"rtnetlink_newaddr", "rtm_newaddr_missing", nil, "capability_used"},
	}
	for _, c := range killed {
		t.Run(c.name, func(t *testing.T) {
			r := f.run(t, f.sandbox, c.op, c.args...)
			f.expectKilled(t, r, func(ev audit.Event) error {
				if c.category != "" && !strings.Contains(ev.Message, "category="+c.category) {
					return fmt.Errorf("message %q, want category %s", ev.Message, c.category)
				}
				return nil
			})
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", decoyPID)); err != nil {
				t.Fatalf("decoy died: %v", err)
			}
		})
	}
	benign := []struct {
		name, op string
		args     []string
	}{
		{"own_signals", "ownsignals", nil},
		{"prlimit_self", "prlimit", []string{"0"}},
		{"prlimit_own_pid", "prlimit", []string{"self"}}, // judged by lookup, not pid 0
		{"setpriority_self", "setprio", []string{"0", "0"}},
		{"ioprio_self", "ioprio", []string{"1", "0"}},
		{"affinity_self", "affinity", []string{"0"}},
		{"tiocgwinsz", "tiocgwinsz", nil},
		{"clock_gettime", "clock_gettime", nil},
		{"adjtimex_read", "adjtimex", []string{"0"}},
		{"uname", "uname", nil},
		{"setns_own", "setns", []string{"/proc/self/ns/uts"}},
		{"syslog_size", "syslog", []string{"10"}},
		{"siocgifconf", "siocgifconf", nil},
	}
	// Without the capability the kernel refuses (EPERM): nothing to kill.
	for _, c := range []struct{ name, op string }{{"settimeofday", "settimeofday"}, {"sethostname", "sethostname_long"},
		{"adjtimex", "adjtimex"}, {"siocsifflags", "siocsifflags_missing"}, {"syslog", "syslog"}} {
		t.Run("nocap_"+c.name, func(t *testing.T) {
			args := []string{c.op}
			switch c.op {
			case "adjtimex":
				args = append(args, "16")
			case "syslog":
				args = append(args, "7")
			}
			r := f.run(t, f.sandbox, "nocap", args...)
			if r.killed || !strings.Contains(r.out, "operation not permitted") {
				t.Fatalf("killed=%v err=%v, want EPERM from the kernel, output:\n%s", r.killed, r.err, r.out)
			}
		})
	}
	for _, c := range benign {
		t.Run(c.name, func(t *testing.T) {
			r := f.run(t, f.sandbox, c.op, c.args...)
			if r.killed || r.err != nil || !strings.Contains(r.out, "result: <nil>") {
				t.Fatalf("killed=%v err=%v, output:\n%s", r.killed, r.err, r.out)
			}
			if evs := f.eventsOf(r.pid); len(evs) != 0 {
				t.Errorf("events: %+v", evs)
			}
		})
	}
}
