// Package control is the agent's root-only control socket: status for
// `watcher status` and readiness probes, thaw, reload. It speaks HTTP over
// a unix socket so it can be inspected with curl --unix-socket.
package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// DefaultSocket is the agent's control socket.
const DefaultSocket = "/run/watcher/control.sock"

// Status is the agent's health at a glance.
type Status struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Version string    `json:"version"`
	// Policy is the policy file in force ("" for the built-in default).
	Policy string `json:"policy,omitempty"`
	// Kernel lists the kernel features found.
	Kernel KernelStatus `json:"kernel"`
	// Layers says which mechanism enforces each rule on this kernel.
	Layers []Layer `json:"layers"`
	// Sandboxes with their event counts.
	Sandboxes []SandboxStatus `json:"sandboxes"`
	// Losses by stage since start.
	Losses map[string]uint64 `json:"losses"`
	Ledger LedgerStatus      `json:"ledger"`
	// Exports are the OTLP exporters' counters (agent.export).
	Exports []ExportStatus `json:"exports,omitempty"`
	// Missing lists required layers that are not available; non-empty
	// makes `watcher status` exit non-zero.
	Missing []string `json:"missing,omitempty"`
}

// ExportStatus is one OTLP exporter's counters since the agent started.
type ExportStatus struct {
	Name      string `json:"name"`
	Endpoint  string `json:"endpoint"`
	Sent      uint64 `json:"sent"`
	Queued    uint64 `json:"queued"`
	Filtered  uint64 `json:"filtered"`
	Throttled uint64 `json:"throttled"`
	Dropped   uint64 `json:"dropped"`
	Rejected  uint64 `json:"rejected"`
	Failures  uint64 `json:"failures"`
	LastError string `json:"last_error,omitempty"`
}

// KernelStatus describes what the kernel offers.
type KernelStatus struct {
	Release   string `json:"release"`
	BPFLSM    bool   `json:"bpf_lsm"`
	BPFLSMWhy string `json:"bpf_lsm_why,omitempty"`
	// LSMLayer counts the LSM layer's hooks per mechanism ("lsm": BPF
	// LSM programs, "fmod_ret": the same decisions on security_*
	// functions where BPF LSM is built but not enabled).
	LSMLayer    map[string]int `json:"lsm_layer,omitempty"`
	LSMList     string         `json:"lsm_list,omitempty"`
	Cgroup2     string         `json:"cgroup2"`
	BPFFS       string         `json:"bpffs"`
	LandlockABI int            `json:"landlock_abi"`
}

// Layer is one rule and the layer that enforces it.
type Layer struct {
	Rule      string `json:"rule"`
	Mechanism string `json:"mechanism"` // lsm, cgroup_bpf, seccomp+landlock (exec only), kill, record, none
	Note      string `json:"note,omitempty"`
}

// SandboxStatus is one sandbox.
type SandboxStatus struct {
	Name     string            `json:"name"`
	CgroupID uint64            `json:"cgroup_id"`
	Path     string            `json:"path"`
	Mode     string            `json:"mode"`
	Frozen   bool              `json:"frozen"`
	Escape   float64           `json:"escape_score"`
	Events   map[string]uint64 `json:"events"` // by verdict
	// Usage is the cgroup's resource use against the sandbox's limits.
	Usage *ResourceUsage `json:"usage,omitempty"`
	// Posture is the cgroup's hardening as last recorded in the ledger
	// (nil before the first record), with the sandbox's required items it
	// lacks.
	Posture *audit.Posture `json:"posture,omitempty"`
	// Canary is the sandbox's last self-test (nil before the first);
	// failures make `watcher status` exit non-zero.
	Canary *CanaryReport `json:"canary,omitempty"`
	// Member names the container in this cgroup, when it is one:
	// container.id and, from its runtime's labels, k8s.pod.name,
	// k8s.namespace.name, k8s.container.name, k8s.pod.uid.
	Member map[string]string `json:"member,omitempty"`
}

// ResourceUsage is a sandbox cgroup's use of its limits (0 = no limit).
type ResourceUsage struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	CPULimit    float64 `json:"cpu_limit_cores,omitempty"`
	MemoryBytes int64   `json:"memory_bytes"`
	MemoryPeak  int64   `json:"memory_peak_bytes"`
	MemoryLimit int64   `json:"memory_limit_bytes,omitempty"`
	PIDs        int64   `json:"pids"`
	PIDsLimit   int64   `json:"pids_limit,omitempty"`
	OOMKills    uint64  `json:"oom_kills"`
	PIDsMaxHits uint64  `json:"pids_max_hits"`
	// Mechanism says which hierarchy holds memory, cpu and pids
	// ("memory=cgroup1 cpu=cgroup1 pids=cgroup1").
	Mechanism string `json:"mechanism"`
}

// LedgerStatus is the ledger's head and last checkpoint.
type LedgerStatus struct {
	Dir            string    `json:"dir"`
	Records        uint64    `json:"records"`
	HeadSeq        uint64    `json:"head_seq"`
	HeadHash       string    `json:"head_hash"`
	LastCheckpoint time.Time `json:"last_checkpoint,omitzero"`
	WriteFailures  uint64    `json:"write_failures"`
}

