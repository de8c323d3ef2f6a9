package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("policy", command{Summary: "learn, then enforce: suggest a policy from a recorded run (policy suggest)", Run: runPolicy})
}

func runPolicy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "Usage: watcher policy suggest --sandbox S [--since D] [--policy FILE] [LEDGER_DIR]"
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stderr, usage)
		if len(args) == 0 {
			return &exitError{Code: 2, Err: errors.New("policy: no subcommand given (suggest)")}
		}
		return nil
	}
	if args[0] != "suggest" {
		fmt.Fprintln(stderr, usage)
		return &exitError{Code: 2, Err: fmt.Errorf("policy: unknown subcommand \"%s\" (suggest)", textesc.String(args[0]))}
	}
	return runPolicySuggest(ctx, args[1:], stdout, stderr)
}

func runPolicySuggest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy suggest", flag.ContinueOnError)
	sandbox := fs.String("sandbox", "", "the sandbox whose run to learn from (required)")
	since := fs.String("since", "", "only records at or after this time (RFC 3339, or a duration ago like 2h)")
	policyPath := fs.String("policy", "", "the policy the run was recorded under (default: the built-in default policy)")
	if err := parseFlags(fs, args, stderr, `Usage: watcher policy suggest --sandbox S [--since D] [--policy FILE] [LEDGER_DIR]

Reads the ledger of a run (best in record mode: nothing is refused, what the
policy would have refused is recorded) and prints the policy with the
smallest additions to the sandbox that would have allowed what was
recorded: files, exec paths, DNS names, addresses, operations, tools. Each
addition has a comment naming the event that asked for it (its ledger
sequence number, time, process and rule). The sandbox's mode is set to
enforce. What the baseline blocks as dangerous (credentials, other
processes' memory, kernel tunables, ptrace, ...) is printed commented out:
uncomment it only if the run really needs it.

The workflow for a new MCP server, or any new agent: run it in a sandbox
with mode: record, review this suggestion, enforce it. The comments of the
policy file are not kept. LEDGER_DIR defaults to the policy's
agent.ledger_dir.`); err != nil {
		return helpOK(err)
	}
	if *sandbox == "" {
		return &exitError{Code: 2, Err: errors.New("policy suggest: --sandbox is required")}
	}
	if fs.NArg() > 1 {
		return &exitError{Code: 2, Err: errors.New("policy suggest: at most one LEDGER_DIR")}
	}
	var data []byte
	var pol *policy.Policy
	if *policyPath == "" {
		data, pol = policy.DefaultYAML(), policy.Default()
	} else {
		var err error
		if data, err = os.ReadFile(*policyPath); err != nil {
			return fmt.Errorf("policy suggest: %w", err)
		}
		if pol, err = policy.Parse(*policyPath, data); err != nil {
			return fmt.Errorf("policy suggest: %w", err)
		}
	}
	var sb *policy.Sandbox
	for i := range pol.Sandboxes {
		if pol.Sandboxes[i].Name == *sandbox {
			sb = &pol.Sandboxes[i]
		}
	}
	if sb == nil {
		return &exitError{Code: 2, Err: fmt.Errorf("policy suggest: the policy has no sandbox \"%s\"", textesc.String(*sandbox))}
	}
	from, err := parseWhen(*since, time.Now())
	if err != nil {
		return &exitError{Code: 2, Err: err}
	}
	dir := pol.Agent.LedgerDir
	if fs.NArg() == 1 {
		dir = fs.Arg(0)
	}
	r, err := ledger.NewReader(dir)
	if err != nil {
		return &exitError{Code: 2, Err: fmt.Errorf("policy suggest: %w", err)}
	}
	defer r.Close()
	var recs []suggestEvent
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &exitError{Code: 2, Err: fmt.Errorf("policy suggest: %w", err)}
		}
		if rec.Event.Sandbox.Name != *sandbox || (!from.IsZero() && rec.Event.Time.Before(from)) {
			continue
		}
		recs = append(recs, suggestEvent{seq: rec.Seq, ev: rec.Event})
	}
	adds := suggestAdditions(pol, sb, recs)
	out, err := renderSuggestion(data, *sandbox, adds)
	if err != nil {
		return fmt.Errorf("policy suggest: %w", err)
	}
	fmt.Fprintf(stdout, "# watcher policy suggest: sandbox %s, %d records of %s%s: %d additions.\n",
		textesc.String(*sandbox), len(recs), textesc.String(dir), sinceText(from), len(adds))
	fmt.Fprintln(stdout, "# Review each addition (its comment names the event that asked for it), then enforce this policy.")
	_, err = stdout.Write(out)
	return err
}

