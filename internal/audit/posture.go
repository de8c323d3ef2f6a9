package audit

// KindPosture records the hardening of a container or sandbox cgroup as
// the kernel reports it, when the cgroup joins a sandbox and whenever it
// changes; an alert when it lacks an item the sandbox requires.
const KindPosture Kind = "posture"

// Posture is the hardening of the processes in one cgroup (and its
// descendants), read from /proc and the cgroup files. Every field is the
// weakest value over all threads of all processes: a capability any thread
// holds counts, no_new_privs counts only if every thread has it.
type Posture struct {
	// Cgroup is the cgroup2 path relative to the hierarchy root.
	Cgroup string `json:"cgroup"`
	// Container is the container id the cgroup's name carries, if any.
	Container string `json:"container,omitempty"`
	// Procs and Threads are how many were read; 0 procs means the fields
	// below say nothing (an empty cgroup).
	Procs   int `json:"procs"`
	Threads int `json:"threads"`
	// CapEff and CapBnd are the union of the effective and bounding
	// capability sets (bit n = capability n).
	CapEff uint64 `json:"cap_eff"`
	CapBnd uint64 `json:"cap_bnd"`
	// NoNewPrivs: every thread has no_new_privs set.
	NoNewPrivs bool `json:"no_new_privs"`
	// Seccomp is the weakest seccomp mode: disabled, strict or filter.
	Seccomp string `json:"seccomp"`
	// UserNS: every process is in a user namespace other than the host's.
	// UIDMap is the first such process's uid_map, one "inside outside
	// count" triple per line joined by ", ".
	UserNS bool   `json:"user_ns"`
	UIDMap string `json:"uid_map,omitempty"`
	// RootUser: some thread has effective uid 0 as the host sees it.
	RootUser bool `json:"root_user"`
	// Root, Tmp and Workspace are the mounts holding /, /tmp and each
	// workspace directory in the processes' own mount namespaces.
	Root      MountPosture   `json:"root"`
	Tmp       MountPosture   `json:"tmp"`
	Workspace []MountPosture `json:"workspace,omitempty"`
	// Limits are the loosest resource limits over the processes' cgroups
	// (each cgroup's own or its nearest limiting ancestor's).
	Limits LimitsPosture `json:"limits"`
	// Missing lists the sandbox's required items this cgroup lacks.
	Missing []string `json:"missing,omitempty"`
	// Errors lists what could not be read (a process that vanished while
	// being read is skipped silently).
	Errors []string `json:"errors,omitempty"`
}

// MountPosture is the mount that holds a path, as the processes see it.
// The flags are those of the weakest such mount over the mount namespaces.
type MountPosture struct {
	Path string `json:"path"`
	// Mount is the mount point and FSType the filesystem type (from the
	// first process's mountinfo).
	Mount    string `json:"mount,omitempty"`
	FSType   string `json:"fstype,omitempty"`
	ReadOnly bool   `json:"ro"`
	NoExec   bool   `json:"noexec"`
	NoSuid   bool   `json:"nosuid"`
	NoDev    bool   `json:"nodev"`
	// Absent: the path does not exist for some process.
	Absent bool `json:"absent,omitempty"`
}

// LimitsPosture holds resource limits present (0: none).
type LimitsPosture struct {
	MemoryBytes int64 `json:"memory_bytes"`
	// CPUMillis is the CPU bandwidth limit in thousandths of a core.
	CPUMillis int64 `json:"cpu_millicores"`
	PIDs      int64 `json:"pids"`
}
