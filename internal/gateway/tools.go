package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

type readParams struct {
	Path     string `json:"path"`
	Offset   int64  `json:"offset"`
	MaxBytes int    `json:"max_bytes"`
}

type writeParams struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	// Encoding is "utf-8" (default) or "base64".
	Encoding string `json:"encoding"`
}

type listParams struct {
	Path string `json:"path"`
}

type shellParams struct {
	Command        string  `json:"command"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
}

// maxListEntries caps list_dir.
const maxListEntries = 4096

func (g *sandboxGateway) runTool(ctx context.Context, cl *call, tool string, args json.RawMessage) (any, *toolproto.Error) {
	sb := cl.sb
	switch tool {
	case policy.ToolReadFile:
		var p readParams
		if e := decodeParams(args, &p); e != nil {
			return nil, e
		}
		max := sb.Tools.MaxOutputBytes
		if p.MaxBytes > 0 && p.MaxBytes < max {
			max = p.MaxBytes
		}
		r, e := g.rootFor(sb, p.Path)
		if e != nil {
			return nil, e
		}
		out, err := r.ReadFile(p.Path, p.Offset, max)
		return out, toolError(err)
	case policy.ToolWriteFile:
		var p writeParams
		if e := decodeParams(args, &p); e != nil {
			return nil, e
		}
		data := []byte(p.Content)
		switch p.Encoding {
		case "", "utf-8":
		case "base64":
			var err error
			if data, err = base64.StdEncoding.DecodeString(p.Content); err != nil {
				return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, "content is not valid base64: %v", err)
			}
		default:
			return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"encoding" must be utf-8 or base64`)
		}
		r, e := g.rootFor(sb, p.Path)
		if e != nil {
			return nil, e
		}
		out, err := r.WriteFile(p.Path, data)
		return out, toolError(err)
	case policy.ToolListDir:
		var p listParams
		if e := decodeParams(args, &p); e != nil {
			return nil, e
		}
		r, e := g.rootFor(sb, p.Path)
		if e != nil {
			return nil, e
		}
		out, err := r.ListDir(p.Path, maxListEntries)
		return out, toolError(err)
	case policy.ToolShell:
		var p shellParams
		if e := decodeParams(args, &p); e != nil {
			return nil, e
		}
		if strings.TrimSpace(p.Command) == "" {
			return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"command" is required`)
		}
		return g.shell(ctx, cl, p)
	}
	return nil, rpcErr(toolproto.CodeDenied, toolproto.TypeDenied, "no tool %q", tool)
}

// rootFor picks the workspace a path is in: the one whose absolute path it
// starts with, else the first (relative paths). The kernel decides whether
// the path really stays inside.
func (g *sandboxGateway) rootFor(sb *policy.Sandbox, p string) (Root, *toolproto.Error) {
	if len(sb.Workspace) == 0 {
		return Root{}, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "%v", errNoRoot)
	}
	dir := sb.Workspace[0]
	for _, w := range sb.Workspace {
		if p == w || strings.HasPrefix(p, w+"/") {
			dir = w
			break
		}
	}
	rules := *g.fileRules.Load()
	return Root{Dir: dir, FollowSymlinks: sb.Tools.FollowSymlinks, Check: func(resolved string, write bool) error {
		return fileRuleCheck(sb, rules, resolved, write)
	}}, nil
}

// fileRuleCheck applies the sandbox's file rules to a path the gateway
// resolved: what the kernel refuses the sandbox, the gateway refuses too.
func fileRuleCheck(sb *policy.Sandbox, rules []policy.FileRule, resolved string, write bool) error {
	r, ok := policy.DecideFile(rules, resolved, write)
	if !ok {
		return nil
	}
	switch sb.Effective(r.Action) {
	case policy.ActionBlock, policy.ActionKill:
		access := "read"
		if write {
			access = "write"
		}
		return &PathError{Type: toolproto.TypeDenied, Rule: r.RuleName(), Msg: fmt.Sprintf("refused: the sandbox's file rule %s blocks %s of %s", r.RuleName(), access, resolved)}
	}
	return nil
}

// toolError turns a tool's error into a typed JSON-RPC error.
func toolError(err error) *toolproto.Error {
	if err == nil {
		return nil
	}
	var pe *PathError
	if errors.As(err, &pe) {
		code := toolproto.CodePathRefused
		switch pe.Type {
		case toolproto.TypeNotFound, toolproto.TypeNotRegular, toolproto.TypeToolFailed:
			code = toolproto.CodeToolFailed
		case toolproto.TypeDenied:
			code = toolproto.CodeDenied
		}
		e := rpcErr(code, pe.Type, "%s", pe.Error())
		e.Data.Rule = pe.Rule
		if pe.Errno != 0 {
			e.Data.Errno = errnoName(pe.Errno)
		}
		return e
	}
	return rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "%v", err)
}

// summarize is the result line of the ledger record.
func summarize(out any) string {
	switch o := out.(type) {
	case *toolproto.FileContent:
		return fmt.Sprintf("read %d of %d bytes truncated=%v", len(o.Content), o.Size, o.Truncated)
	case *toolproto.WriteResult:
		return fmt.Sprintf("wrote %d bytes created=%v", o.Bytes, o.Created)
	case *toolproto.Listing:
		return fmt.Sprintf("%d entries truncated=%v", len(o.Entries), o.Truncated)
	case *toolproto.ShellResult:
		return shellSummary(o)
	case *toolproto.ExchangeResult:
		return fmt.Sprintf("%s %d bytes", o.Name, o.Bytes)
	}
	return ""
}

func hashOf(out any) string {
	switch o := out.(type) {
	case *toolproto.FileContent:
		return o.SHA256
	case *toolproto.WriteResult:
		return o.SHA256
	case *toolproto.ExchangeResult:
		return o.SHA256
	}
	return ""
}