func sinceText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return " since " + t.UTC().Format(time.RFC3339)
}

type suggestEvent struct {
	seq uint64
	ev  audit.Event
}

// addition is one policy line that would have allowed recorded events.
type addition struct {
	// allow is the line (YAML for the sandbox, as in a refusal's Allow).
	allow string
	// note is what follows the YAML on the line (a warning).
	note string
	// dangerous says the baseline blocks it: printed commented out.
	dangerous bool
	// first is the first event that asked for it; count how many did.
	first string
	count int
}

// suggestAdditions is the policy lines that would have allowed what the
// sandbox's run was refused (or, in record mode, would have been), one per
// distinct line, in the order of the first event that asked for each.
func suggestAdditions(pol *policy.Policy, sb *policy.Sandbox, recs []suggestEvent) []*addition {
	var out []*addition
	byLine := map[string]*addition{}
	add := func(line, what string, dangerous bool) {
		note := ""
		if i := strings.Index(line, "   #"); i >= 0 {
			line, note = line[:i], strings.TrimSpace(line[i+4:])
		}
		if i := strings.Index(line, " ("); i >= 0 && strings.HasSuffix(line, ")") {
			line, note = line[:i], strings.TrimSuffix(line[i+2:], ")")
		}
		if a := byLine[line]; a != nil {
			a.count++
			return
		}
		a := &addition{allow: line, note: note, dangerous: dangerous, first: what, count: 1}
		byLine[line] = a
		out = append(out, a)
	}
	baseline := baselineRules()
	for _, r := range recs {
		e := &r.ev
		if e.Sandbox.Labels[audit.LabelCanary] != "" {
			continue // the agent's own self-test, not the run
		}
		at := fmt.Sprintf("seq %d %s", r.seq, e.Time.UTC().Format("15:04:05"))
		if t := e.Tool; t != nil {
			if t.Stage == "decision" && t.Decision == "deny" && slices.Contains(policy.ToolNames(), t.Tool) && isToolRule(sb, e.Rule) {
				add(fmt.Sprintf("tools: {rules: [{tool: %s, action: allow}]}", t.Tool),
					fmt.Sprintf("%s: tool call %s (%s) refused by rule %s", at, t.CallID, t.Tool, e.Rule), false)
			}
			continue
		}
		switch e.Verdict {
		case audit.VerdictDenied, audit.VerdictKilled, audit.VerdictRecorded:
		default:
			continue
		}
		for _, f := range agent.Refusals(pol, sb, []audit.Event{*e}, "") {
			what := f.Path
			if what == "" {
				what = f.Address
			}
			desc := fmt.Sprintf("%s: %s %s %s, %s by rule %s (%s)", at, f.Process, f.Operation, what, f.Result, orDash(f.Rule), f.Layer)
			for _, line := range f.Allow {
				add(line, desc, baseline[f.Rule] || strings.HasPrefix(line, "operations:"))
			}
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// baselineRules are the names of the baseline's file rules: what every
// preset blocks as dangerous.
func baselineRules() map[string]bool {
	out := map[string]bool{}
	if b, err := policy.Preset(policy.PresetBaseline); err == nil {
		for _, f := range b.Files {
			out[f.RuleName()] = true
		}
	}
	return out
}

func isToolRule(sb *policy.Sandbox, rule string) bool {
	if rule == "default-deny" {
		return true
	}
	for _, r := range sb.Tools.Rules {
		if r.RuleName() == rule {
			return true
		}
	}
	return false
}

// renderSuggestion is the policy document data with the additions merged
// into the sandbox's own lists (ahead of its preset's, so they decide
// first), its mode set to enforce, and a comment on each addition.
func renderSuggestion(data []byte, sandbox string, adds []*addition) ([]byte, error) {
	var doc yaml.MapSlice
	if err := yaml.UnmarshalWithOptions(data, &doc, yaml.UseOrderedMap()); err != nil {
		return nil, err
	}
	sbs, si := mapGet(doc, "sandboxes")
	list, _ := sbs.([]any)
	idx := -1
	for i, s := range list {
		if m, ok := s.(yaml.MapSlice); ok {
			if n, _ := mapGet(m, "name"); n == sandbox {
				idx = i
			}
		}
	}
	if si < 0 || idx < 0 {
		return nil, fmt.Errorf("no sandbox %q in the policy document", sandbox)
	}
	sb := list[idx].(yaml.MapSlice)
	base := fmt.Sprintf("$.sandboxes[%d]", idx)
	type placed struct {
		path  string // the list or map holding it
		key   string // the map key, or "" for a list element
		elem  any    // the list element
		a     *addition
		ahead bool
	}
	var places []placed
	var commented []*addition
	for _, a := range adds {
		if a.dangerous {
			commented = append(commented, a)
			continue
		}
		var src yaml.MapSlice
		if err := yaml.UnmarshalWithOptions([]byte(a.allow), &src, yaml.UseOrderedMap()); err != nil {
			commented = append(commented, a)
			continue
		}
		var merge func(dst yaml.MapSlice, src yaml.MapSlice, path string) yaml.MapSlice
		merge = func(dst yaml.MapSlice, src yaml.MapSlice, path string) yaml.MapSlice {
			for _, it := range src {
				key := fmt.Sprint(it.Key)
				cur, i := mapGet(dst, key)
				switch v := it.Value.(type) {
				case yaml.MapSlice:
					sub, _ := cur.(yaml.MapSlice)
					sub = merge(sub, v, path+"."+key)
					dst = mapSet(dst, i, key, sub)
				case []any:
					l, _ := cur.([]any)
					for _, el := range v {
						if !slices.ContainsFunc(l, func(x any) bool { return reflect.DeepEqual(x, el) }) {
							l = append([]any{el}, l...)
							places = append(places, placed{path: path + "." + key, elem: el, a: a})
						}
					}
					dst = mapSet(dst, i, key, l)
				default:
					dst = mapSet(dst, i, key, v)
					places = append(places, placed{path: path, key: key, a: a})
				}
			}
			return dst
		}
		sb = merge(sb, src, base)
	}
	_, mi := mapGet(sb, "mode")
	sb = mapSet(sb, mi, "mode", "enforce")
	list[idx] = sb
	cm := yaml.CommentMap{}
	for _, p := range places {
		text := comment(p.a)
		if p.key != "" {
			cm[p.path+"."+p.key] = []*yaml.Comment{yaml.LineComment(" " + text)}
			continue
		}
		// Its index in the final list.
		sub := lookup(sb, strings.TrimPrefix(p.path, base))
		if l, ok := sub.([]any); ok {
			for i, x := range l {
				if reflect.DeepEqual(x, p.elem) {
					cm[fmt.Sprintf("%s[%d]", p.path, i)] = []*yaml.Comment{yaml.HeadComment(" " + text)}
				}
			}
		}
	}
	out, err := yaml.MarshalWithOptions(doc, yaml.WithComment(cm), yaml.IndentSequence(true))
	if err != nil {
		return nil, err
	}
	if len(commented) > 0 {
		var b strings.Builder
		b.WriteString("# Not added: what the baseline blocks as dangerous (or lines to add by hand).\n# Uncomment under the sandbox only if the run really needs it:\n")
		for _, a := range commented {
			fmt.Fprintf(&b, "#   %s   # %s\n", a.allow, comment(a))
		}
		out = append(out, []byte(b.String())...)
	}
	return out, nil
}

// comment says which event asked for an addition; what a sandbox named
// is escaped.
func comment(a *addition) string {
	s := textesc.String(a.first)
	if a.count > 1 {
		s += fmt.Sprintf(" (and %d more)", a.count-1)
	}
	if a.note != "" {
		s += "; " + textesc.String(a.note)
	}
	return strings.ReplaceAll(s, "\n", " ")
}

func mapGet(m yaml.MapSlice, key string) (any, int) {
	for i, it := range m {
		if fmt.Sprint(it.Key) == key {
			return it.Value, i
		}
	}
	return nil, -1
}

func mapSet(m yaml.MapSlice, i int, key string, v any) yaml.MapSlice {
	if i >= 0 {
		m[i].Value = v
		return m
	}
	return append(m, yaml.MapItem{Key: key, Value: v})
}

// lookup follows a path of ".key" steps from m.
func lookup(m yaml.MapSlice, path string) any {
	var cur any = m
	for _, k := range strings.Split(strings.TrimPrefix(path, "."), ".") {
		ms, ok := cur.(yaml.MapSlice)
		if !ok {
			return nil
		}
		cur, _ = mapGet(ms, k)
	}
	return cur
}
