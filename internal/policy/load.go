package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// FieldError is one problem in a policy, located in its file when the
// policy was read from one.
type FieldError struct {
	// File is the policy file name ("" for a policy built in code).
	File string
	// Line and Column are 1-based; 0 when unknown.
	Line, Column int
	// Field is the path of the offending field, e.g.
	// "sandboxes[1].egress.allow[0].cidr".
	Field string
	// Msg says what is wrong.
	Msg string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("policy")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a policy, in file order.
type Errors []*FieldError

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap lets errors.As find the individual FieldErrors.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Load reads and checks the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and checks a policy. name is used in error messages and
// recorded as the policy's Source.
func Parse(name string, data []byte) (*Policy, error) {
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, Errors{yamlError(name, nil, err)}
	}
	var docs []*ast.DocumentNode
	for _, d := range file.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d)
		}
	}
	switch {
	case len(docs) == 0:
		return nil, Errors{{File: name, Msg: "policy is empty"}}
	case len(docs) > 1:
		tk := docs[1].Body.GetToken()
		return nil, Errors{{File: name, Line: tk.Position.Line, Column: tk.Position.Column, Msg: "policy must be a single YAML document"}}
	}
	body := docs[0].Body

	p := &Policy{Agent: DefaultAgent()}
	if err := yaml.NodeToValue(body, p, yaml.Strict()); err != nil {
		return nil, Errors{yamlError(name, body, err)}
	}
	normalize(p)
	p.Source = name
	sum := sha256.Sum256(data)
	p.Hash = hex.EncodeToString(sum[:])

	var errs Errors
	locate := func(fe []*FieldError) {
		for _, e := range fe {
			e.File = name
			e.Line, e.Column = lineOf(body, e.Field)
			errs = append(errs, e)
		}
	}
	// Check each sandbox as written before merging it with its preset, so
	// every value error points at the line that holds the value.
	for i := range p.Sandboxes {
		var c checker
		c.sandboxValues(path{"sandboxes", i}, &p.Sandboxes[i])
		locate(c.errs)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	for i := range p.Sandboxes {
		node := nodeAt(body, path{"sandboxes", i})
		merged, err := applyPreset(p.Sandboxes[i], node)
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				fe.Field = path{"sandboxes", i, "preset"}.String()
				locate([]*FieldError{fe})
				continue
			}
			return nil, Errors{yamlError(name, body, err)}
		}
		p.Sandboxes[i] = merged
	}
	if len(errs) > 0 {
		return nil, errs
	}
	normalize(p)
	if err := p.Validate(); err != nil {
		var ve Errors
		if !errors.As(err, &ve) {
			return nil, err
		}
		locate(ve)
		return nil, errs
	}
	return p, nil
}

// applyPreset returns the sandbox as written on top of its preset: fields
// present in node replace the preset's, and rule lists are the sandbox's own
// rules followed by the preset's (so, among equally specific rules, the
// sandbox's own come first and win).
func applyPreset(own Sandbox, node ast.Node) (Sandbox, error) {
	name := own.Preset
	if name == "" {
		name = PresetBaseline
	}
	base, err := Preset(name)
	if err != nil {
		return Sandbox{}, &FieldError{Msg: err.Error()}
	}
	merged := base
	if node != nil {
		if err := yaml.NodeToValue(node, &merged, yaml.Strict()); err != nil {
			return Sandbox{}, err
		}
	}
	mergeLists(&merged, &own, &base)
	// Presets bind names to the proxy's answers; a sandbox that leaves the
	// resolved default leaves binding with it unless it asks for binding.
	if d := merged.Egress.Default; d != "" && d != EgressResolved && !own.Egress.Names.Bind {
		merged.Egress.Names.Bind = false
	}
	exchangeRule(&merged)
	normalizeSandbox(&merged)
	return merged, nil
}