// LayerSummary counts the rules each layer enforces, in order of first
// appearance: "kill=53 cgroup_bpf=5 ...".
func LayerSummary(layers []Layer) string {
	count := map[string]int{}
	var order []string
	for _, l := range layers {
		if count[l.Mechanism] == 0 {
			order = append(order, l.Mechanism)
		}
		count[l.Mechanism]++
	}
	parts := make([]string, 0, len(order))
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s=%d", m, count[m]))
	}
	return strings.Join(parts, " ")
}

// Handler is what the agent implements.
type Handler interface {
	Status() Status
	Thaw(sandbox string) error
	Reload() error
	// PrepareExec readies the agent for a `watcher exec` command (turns on
	// the recording of its seccomp and Landlock refusals).
	PrepareExec() error
}

// Recorder is implemented by agents that append events from commands
// (workspace commits, rollbacks, snapshots) to their ledger.
type Recorder interface {
	Record(e audit.Event) error
}

// Server serves the control socket.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen starts serving h on path (directory 0700, socket 0600).
func Listen(path string, h Handler) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("control socket dir: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("control socket %s: another agent is running", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(h.Status())
	})
	mux.HandleFunc("POST /thaw", func(w http.ResponseWriter, r *http.Request) {
		if err := h.Thaw(r.URL.Query().Get("sandbox")); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	mux.HandleFunc("POST /exec", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.PrepareExec(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.Reload(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	if rec, ok := h.(Recorder); ok {
		mux.HandleFunc("POST /record", func(w http.ResponseWriter, r *http.Request) {
			var e audit.Event
			if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&e); err != nil {
				http.Error(w, "decode event: "+err.Error(), http.StatusBadRequest)
				return
			}
			if err := rec.Record(e); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
			}
		})
	}
	if ck, ok := h.(Checker); ok {
		mux.HandleFunc("POST /check", func(w http.ResponseWriter, r *http.Request) {
			reps, err := ck.Check(r.URL.Query().Get("sandbox"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(reps)
		})
	}
	if hd, ok := h.(Holder); ok {
		serveHold(mux, hd)
	}
	if cp, ok := h.(Checkpointer); ok {
		mux.HandleFunc("POST /checkpoint", func(w http.ResponseWriter, _ *http.Request) {
			if err := cp.Checkpoint(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go s.srv.Serve(ln)
	return s, nil
}

// Close stops the server and removes the socket.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	os.Remove(s.ln.Addr().String())
	return err
}

// ErrAgentNotRunning is returned when nothing answers on the socket.
var ErrAgentNotRunning = errors.New("the watcher agent is not running")

// Client talks to the control socket.
type Client struct {
	path string
	http *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	return &Client{path: path, http: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}}
}

func (c *Client) do(method, url string) ([]byte, error) {
	req, _ := http.NewRequest(method, "http://watcher"+url, nil)
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (no agent at %s)", ErrAgentNotRunning, c.path)
		}
		return nil, fmt.Errorf("contact agent at %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read agent reply: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent: %s", bytesTrim(body))
	}
	return body, nil
}

func bytesTrim(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return string(b)
}

// Status fetches the agent's status.
func (c *Client) Status() (Status, error) {
	var st Status
	body, err := c.do("GET", "/status")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decode status: %w", err)
	}
	return st, nil
}

// Thaw asks the agent to thaw a frozen sandbox.
func (c *Client) Thaw(sandbox string) error {
	_, err := c.do("POST", "/thaw?sandbox="+url.QueryEscape(sandbox))
	return err
}

// PrepareExec tells the agent a `watcher exec` command is about to run.
func (c *Client) PrepareExec() error {
	_, err := c.do("POST", "/exec")
	return err
}

// Checkpointer is implemented by agents that sign a ledger checkpoint on
// request (submitted to the witnesses as any other).
type Checkpointer interface {
	Checkpoint() error
}

// Checkpoint asks the agent to sign a ledger checkpoint now.
func (c *Client) Checkpoint() error {
	_, err := c.do("POST", "/checkpoint")
	return err
}

// Reload asks the agent to reload its policy.
func (c *Client) Reload() error {
	_, err := c.do("POST", "/reload")
	return err
}

// Record asks the agent to append e to its ledger (and live tail).
func (c *Client) Record(e audit.Event) error {
	body, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	req, _ := http.NewRequest("POST", "http://watcher/record", bytes.NewReader(body))
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("contact agent at %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent: %s", bytesTrim(msg))
	}
	return nil
}

// Checker is implemented by agents that run the canary on request.
type Checker interface {
	Check(sandbox string) ([]CanaryReport, error)
}

// Check runs the canary of one sandbox ("" for all) now and returns the
// reports. A run takes seconds: the wait is up to timeout.
func (c *Client) Check(sandbox string, timeout time.Duration) ([]CanaryReport, error) {
	long := *c
	hc := *c.http
	hc.Timeout = timeout
	long.http = &hc
	body, err := long.do("POST", "/check?sandbox="+url.QueryEscape(sandbox))
	if err != nil {
		return nil, err
	}
	var reps []CanaryReport
	if err := json.Unmarshal(body, &reps); err != nil {
		return nil, fmt.Errorf("decode canary reports: %w", err)
	}
	return reps, nil
}
