package policy

import (
	"fmt"
	"regexp"
	"strconv"
)

// Tool names the gateway knows. A rule naming another tool is an error.
const (
	ToolReadFile  = "read_file"
	ToolWriteFile = "write_file"
	ToolListDir   = "list_dir"
	ToolShell     = "shell"
)

// ToolNames lists the tools a rule may name.
func ToolNames() []string { return []string{ToolReadFile, ToolWriteFile, ToolListDir, ToolShell} }

// ToolAction is what the gateway does with a call of a tool.
type ToolAction string

// Tool actions.
const (
	// ToolAllow runs the call.
	ToolAllow ToolAction = "allow"
	// ToolDeny refuses it with a typed error (also what happens to a tool
	// no rule names: the list is default-deny).
	ToolDeny ToolAction = "deny"
	// ToolAsk holds the call until a human approves it (`watcher approve`)
	// or denies it; without an answer within AskTimeout it is denied.
	ToolAsk ToolAction = "ask"
)

// Tools configures the tool-call gateway of a sandbox: a JSON-RPC socket
// at SOCKET_DIR/sandboxes/NAME/tools.sock through which an agent asks to
// run tools. Tools no rule names are refused.
type Tools struct {
	// Enabled serves the gateway socket for this sandbox.
	Enabled bool `yaml:"enabled"`
	// Socket sets the owner and mode of the socket (and of its directory),
	// so only the sandbox's own agent process can reach it.
	Socket ToolSocket `yaml:"socket"`
	// Rules list the tools the sandbox may call. The first rule naming a
	// tool wins, so a sandbox's own rules override its preset's.
	Rules []ToolRule `yaml:"rules"`
	// MaxRequestBytes caps one JSON-RPC frame (a line); a longer frame is
	// answered with an error and its connection closed.
	MaxRequestBytes int `yaml:"max_request_bytes"`
	// MaxArgumentBytes caps the arguments of one call (also the content of
	// write_file and exchange.put).
	MaxArgumentBytes int `yaml:"max_argument_bytes"`
	// MaxOutputBytes caps what a call returns: file contents, each of a
	// shell command's stdout and stderr (the rest is cut and flagged).
	MaxOutputBytes int `yaml:"max_output_bytes"`
	// Rate is the sandbox's budget of calls per second; 0 means unlimited.
	Rate float64 `yaml:"rate"`
	// Burst is how many calls may come at once within the rate.
	Burst int `yaml:"burst"`
	// MaxInFlight caps the calls one connection has running at a time.
	MaxInFlight int `yaml:"max_in_flight"`
	// AskTimeout is how long an `ask` call waits for a human; then it is
	// denied.
	AskTimeout Duration `yaml:"ask_timeout"`
	// ShellTimeout caps a shell call (its kill stage); 0 means the
	// sandbox's exec.timeouts.
	ShellTimeout Duration `yaml:"shell_timeout"`
	// FollowSymlinks lets file tools follow symbolic links that stay inside
	// the workspace (the kernel refuses any that leave it either way).
	FollowSymlinks bool `yaml:"follow_symlinks"`
	// Exchange is the directory shared with collaborating sandboxes.
	Exchange Exchange `yaml:"exchange"`
	// MCP rules the tools of MCP servers wrapped by `watcher mcp wrap`.
	MCP MCPTools `yaml:"mcp"`
}

// ToolSocket sets the gateway socket's ownership.
type ToolSocket struct {
	// Mode is the socket's permission bits in octal ("0600", "0660").
	Mode string `yaml:"mode"`
	// UID owns the socket (0: root).
	UID int `yaml:"uid"`
	// GID is the socket's group (0: root).
	GID int `yaml:"gid"`
}

// FileMode parses Mode (default 0600).
func (s ToolSocket) FileMode() (uint32, error) {
	if s.Mode == "" {
		return 0o600, nil
	}
	m, err := strconv.ParseUint(s.Mode, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("%q is not an octal permission mode (want e.g. \"0660\")", s.Mode)
	}
	return uint32(m), nil
}

// ToolRule allows, denies or asks for one tool.
type ToolRule struct {
	// Tool is read_file, write_file, list_dir or shell.
	Tool string `yaml:"tool"`
	// Action is allow, deny or ask.
	Action ToolAction `yaml:"action"`
	// Name labels the rule in the ledger; defaults to "tool:<tool>".
	Name string `yaml:"name"`
}

// RuleName is the rule's name in records.
func (r ToolRule) RuleName() string {
	if r.Name != "" {
		return r.Name
	}
	return "tool:" + r.Tool
}

