package launch

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// envSpec carries the serialized childSpec to the re-executed binary.
const envSpec = "WATCHER_LAUNCH_SPEC"

// initArg0 is argv[0] of the re-executed binary, so `ps` shows what it is
// for the instant before the exec.
const initArg0 = "watcher-launch-init"

// reportFD is the pipe on which the child reports what it applied (the
// first of exec.Cmd.ExtraFiles); goFD is the pipe on which the launcher
// lets it exec, once it has moved it into the leaf cgroup.
const (
	reportFD = 3
	goFD     = 4
)

// Exit codes of the child when it cannot start the target.
const (
	// ExitRestrictFailed: the restrictions could not be applied; the
	// target never ran.
	ExitRestrictFailed = 126
	// ExitExecFailed: the target could not be executed (missing, or not
	// executable under the Landlock ruleset).
	ExitExecFailed = 127
)

// childSpec is what the launcher passes to Init.
type childSpec struct {
	Path         string       `json:"path"`
	Args         []string     `json:"args"`
	Restrictions Restrictions `json:"restrictions"`
	// Mounts are made in the child's own mount namespace first.
	Mounts []Mount `json:"mounts,omitempty"`
	// InProcess runs the function set with SetInProcess instead of
	// exec'ing Path (Config.InProcess).
	InProcess bool `json:"in_process,omitempty"`
	// Namespaces are the child's own namespaces (Isolation.Namespaces);
	// with CLONE_NEWPID the child is PID 1 and starts the command as
	// PID 2 (runAsInit).
	Namespaces uintptr `json:"namespaces,omitempty"`
}

// inProcess is what a child with InProcess runs in place of the exec.
var inProcess func() int

// SetInProcess sets the function a launched child runs, on its locked
// restricted thread inside the leaf cgroup, instead of exec'ing a command
// (Config.InProcess; the canary's probes). Its result is the exit status.
// Call it from a package initialiser, before Init.
func SetInProcess(f func() int) { inProcess = f }

