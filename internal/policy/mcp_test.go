package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestDecideMCP(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`version: 1
sandboxes:
  - name: a
    select: {cgroups: [/a]}
    workspace: [/ws]
    tools:
      mcp:
        rules:
          - {tool: delete_*, action: deny}
          - tool: read_text_file
            action: allow
            arguments:
              path: {prefix: [/ws], required: true}
          - tool: fetch
            action: ask
            arguments:
              url: {pattern: 'https://docs\.example\.com/.*', max_bytes: 100}
              headers: {deny: true}
          - {tool: "*", action: allow, name: everything-else}
`))
	if err != nil {
		t.Fatal(err)
	}
	// What Marshal writes loads as the same rules.
	out, err := Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("b.yaml", out)
	if err != nil || !reflect.DeepEqual(q.Sandboxes[0].Tools.MCP, p.Sandboxes[0].Tools.MCP) {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, p.Sandboxes[0].Tools.MCP, q.Sandboxes[0].Tools.MCP)
	}
	mcp := &p.Sandboxes[0].Tools.MCP
	for _, c := range []struct {
		tool   string
		args   map[string][]byte
		action ToolAction
		rule   string
		why    string
	}{
		{"delete_file", nil, ToolDeny, "mcp:delete_*", "denies"},
		{"read_text_file", map[string][]byte{"path": []byte(`"/ws/a.txt"`)}, ToolAllow, "mcp:read_text_file", ""},
		{"read_text_file", map[string][]byte{"path": []byte(`"/ws"`)}, ToolAllow, "mcp:read_text_file", ""},
		{"read_text_file", map[string][]byte{"path": []byte(`"/ws/../etc/shadow"`)}, ToolDeny, "mcp:read_text_file", "must start with"},
		{"read_text_file", map[string][]byte{"path": []byte(`"/wsx/a"`)}, ToolDeny, "mcp:read_text_file", "must start with"},
		{"read_text_file", map[string][]byte{}, ToolDeny, "mcp:read_text_file", "required"},
		// tools/list asks with no arguments: shown, the call decides.
		{"read_text_file", nil, ToolAllow, "mcp:read_text_file", ""},
		{"fetch", map[string][]byte{"url": []byte(`"https://docs.example.com/x"`)}, ToolAsk, "mcp:fetch", "asks a human"},
		{"fetch", map[string][]byte{"url": []byte(`"https://docs.example.com.evil/x"`)}, ToolDeny, "mcp:fetch", "pattern"},
		{"fetch", map[string][]byte{"url": []byte(`"https://docs.example.com/` + strings.Repeat("a", 100) + `"`)}, ToolDeny, "mcp:fetch", "over the policy's 100"},
		{"fetch", map[string][]byte{"url": []byte(`"https://docs.example.com/x"`), "headers": []byte(`{}`)}, ToolDeny, "mcp:fetch", "not allowed"},
		{"anything", nil, ToolAllow, "everything-else", ""},
	} {
		d := mcp.DecideMCP(c.tool, c.args)
		if d.Action != c.action || d.Rule != c.rule || !strings.Contains(d.Why, c.why) {
			t.Errorf("%s %s: %+v, want %s by %s (%q)", c.tool, c.args, d, c.action, c.rule, c.why)
		}
	}
	// No rules: the drop-in allows every tool (the kernel cage and pins hold).
	if d := (&MCPTools{}).DecideMCP("x", nil); d.Action != ToolAllow || d.Rule != "mcp:default-allow" {
		t.Errorf("no rules: %+v", d)
	}
	// Rules, none matching: default-deny.
	one := &MCPTools{Rules: []MCPToolRule{{Tool: "a", Action: ToolAllow}}}
	if d := one.DecideMCP("b", nil); d.Action != ToolDeny || d.Rule != "default-deny" {
		t.Errorf("unmatched: %+v", d)
	}
}

func TestMCPRulesValidate(t *testing.T) {
	for _, bad := range []struct{ yaml, where string }{
		{"rules: [{action: allow}]", "tools.mcp.rules[0].tool"},
		{"rules: [{tool: a, action: maybe}]", "tools.mcp.rules[0].action"},
		{"rules: [{tool: '[', action: allow}]", "tools.mcp.rules[0].tool"},
		{"rules: [{tool: a, action: allow, arguments: {x: {pattern: '('}}}]", "tools.mcp.rules[0].arguments.x.pattern"},
		{"max_result_bytes: -1", "tools.mcp.max_result_bytes"},
	} {
		_, err := Parse("p.yaml", []byte("version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n    tools:\n      mcp: {"+strings.TrimSuffix(strings.TrimPrefix(bad.yaml, "{"), "}")+"}\n"))
		if err == nil || !strings.Contains(err.Error(), bad.where) {
			t.Errorf("%s: %v, want an error at %s", bad.yaml, err, bad.where)
		}
	}
}
