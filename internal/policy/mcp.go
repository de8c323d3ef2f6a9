package policy

import (
	"encoding/json"
	"fmt"
	pathpkg "path"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// MCPTools are the rules for the tools of third-party MCP servers run under
// `watcher mcp wrap` in this sandbox. The tools are the server's, so rules
// name them as the server does (or with a glob, "*" for all); the first rule
// whose tool matches decides, and a tool no rule matches is refused. With no
// rules at all every tool is allowed (the kernel cage and tool pinning still
// hold): the wrapper is a drop-in before it is a policy.
type MCPTools struct {
	// Rules decide the calls, first match wins.
	Rules []MCPToolRule `yaml:"rules"`
	// MaxArgumentBytes caps the arguments of one call (default 256 KiB).
	MaxArgumentBytes int `yaml:"max_argument_bytes"`
	// MaxResultBytes caps what one call returns to the client: longer text
	// is cut and the cut is said in the result (default 256 KiB).
	MaxResultBytes int `yaml:"max_result_bytes"`
	// MaxFrameBytes caps one JSON-RPC message from either side (default
	// 4 MiB): a longer one is dropped, recorded, and a call it answered
	// gets an error result.
	MaxFrameBytes int `yaml:"max_frame_bytes"`
	// AskTimeout is how long an `ask` call waits for `watcher approve`.
	AskTimeout Duration `yaml:"ask_timeout"`
}

// MCPToolRule allows, denies or asks for the tools matching Tool.
type MCPToolRule struct {
	// Tool is the server's tool name or a glob of them (path.Match syntax).
	Tool string `yaml:"tool"`
	// Action is allow, deny or ask.
	Action ToolAction `yaml:"action"`
	// Name labels the rule in refusals and the ledger; default "mcp:<tool>".
	Name string `yaml:"name"`
	// Arguments constrain the call's arguments by name: a call whose
	// arguments break one is refused, whatever the action.
	Arguments map[string]ArgConstraint `yaml:"arguments"`
}

// ArgConstraint is what one argument of a call must be. A string argument
// is checked against Prefix, Pattern and MaxBytes; an argument of another
// type is checked as its JSON text.
type ArgConstraint struct {
	// Required refuses a call without the argument.
	Required bool `yaml:"required"`
	// Deny refuses a call that has the argument at all.
	Deny bool `yaml:"deny"`
	// Prefix lists accepted beginnings (e.g. the workspace path); the
	// value must start with one of them. Paths are compared cleaned, so
	// "/ws/../etc" does not pass as "/ws/".
	Prefix []string `yaml:"prefix"`
	// Pattern is an RE2 regular expression the whole value must match.
	Pattern string `yaml:"pattern"`
	// MaxBytes caps the value's length.
	MaxBytes int `yaml:"max_bytes"`
}

// RuleName is the rule's name in records.
func (r MCPToolRule) RuleName() string {
	if r.Name != "" {
		return r.Name
	}
	return "mcp:" + r.Tool
}

// MCPDecision is what the policy says about one call of a server's tool.
type MCPDecision struct {
	// Action is allow, deny or ask.
	Action ToolAction
	// Rule names the deciding rule ("default-deny" when none matched,
	// "mcp:default-allow" for a sandbox with no MCP rules).
	Rule string
	// Why says, for a refusal or an ask, what and why, for the model.
	Why string
}

// DecideMCP decides a call of tool with the given arguments (decoded JSON
// object members, raw). It is the one decision path for wrapped servers'
// tools: tools/list uses it with nil arguments to hide what no call could
// pass.
func (t *MCPTools) DecideMCP(tool string, args map[string][]byte) MCPDecision {
	if len(t.Rules) == 0 {
		return MCPDecision{Action: ToolAllow, Rule: "mcp:default-allow"}
	}
	for _, r := range t.Rules {
		if ok, _ := pathpkg.Match(r.Tool, tool); !ok {
			continue
		}
		if r.Action == ToolDeny {
			return MCPDecision{Action: ToolDeny, Rule: r.RuleName(), Why: fmt.Sprintf("the policy denies tool %q", tool)}
		}
		if args != nil {
			if why := checkArgs(r.Arguments, args); why != "" {
				return MCPDecision{Action: ToolDeny, Rule: r.RuleName(), Why: why}
			}
		}
		d := MCPDecision{Action: r.Action, Rule: r.RuleName()}
		if r.Action == ToolAsk {
			d.Why = "the policy asks a human before " + tool
		}
		return d
	}
	return MCPDecision{Action: ToolDeny, Rule: "default-deny", Why: fmt.Sprintf("tool %q is on no rule of this sandbox's tools.mcp list", tool)}
}

func checkArgs(cons map[string]ArgConstraint, args map[string][]byte) string {
	names := make([]string, 0, len(cons))
	for n := range cons {
		names = append(names, n)
	}
	// Stable messages: the first broken constraint by name.
	sort.Strings(names)
	for _, name := range names {
		c := cons[name]
		raw, has := args[name]
		switch {
		case !has && c.Required:
			return fmt.Sprintf("argument %q is required by the policy", name)
		case !has:
			continue
		case c.Deny:
			return fmt.Sprintf("argument %q is not allowed by the policy", name)
		}
		val := string(raw)
		if s, ok := jsonString(raw); ok {
			val = s
		}
		if c.MaxBytes > 0 && len(val) > c.MaxBytes {
			return fmt.Sprintf("argument %q is %d bytes, over the policy's %d", name, len(val), c.MaxBytes)
		}
		if len(c.Prefix) > 0 {
			ok := false
			for _, p := range c.Prefix {
				ok = ok || hasPathPrefix(val, p)
			}
			if !ok {
				return fmt.Sprintf("argument %q must start with one of %v", name, c.Prefix)
			}
		}
		if c.Pattern != "" {
			re, err := regexp.Compile(`\A(?:` + c.Pattern + `)\z`)
			if err != nil || !re.MatchString(val) {
				return fmt.Sprintf("argument %q does not match the policy's pattern %q", name, c.Pattern)
			}
		}
	}
	return ""
}

// hasPathPrefix compares as paths when p is absolute (cleaned, on a
// component boundary), as text otherwise.
func hasPathPrefix(v, p string) bool {
	if !strings.HasPrefix(p, "/") {
		return strings.HasPrefix(v, p)
	}
	if !strings.HasPrefix(v, "/") {
		return false
	}
	cv, cp := pathpkg.Clean(v), pathpkg.Clean(p)
	return cv == cp || cp == "/" || strings.HasPrefix(cv, cp+"/")
}

func jsonString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !utf8.ValidString(s) {
		return "", false
	}
	return s, true
}

func (c *checker) mcpTools(at path, t *MCPTools) {
	for i, r := range t.Rules {
		ra := at.key("rules").idx(i)
		if r.Tool == "" {
			c.add(ra.key("tool"), "required (a tool name or a glob such as \"*\")")
		} else if _, err := pathMatchCheck(r.Tool); err != nil {
			c.add(ra.key("tool"), "%q: %v", r.Tool, err)
		}
		c.toolAction(ra.key("action"), r.Action, true)
		for name, a := range r.Arguments {
			aa := ra.key("arguments", name)
			if a.Pattern != "" {
				if _, err := regexp.Compile(a.Pattern); err != nil {
					c.add(aa.key("pattern"), "%v", err)
				}
			}
			if a.MaxBytes < 0 {
				c.add(aa.key("max_bytes"), "must not be negative")
			}
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max_argument_bytes", t.MaxArgumentBytes}, {"max_result_bytes", t.MaxResultBytes}, {"max_frame_bytes", t.MaxFrameBytes}} {
		if f.v < 0 {
			c.add(at.key(f.name), "must not be negative")
		}
	}
	c.duration(at.key("ask_timeout"), t.AskTimeout)
}

func pathMatchCheck(glob string) (bool, error) { return pathpkg.Match(glob, "") }