func encodeSpec(s childSpec) (string, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encode launch spec: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func decodeSpec(v string) (childSpec, error) {
	var s childSpec
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return s, fmt.Errorf("decode launch spec: %w", err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("decode launch spec: %w", err)
	}
	if s.Path == "" || len(s.Args) == 0 {
		return s, fmt.Errorf("decode launch spec: no command")
	}
	return s, nil
}

// IsChild reports whether this process was started by the launcher to
// apply restrictions, or to reap a leaf (Init will not return).
func IsChild() bool { return os.Getenv(envSpec) != "" || os.Getenv(envReaper) != "" }

// Init must be called first thing in main (and in TestMain of tests that
// launch commands). In a process started by the launcher it applies
// no_new_privs, the Landlock ruleset and the seccomp filters and execs the
// target; it never returns there. Anywhere else it returns at once.
//
// In a leaf's reaper (startReaper) it waits for the launcher to go, cleans
// up what it left, and exits.
func Init() {
	initCalled = true
	if leaf := os.Getenv(envReaper); leaf != "" {
		reap(leaf)
	}
	v := os.Getenv(envSpec)
	if v == "" {
		return
	}
	os.Unsetenv(envSpec)
	report := os.NewFile(reportFD, "launch-report")
	fail := func(code int, applied Applied, err error) {
		applied.Error = err.Error()
		if report != nil {
			json.NewEncoder(report).Encode(applied)
		}
		fmt.Fprintf(os.Stderr, "watcher launch: %v\n", err)
		os.Exit(code)
	}
	spec, err := decodeSpec(v)
	if err != nil {
		fail(ExitRestrictFailed, Applied{}, err)
	}
	// Everything below happens on this one thread, which then execs:
	// no_new_privs, the Landlock domain and seccomp filters are per
	// thread and pass across execve to the target and its descendants.
	runtime.LockOSThread()
	// The command must not inherit the agent's protection from the OOM
	// killer (the agent lowers its own oom_score_adj; so does its systemd
	// unit): raised back to 0 here, which needs no privilege and comes
	// before Landlock could refuse the write.
	if err := resetOOMScore(); err != nil {
		fail(ExitRestrictFailed, Applied{}, err)
	}
	if err := applyMounts(spec.Mounts); err != nil {
		fail(ExitRestrictFailed, Applied{}, err)
	}
	asInit := spec.Namespaces&unix.CLONE_NEWPID != 0 && !spec.InProcess
	if asInit && spec.Restrictions.Files != nil {
		// The command is this process's child: /proc/self of this
		// process would not be its own. The fresh /proc shows only the
		// namespace's processes.
		spec.Restrictions.Files.ReadOnly = procSelfToProc(spec.Restrictions.Files.ReadOnly)
	}
	applied, err := applyRestrictions(spec.Restrictions)
	if err != nil {
		fail(ExitRestrictFailed, applied, err)
	}
	applied.Namespaces = nsNames(spec.Namespaces)
	if err := json.NewEncoder(report).Encode(applied); err != nil {
		fail(ExitRestrictFailed, applied, fmt.Errorf("report: %w", err))
	}
	if asInit {
		// Kept for the command's status; the command does not get it.
		unix.CloseOnExec(reportFD)
	} else {
		unix.Close(reportFD)
	}
	// Wait until the launcher has moved this process into the sandbox's
	// leaf cgroup. This binary's package initialisers ran before Init
	// (cilium/ebpf probes bpf(), for one); they must not run inside the
	// sandbox, where the kill backstop would take them for the command.
	var b [1]byte
	if n, _ := unix.Read(goFD, b[:]); n != 1 {
		os.Exit(ExitRestrictFailed) // the launcher gave up
	}
	unix.Close(goFD)
	// The launcher holds its own copy of the metadata listener now: the
	// command must not (it could answer its own calls).
	if applied.MetaNotifyFD > 0 {
		unix.Close(applied.MetaNotifyFD)
	}
	if spec.InProcess {
		if inProcess == nil {
			fmt.Fprintln(os.Stderr, "watcher launch: no in-process function in this binary")
			os.Exit(ExitExecFailed)
		}
		os.Exit(inProcess())
	}
	if asInit {
		runAsInit(spec.Path, spec.Args, os.Environ(), report)
	}
	err = syscall.Exec(spec.Path, spec.Args, os.Environ())
	// The report already went out; say why on stderr and exit.
	fmt.Fprintf(os.Stderr, "watcher launch: exec %s: %v\n", spec.Path, err)
	os.Exit(ExitExecFailed)
}

// applyRestrictions puts the restrictions in force on the calling
// (locked) thread.
func applyRestrictions(r Restrictions) (Applied, error) {
	var applied Applied
	filters, denied, err := seccompFilters(r.Seccomp)
	if err != nil {
		return applied, err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return applied, fmt.Errorf("set no_new_privs: %w", err)
	}
	applied.NoNewPrivs = true
	if err := restrictLandlock(r.Files, !r.NoIPCScope, &applied); err != nil {
		return applied, err
	}
	// After Landlock, whose setup opens the paths it grants (with
	// CAP_DAC_* still held), and before seccomp.
	if r.Capabilities != nil {
		held, err := dropCapabilities(*r.Capabilities)
		if err != nil {
			return applied, err
		}
		applied.CapsReduced, applied.Capabilities = true, held
	}
	// seccomp last: the filter refuses nothing Landlock setup needs, but
	// keeping it last means a failure above leaves no half-applied filter
	// in an error path.
	if err := loadSeccomp(filters); err != nil {
		return applied, err
	}
	applied.SeccompDenied = denied
	applied.ArchGuard = true
	// Metadata changes Landlock has no right for go to the launcher's
	// supervisor wherever Landlock confines writes (metanotify.go).
	if r.Files != nil {
		fd, names, err := installMetaNotify()
		if err != nil {
			return applied, err
		}
		applied.MetaNotify, applied.MetaNotifyFD = names, fd
	}
	return applied, nil
}

// procSelfToProc replaces a /proc/self rule by /proc.
func procSelfToProc(paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		if p == "/proc/self" {
			p = "/proc"
		}
		out = append(out, p)
	}
	return out
}

// specEnv returns env without any launcher variable, plus the spec.
func specEnv(env []string, spec string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, envSpec+"=") {
			out = append(out, e)
		}
	}
	return append(out, envSpec+"="+spec)
}

// resetOOMScore raises a negative oom_score_adj of this process to 0.
func resetOOMScore() error {
	const file = "/proc/self/oom_score_adj"
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read oom_score_adj: %w", err)
	}
	if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || v >= 0 {
		return nil
	}
	if err := os.WriteFile(file, []byte("0"), 0); err != nil {
		return fmt.Errorf("reset oom_score_adj: %w", err)
	}
	return nil
}