// mergeLists sets every rule list of merged to own's entries followed by
// base's.
func mergeLists(merged, own, base *Sandbox) {
	merged.Files = concat(own.Files, base.Files)
	merged.Exec.Rules = concat(own.Exec.Rules, base.Exec.Rules)
	merged.Operations.Capabilities.Rules = concat(own.Operations.Capabilities.Rules, base.Operations.Capabilities.Rules)
	merged.DNS.Allow = concat(own.DNS.Allow, base.DNS.Allow)
	merged.DNS.Deny = concat(own.DNS.Deny, base.DNS.Deny)
	merged.DNS.Detection.HighCardinality = concat(own.DNS.Detection.HighCardinality, base.DNS.Detection.HighCardinality)
	merged.Egress.Allow = concat(own.Egress.Allow, base.Egress.Allow)
	merged.Egress.Loopback = concat(own.Egress.Loopback, base.Egress.Loopback)
	merged.Egress.NamePorts = concat(own.Egress.NamePorts, base.Egress.NamePorts)
	merged.Tools.Rules = concat(own.Tools.Rules, base.Tools.Rules)
	merged.Tools.Exchange.Patterns = concat(own.Tools.Exchange.Patterns, base.Tools.Exchange.Patterns)
	merged.Egress.Unix = concat(own.Egress.Unix, base.Egress.Unix)
	merged.Egress.Names.ReadOnly = concat(own.Egress.Names.ReadOnly, base.Egress.Names.ReadOnly)
	merged.Egress.Names.ECH = concat(own.Egress.Names.ECH, base.Egress.Names.ECH)
	merged.Egress.Names.Inspect = concat(own.Egress.Names.Inspect, base.Egress.Names.Inspect)
	merged.Egress.Names.UnnamedPorts = concat(own.Egress.Names.UnnamedPorts, base.Egress.Names.UnnamedPorts)
	merged.Egress.Names.Secrets = concat(own.Egress.Names.Secrets, base.Egress.Names.Secrets)
	merged.Require = concat(own.Require, base.Require)
}

// concat returns a followed by the entries of b not already in a (so a
// policy written out in full and read back does not repeat its preset).
func concat[T any](a, b []T) []T {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]T, 0, len(a)+len(b))
	out = append(out, a...)
	for _, e := range b {
		dup := false
		for _, o := range a {
			if reflect.DeepEqual(e, o) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, e)
		}
	}
	return out
}

// yamlError turns a go-yaml error into a FieldError with the position and,
// where the token can be found in the tree, the field path.
func yamlError(name string, root ast.Node, err error) *FieldError {
	fe := &FieldError{File: name, Msg: err.Error()}
	var ye yaml.Error
	if errors.As(err, &ye) {
		fe.Msg = ye.GetMessage()
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			fe.Line, fe.Column = tk.Position.Line, tk.Position.Column
			if root != nil {
				if p, ok := pathOfToken(root, tk, nil); ok {
					fe.Field = p.String()
				}
			}
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			// "cannot unmarshal string into Go struct field Sandbox.Mode of
			// type int" names Go types; say it in the file's terms.
			fe.Msg = fmt.Sprintf("cannot use %s value here (want %s)", yamlKind(te.SrcType.String()), yamlKind(te.DstType.String()))
		}
	}
	return fe
}

func yamlKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map"), strings.Contains(goType, "policy."), strings.HasPrefix(goType, "struct"):
		return "a mapping"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "bool":
		return "true or false"
	case goType == "time.Duration":
		return "a duration like 30s"
	}
	return "a " + goType
}

// path addresses a field: string keys and int list indexes.
type path []any

func (p path) key(ks ...string) path {
	out := append(path(nil), p...)
	for _, k := range ks {
		out = append(out, k)
	}
	return out
}
func (p path) idx(i int) path { return append(append(path(nil), p...), i) }

func (p path) String() string {
	var b strings.Builder
	for _, s := range p {
		switch v := s.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		case int:
			b.WriteString("[" + strconv.Itoa(v) + "]")
		}
	}
	return b.String()
}

func parsePath(s string) path {
	var p path
	for _, part := range strings.Split(s, ".") {
		for part != "" {
			open := strings.IndexByte(part, '[')
			if open < 0 {
				p = append(p, part)
				break
			}
			if open > 0 {
				p = append(p, part[:open])
			}
			end := strings.IndexByte(part[open:], ']')
			if end < 0 {
				break
			}
			n, _ := strconv.Atoi(part[open+1 : open+end])
			p = append(p, n)
			part = part[open+end+1:]
		}
	}
	return p
}

func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		default:
			return n
		}
	}
}

func mappingValues(n ast.Node) []*ast.MappingValueNode {
	switch v := unwrap(n).(type) {
	case *ast.MappingNode:
		return v.Values
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{v}
	}
	return nil
}

// nodeAt returns the value node at p, or nil.
func nodeAt(root ast.Node, p path) ast.Node {
	n, rest := walk(root, p)
	if len(rest) > 0 {
		return nil
	}
	return n
}

// walk follows p as far as the tree goes and returns the deepest node
// reached and the part of p left over.
func walk(root ast.Node, p path) (ast.Node, path) {
	n := root
	for i, seg := range p {
		var next ast.Node
		switch s := seg.(type) {
		case string:
			for _, mv := range mappingValues(n) {
				if mv.Key != nil && mv.Key.GetToken() != nil && mv.Key.GetToken().Value == s {
					next = mv.Value
					break
				}
			}
		case int:
			if seq, ok := unwrap(n).(*ast.SequenceNode); ok && s < len(seq.Values) {
				next = seq.Values[s]
			}
		}
		if next == nil {
			return n, p[i:]
		}
		n = next
	}
	return n, nil
}