// Exchange configures exchange.put and exchange.get: messages between
// collaborating sandboxes pass through a shared directory that is
// read-only inside each sandbox and written only by the gateway, after it
// checked the content. What another agent wrote is untrusted input.
type Exchange struct {
	// Dir is the shared directory; empty disables the exchange methods.
	Dir string `yaml:"dir"`
	// MaxBytes caps one message.
	MaxBytes int `yaml:"max_bytes"`
	// Types lists the accepted content types: text (UTF-8 without control
	// characters other than tab and newlines) and json (a valid JSON
	// document, for names ending in .json).
	Types []string `yaml:"types"`
	// Patterns are regular expressions of suspicious content (shell
	// pipelines from the network, credential paths, eval/exec payloads).
	Patterns []ExchangePattern `yaml:"patterns"`
	// OnMatch is what a message matching a pattern gets: deny or ask.
	OnMatch ToolAction `yaml:"on_match"`
}

// ExchangePattern is one suspicious-content pattern.
type ExchangePattern struct {
	// Name labels the pattern in refusals and the ledger.
	Name string `yaml:"name"`
	// Regex is a Go regular expression (RE2 syntax).
	Regex string `yaml:"regex"`
}

// Tool returns the rule that decides calls of tool, or nil when none does
// (the call is denied).
func (t *Tools) Tool(tool string) *ToolRule {
	for i := range t.Rules {
		if t.Rules[i].Tool == tool {
			return &t.Rules[i]
		}
	}
	return nil
}

func (c *checker) tools(at path, t *Tools) {
	if _, err := t.Socket.FileMode(); err != nil {
		c.add(at.key("socket", "mode"), "%v", err)
	}
	if t.Socket.UID < 0 || t.Socket.GID < 0 {
		c.add(at.key("socket"), "uid and gid must not be negative")
	}
	for i, r := range t.Rules {
		ra := at.key("rules").idx(i)
		known := false
		for _, n := range ToolNames() {
			known = known || r.Tool == n
		}
		if !known {
			c.add(ra.key("tool"), "%q: unknown tool (want one of %v)", r.Tool, ToolNames())
		}
		c.toolAction(ra.key("action"), r.Action, true)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max_request_bytes", t.MaxRequestBytes}, {"max_argument_bytes", t.MaxArgumentBytes},
		{"max_output_bytes", t.MaxOutputBytes}, {"burst", t.Burst}, {"max_in_flight", t.MaxInFlight}} {
		if f.v < 0 {
			c.add(at.key(f.name), "must not be negative")
		}
	}
	if t.Rate < 0 {
		c.add(at.key("rate"), "must not be negative")
	}
	c.duration(at.key("ask_timeout"), t.AskTimeout)
	c.duration(at.key("shell_timeout"), t.ShellTimeout)
	ex := at.key("exchange")
	if t.Exchange.Dir != "" {
		c.absPath(ex.key("dir"), t.Exchange.Dir, true)
	}
	if t.Exchange.MaxBytes < 0 {
		c.add(ex.key("max_bytes"), "must not be negative")
	}
	for i, ty := range t.Exchange.Types {
		if ty != "text" && ty != "json" {
			c.add(ex.key("types").idx(i), "%q: want text or json", ty)
		}
	}
	for i, p := range t.Exchange.Patterns {
		if _, err := regexp.Compile(p.Regex); err != nil {
			c.add(ex.key("patterns").idx(i).key("regex"), "%v", err)
		}
		if p.Name == "" {
			c.add(ex.key("patterns").idx(i).key("name"), "required")
		}
	}
	if a := t.Exchange.OnMatch; a != "" && a != ToolDeny && a != ToolAsk {
		c.add(ex.key("on_match"), "%q: want deny or ask", a)
	}
	c.mcpTools(at.key("mcp"), &t.MCP)
}

func (c *checker) toolAction(at path, a ToolAction, required bool) {
	switch a {
	case ToolAllow, ToolDeny, ToolAsk:
	case "":
		if required {
			c.add(at, "required (allow, deny or ask)")
		}
	default:
		c.add(at, "%q: want allow, deny or ask", a)
	}
}

// exchangeRule keeps the exchange directory read-only inside the sandbox:
// only the gateway writes there, after checking the content.
func exchangeRule(sb *Sandbox) {
	d := sb.Tools.Exchange.Dir
	if d == "" {
		return
	}
	r := FileRule{Name: "exchange-read-only", Path: d + "/", Match: MatchPrefix, Access: AccessWrite, Action: ActionBlock}
	for _, f := range sb.Files {
		if f == r {
			return
		}
	}
	sb.Files = append(sb.Files, r)
}
