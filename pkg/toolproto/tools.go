package toolproto

import "time"

// FileContent is what read_file returns.
type FileContent struct {
	Path string `json:"path"`
	// Content is the text, or base64 when Encoding says so.
	Content string `json:"content"`
	// Encoding is "utf-8" or "base64" (the file is not valid UTF-8).
	Encoding string `json:"encoding"`
	// Size is the file's size; Truncated says Content stops before it.
	Size      int64  `json:"size"`
	Offset    int64  `json:"offset,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	SHA256    string `json:"sha256"` // of the bytes returned
}

// WriteResult is what write_file returns.
type WriteResult struct {
	Path    string `json:"path"`
	Bytes   int    `json:"bytes"`
	Created bool   `json:"created"`
	SHA256  string `json:"sha256"`
}

// DirEntry is one entry of list_dir.
type DirEntry struct {
	Name string `json:"name"`
	Type string `json:"type"` // file, directory, symlink, ...
	Size int64  `json:"size"`
}

// Listing is what list_dir returns.
type Listing struct {
	Path      string     `json:"path"`
	Entries   []DirEntry `json:"entries"`
	Truncated bool       `json:"truncated,omitempty"`
}

// ShellResult is what shell returns.
type ShellResult struct {
	// Outcome is watcher exec's: exited, signaled, timeout-term,
	// timeout-kill, canceled (refused and failed runs are errors).
	Outcome  string `json:"outcome"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// StdoutBytes and StderrBytes are the full sizes; the text is cut at
	// the sandbox's max_output_bytes.
	StdoutBytes     int64 `json:"stdout_bytes"`
	StderrBytes     int64 `json:"stderr_bytes"`
	StdoutTruncated bool  `json:"stdout_truncated,omitempty"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty"`
	// Refusals are watcher exec's report of what the layers refused during
	// the run, from the kernel events labelled with the call id.
	Refusals []Refusal `json:"refusals"`
	// RefusalSummary says in one line what was refused and why.
	RefusalSummary string `json:"refusal_summary,omitempty"`
	// KilledByBackstop says a process was killed for an operation no
	// layer could refuse.
	KilledByBackstop bool  `json:"killed_by_backstop,omitempty"`
	DurationMS       int64 `json:"duration_ms"`
}

// Refusal is one refused operation of a run (of a shell call, or of
// `watcher exec --report`), with the policy lines that would allow it.
type Refusal struct {
	// Operation is read, write, exec, a syscall name, connect, resolve,
	// or the policy operation (ptrace, mount, ...).
	Operation string `json:"operation"`
	// Path is the file (for Landlock, the string the caller passed).
	Path string `json:"path,omitempty"`
	// Address is the network address or DNS name.
	Address string `json:"address,omitempty"`
	// Rule is the policy rule that refused it ("" when none matches: a
	// limit of the layer, see Note).
	Rule string `json:"rule,omitempty"`
	// Layer is the mechanism: landlock, seccomp, lsm, cgroup_bpf, kill
	// (the backstop), dnsproxy, egress.
	Layer string `json:"layer"`
	// Result is refused (an errno came back), killed (the backstop killed
	// the process: no layer here refuses it with an errno) or
	// would-refuse (record mode: it happened).
	Result string `json:"result"`
	// Errno is EACCES or EPERM for refusals, when known.
	Errno string `json:"errno,omitempty"`
	// Process is comm[pid] of the first occurrence.
	Process string `json:"process,omitempty"`
	// Count is how many times it happened.
	Count int `json:"count"`
	// Allow are policy lines (YAML, for the sandbox) that would allow it.
	Allow []string `json:"allow,omitempty"`
	// Note explains a refusal no policy line explains.
	Note  string    `json:"note,omitempty"`
	First time.Time `json:"first"`
}