// lineOf returns the position of the field named by a path string: the
// value's own position when the file has the field, else the nearest
// enclosing field that it has.
func lineOf(root ast.Node, field string) (int, int) {
	n, _ := walk(root, parsePath(field))
	if n == nil {
		return 0, 0
	}
	tk := n.GetToken()
	if mv, ok := unwrap(n).(*ast.MappingNode); ok && len(mv.Values) > 0 && mv.Values[0].Key != nil {
		tk = mv.Values[0].Key.GetToken()
	}
	if tk == nil || tk.Position == nil {
		return 0, 0
	}
	return tk.Position.Line, tk.Position.Column
}

// pathOfToken finds the path of the key or value that holds tk.
func pathOfToken(n ast.Node, tk *token.Token, at path) (path, bool) {
	if n == nil {
		return nil, false
	}
	if n.GetToken() == tk {
		return at, true
	}
	switch v := unwrap(n).(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		for _, mv := range mappingValues(v) {
			if mv.Key == nil || mv.Key.GetToken() == nil {
				continue
			}
			k := mv.Key.GetToken().Value
			if mv.Key.GetToken() == tk || mv.GetToken() == tk {
				return at.key(k), true
			}
			if p, ok := pathOfToken(mv.Value, tk, at.key(k)); ok {
				return p, true
			}
		}
	case *ast.SequenceNode:
		for i, e := range v.Values {
			if p, ok := pathOfToken(e, tk, at.idx(i)); ok {
				return p, true
			}
		}
	}
	return nil, false
}

// Marshal encodes a policy as YAML (e.g. to show the effective policy).
func Marshal(p *Policy) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf, yaml.Indent(2), yaml.IndentSequence(true))
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("encode policy: %w", err)
	}
	return buf.Bytes(), nil
}

// normalize makes empty lists nil, so "[]" in a file and an absent field
// give equal policies.
func normalize(p *Policy) {
	nilIfEmpty(&p.Agent.DNS.Upstreams)
	nilIfEmpty(&p.Agent.Witnesses)
	for i := range p.Sandboxes {
		normalizeSandbox(&p.Sandboxes[i])
	}
}

func normalizeSandbox(sb *Sandbox) {
	nilIfEmpty(&sb.Select.Cgroups)
	nilIfEmpty(&sb.Select.Globs)
	nilIfEmpty(&sb.Select.Containers)
	nilIfEmpty(&sb.Workspace)
	nilIfEmpty(&sb.Files)
	nilIfEmpty(&sb.Exec.Rules)
	nilIfEmpty(&sb.Operations.Capabilities.Rules)
	nilIfEmpty(&sb.DNS.Allow)
	nilIfEmpty(&sb.DNS.Deny)
	nilIfEmpty(&sb.DNS.Detection.HighCardinality)
	nilIfEmpty(&sb.Egress.Allow)
	nilIfEmpty(&sb.Egress.Loopback)
	nilIfEmpty(&sb.Egress.NamePorts)
	nilIfEmpty(&sb.Limits.IO)
	nilIfEmpty(&sb.Tools.Rules)
	nilIfEmpty(&sb.Tools.Exchange.Types)
	nilIfEmpty(&sb.Tools.Exchange.Patterns)
	nilIfEmpty(&sb.Tools.MCP.Rules)
	for j := range sb.Tools.MCP.Rules {
		if len(sb.Tools.MCP.Rules[j].Arguments) == 0 {
			sb.Tools.MCP.Rules[j].Arguments = nil
		}
		for name, a := range sb.Tools.MCP.Rules[j].Arguments {
			nilIfEmpty(&a.Prefix)
			sb.Tools.MCP.Rules[j].Arguments[name] = a
		}
	}
	nilIfEmpty(&sb.Egress.Unix)
	nilIfEmpty(&sb.Egress.Names.ReadOnly)
	nilIfEmpty(&sb.Egress.Names.ECH)
	nilIfEmpty(&sb.Egress.Names.Inspect)
	nilIfEmpty(&sb.Egress.Names.UnnamedPorts)
	nilIfEmpty(&sb.Egress.Names.Secrets)
	for j := range sb.Egress.Names.Secrets {
		nilIfEmpty(&sb.Egress.Names.Secrets[j].Hosts)
	}
	nilIfEmpty(&sb.Require)
	for j := range sb.Egress.Allow {
		nilIfEmpty(&sb.Egress.Allow[j].Ports)
	}
}

func nilIfEmpty[T any](s *[]T) {
	if len(*s) == 0 {
		*s = nil
	}
}
