package policy

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	tdnote "github.com/transparency-dev/formats/note"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/containers"
)

// Validate checks the whole policy and returns Errors listing every problem
// (each naming its field), or nil. A policy read with Load or Parse has
// already been validated and its errors carry file and line.
func (p *Policy) Validate() error {
	var c checker
	if p.Version != Version {
		c.add(path{"version"}, "unsupported policy version %d (want %d)", p.Version, Version)
	}
	c.agent(path{"agent"}, &p.Agent)
	names := map[string]int{}
	for i := range p.Sandboxes {
		at := path{"sandboxes", i}
		sb := &p.Sandboxes[i]
		c.sandboxValues(at, sb)
		c.sandboxRequired(at, sb)
		if j, dup := names[sb.Name]; dup && sb.Name != "" {
			c.add(at.key("name"), "sandbox name %q already used by sandboxes[%d]", sb.Name, j)
		} else {
			names[sb.Name] = i
		}
	}
	if len(c.errs) == 0 {
		return nil
	}
	return Errors(c.errs)
}

type checker struct {
	errs []*FieldError
}

func (c *checker) add(at path, format string, args ...any) {
	c.errs = append(c.errs, &FieldError{Field: at.String(), Msg: fmt.Sprintf(format, args...)})
}

func (c *checker) absPath(at path, p string, required bool) {
	switch {
	case p == "":
		if required {
			c.add(at, "required")
		}
	case !filepath.IsAbs(p):
		c.add(at, "%q must be an absolute path", p)
	case filepath.Clean(p) != p && filepath.Clean(p)+"/" != p:
		c.add(at, "%q is not a clean path (want %q)", p, filepath.Clean(p))
	}
}

func (c *checker) hostPort(at path, s string, wantIP bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		c.add(at, "%q: want host:port: %v", s, err)
		return
	}
	if _, err := parsePort(port); err != nil {
		c.add(at, "%q: %v", s, err)
	}
	if wantIP {
		if _, err := netip.ParseAddr(host); err != nil {
			c.add(at, "%q: host must be an IP address", s)
		}
	}
}

func (c *checker) duration(at path, d Duration) {
	if d.invalid != "" {
		c.add(at, "%s", d.invalid)
	} else if d.Duration < 0 {
		c.add(at, "must not be negative")
	}
}

func (c *checker) agent(at path, a *Agent) {
	c.absPath(at.key("ledger_dir"), a.LedgerDir, true)
	c.absPath(at.key("socket_dir"), a.SocketDir, true)
	c.absPath(at.key("pin_dir"), a.PinDir, true)
	c.absPath(at.key("exec_cgroup"), a.ExecCgroup, true)
	if a.MetricsAddr != "" {
		c.hostPort(at.key("metrics_addr"), a.MetricsAddr, false)
	}
	s := at.key("sampling")
	if a.Sampling.Rate <= 0 || a.Sampling.Rate > 1 {
		c.add(s.key("rate"), "%v out of range (0, 1]", a.Sampling.Rate)
	}
	c.duration(s.key("summary_interval"), a.Sampling.SummaryInterval)
	if a.Sampling.SummaryInterval.Duration < time.Second && a.Sampling.SummaryInterval.invalid == "" {
		c.add(s.key("summary_interval"), "%v is below the minimum of 1s", a.Sampling.SummaryInterval.Duration)
	}
	d := at.key("dns")
	if a.DNS.Listen == "" {
		c.add(d.key("listen"), "required")
	} else {
		c.hostPort(d.key("listen"), a.DNS.Listen, true)
	}
	for i, u := range a.DNS.Upstreams {
		c.hostPort(d.key("upstreams").idx(i), u, true)
	}
	seen := map[string]bool{}
	for i, w := range a.Witnesses {
		at := at.key("witnesses").idx(i)
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			c.add(at.key("url"), "%q: want http(s)://host[:port][/path]", w.URL)
		}
		if w.Key == "" {
			c.add(at.key("key"), "required (the witness's cosignature/v1 verifier key)")
		} else if _, err := tdnote.NewVerifierForCosignatureV1(w.Key); err != nil {
			c.add(at.key("key"), "%q: not a witness verifier key (name+hash+base64): %v", w.Key, err)
		} else if name, _, _ := strings.Cut(w.Key, "+"); seen[name] {
			c.add(at.key("key"), "witness %s listed twice", name)
		} else {
			seen[name] = true
		}
	}
	c.exports(at.key("export"), a.Export)
	if a.DockerSocket != "" {
		c.absPath(at.key("docker_socket"), a.DockerSocket, false)
	}
	if a.ContainerdSocket != "" {
		c.absPath(at.key("containerd_socket"), a.ContainerdSocket, false)
	}
}

// exports checks the OTLP exporters: unique names, an endpoint of the
// protocol's form, known filter values.
func (c *checker) exports(at path, exps []Export) {
	names := map[string]bool{}
	for i, x := range exps {
		at := at.idx(i)
		switch {
		case x.Name == "":
			c.add(at.key("name"), "required")
		case !sandboxName.MatchString(x.Name):
			c.add(at.key("name"), "%q: use letters, digits, '.', '_' and '-'", x.Name)
		case names[x.Name]:
			c.add(at.key("name"), "%q listed twice", x.Name)
		}
		names[x.Name] = true
		switch x.Protocol {
		case "", "grpc":
			if x.Endpoint == "" {
				c.add(at.key("endpoint"), "required (host:port)")
			} else {
				c.hostPort(at.key("endpoint"), x.Endpoint, false)
			}
		case "http":
			if u, err := url.Parse(x.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				c.add(at.key("endpoint"), "%q: want http(s)://host[:port][/path]", x.Endpoint)
			}
		default:
			c.add(at.key("protocol"), "%q: want grpc or http", x.Protocol)
		}
		if (x.TLS.CertFile == "") != (x.TLS.KeyFile == "") {
			c.add(at.key("tls"), "cert_file and key_file go together")
		}
		for k, f := range map[string]string{"ca_file": x.TLS.CAFile, "cert_file": x.TLS.CertFile, "key_file": x.TLS.KeyFile} {
			if f != "" {
				c.absPath(at.key("tls").key(k), f, false)
			}
		}
		for j, k := range x.Filter.Kinds {
			if !slices.Contains(audit.Kinds(), audit.Kind(k)) {
				c.add(at.key("filter").key("kinds").idx(j), "%q is not an event kind", k)
			}
		}
		for j, v := range x.Filter.Verdicts {
			switch audit.Verdict(v) {
			case audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled:
			default:
				c.add(at.key("filter").key("verdicts").idx(j), "%q: want allowed, recorded, denied or killed", v)
			}
		}
		switch x.Filter.MinSeverity {
		case "", "routine", "alert":
		default:
			c.add(at.key("filter").key("min_severity"), "%q: want routine or alert", x.Filter.MinSeverity)
		}
		if x.BatchRecords < 0 {
			c.add(at.key("batch_records"), "must not be negative")
		}
		if x.BufferRecords < 0 {
			c.add(at.key("buffer_records"), "must not be negative")
		}
		if x.RateLimit < 0 || x.RateBurst < 0 {
			c.add(at.key("rate_limit"), "must not be negative")
		}
		c.duration(at.key("batch_interval"), x.BatchInterval)
		c.duration(at.key("metrics_interval"), x.MetricsInterval)
		if d := x.MetricsInterval.Duration; d > 0 && d < time.Second {
			c.add(at.key("metrics_interval"), "%v is below the minimum of 1s", d)
		}
	}
}

var sandboxName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// sandboxValues checks every value present in a sandbox (empty values are
// allowed here: a sandbox as written may rely on its preset).
func (c *checker) sandboxValues(at path, sb *Sandbox) {
	c.tools(at.key("tools"), &sb.Tools)
	c.requirements(at.key("require"), sb.Require)
	if sb.Name != "" && !sandboxName.MatchString(sb.Name) {
		c.add(at.key("name"), "%q: use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit)", sb.Name)
	}
	sel := at.key("select")
	for i, cg := range sb.Select.Cgroups {
		c.absPath(sel.key("cgroups").idx(i), cg, true)
	}
	for i, g := range sb.Select.Globs {
		if _, err := containers.CompileGlob(g); err != nil {
			c.add(sel.key("globs").idx(i), "%v", err)
		}
	}
	for i, ref := range sb.Select.Containers {
		if _, err := containers.ParseRef(ref); err != nil {
			c.add(sel.key("containers").idx(i), "%v", err)
		}
	}
	for k, v := range sb.Select.Labels {
		if k == "" || v == "" {
			c.add(sel.key("labels"), "label %q=%q: key and value must not be empty (\"*\": any value)", k, v)
		}
	}
	if sb.Preset != "" && !isPreset(sb.Preset) {
		c.add(at.key("preset"), "unknown preset %q (want one of %s)", sb.Preset, strings.Join(PresetNames(), ", "))
	}
	if sb.Mode != "" && sb.Mode != ModeEnforce && sb.Mode != ModeRecord {
		c.add(at.key("mode"), "%q: want enforce or record", sb.Mode)
	}
	for i, w := range sb.Workspace {
		c.absPath(at.key("workspace").idx(i), w, true)
	}
	for i := range sb.Files {
		c.fileRule(at.key("files").idx(i), &sb.Files[i], true)
	}
	ops := at.key("operations")
	o := &sb.Operations
	for _, f := range []struct {
		name string
		a    Action
	}{
		{"ptrace", o.Ptrace}, {"mount", o.Mount}, {"module", o.Module}, {"bpf", o.BPF},
		{"kill_agent", o.KillAgent}, {"agent_files", o.AgentFiles}, {"cgroup_write", o.CgroupWrite},
		{"io_uring", o.IOUring}, {"raw_sockets", o.RawSockets}, {"devices", o.Devices},
		{"ia32_syscalls", o.IA32Syscalls}, {"other_processes", o.OtherProcesses}, {"other_ipc", o.OtherIPC},
		{"terminals", o.Terminals}, {"notify_marks", o.NotifyMarks},
	} {
		c.action(ops.key(f.name), f.a, false)
	}
	caps := ops.key("capabilities")
	c.action(caps.key("default"), o.Capabilities.Default, false)
	for i, r := range o.Capabilities.Rules {
		rp := caps.key("rules").idx(i)
		if _, ok := CapabilityNumber(r.Cap); !ok {
			c.add(rp.key("cap"), "unknown capability %q", r.Cap)
		}
		c.action(rp.key("action"), r.Action, true)
	}
	ex := at.key("exec")
	c.action(ex.key("default"), sb.Exec.Default, false)
	for i := range sb.Exec.Rules {
		c.fileRule(ex.key("rules").idx(i), &sb.Exec.Rules[i], false)
	}
	to := ex.key("timeouts")
	c.duration(to.key("warn"), sb.Exec.Timeouts.Warn)
	c.duration(to.key("term"), sb.Exec.Timeouts.Term)
	c.duration(to.key("kill"), sb.Exec.Timeouts.Kill)
	if sb.Exec.CircuitBreaker < 0 {
		c.add(ex.key("circuit_breaker"), "must not be negative")
	}
	dns := at.key("dns")
	if d := sb.DNS.Default; d != "" && d != DNSAllow && d != DNSDeny {
		c.add(dns.key("default"), "%q: want allow or deny", d)
	}
	for i, n := range sb.DNS.Allow {
		c.namePattern(dns.key("allow").idx(i), n)
	}
	for i, n := range sb.DNS.Deny {
		c.namePattern(dns.key("deny").idx(i), n)
	}
	det := dns.key("detection")
	if a := sb.DNS.Detection.Action; a != "" && a != ActionBlock && a != ActionRecord {
		c.add(det.key("action"), "%q: want block or record", a)
	}
	for i, n := range sb.DNS.Detection.HighCardinality {
		if strings.HasPrefix(n, "*") || strings.HasPrefix(n, ".") {
			c.add(det.key("high_cardinality").idx(i), "%q: give the domain itself (it covers the names below it)", n)
			continue
		}
		c.namePattern(det.key("high_cardinality").idx(i), n)
	}
	c.duration(det.key("window"), sb.DNS.Detection.Window)
	if sb.DNS.Detection.MaxDistinctNames < 0 {
		c.add(det.key("max_distinct_names"), "must not be negative")
	}
	if sb.DNS.Detection.InfoBudgetBits < 0 {
		c.add(det.key("info_budget_bits"), "must not be negative")
	}
	if sb.DNS.Detection.RateLimit < 0 {
		c.add(det.key("rate_limit"), "must not be negative")
	}
	eg := at.key("egress")
	if d := sb.Egress.Default; d != "" && d != EgressResolved && d != EgressDeny && d != EgressAllow {
		c.add(eg.key("default"), "%q: want resolved, deny or allow", d)
	}
	if g := sb.Egress.GraceSeconds; g < 0 || g > 86400 {
		c.add(eg.key("grace_seconds"), "%d out of range 0-86400", g)
	}
	c.duration(eg.key("admission_ttl_cap"), sb.Egress.AdmissionTTLCap)
	if d := sb.Egress.AdmissionTTLCap.Duration; d > 24*time.Hour || (d > 0 && d < time.Second) {
		c.add(eg.key("admission_ttl_cap"), "%s out of range 1s-24h", d)
	}
	for i, n := range sb.Egress.NamePorts {
		np := eg.key("name_ports").idx(i)
		c.namePattern(np.key("name"), n.Name)
		if len(n.Ports) == 0 {
			c.add(np.key("ports"), "required: the ports to open at %q's addresses", n.Name)
		} else if len(n.Ports) > MaxEgressNamePorts {
			c.add(np.key("ports"), "%d ports, at most %d per entry", len(n.Ports), MaxEgressNamePorts)
		}
		for j, pr := range n.Ports {
			if _, _, err := pr.Bounds(); err != nil {
				c.add(np.key("ports").idx(j), "%v", err)
			}
		}
		c.protocol(np.key("protocol"), n.Protocol)
	}
	for i, r := range sb.Egress.Allow {
		rp := eg.key("allow").idx(i)
		if r.CIDR == "" {
			c.add(rp.key("cidr"), "required")
		} else if _, err := ParseCIDR(r.CIDR); err != nil {
			c.add(rp.key("cidr"), "%v", err)
		}
		for j, pr := range r.Ports {
			if _, _, err := pr.Bounds(); err != nil {
				c.add(rp.key("ports").idx(j), "%v", err)
			}
		}
		c.protocol(rp.key("protocol"), r.Protocol)
	}
	for i, l := range sb.Egress.Loopback {
		lp := eg.key("loopback").idx(i)
		if l.Port < 1 || l.Port > 65535 {
			c.add(lp.key("port"), "port %d out of range 1-65535", l.Port)
		}
		c.protocol(lp.key("protocol"), l.Protocol)
	}
	for i, u := range sb.Egress.Unix {
		if !strings.HasPrefix(u, "/") || len(u) > 107 {
			c.add(eg.key("unix").idx(i), "%q: want an absolute socket path (at most 107 bytes)", u)
		}
	}
	nm := eg.key("names")
	if sb.Egress.Names.Bind && sb.Egress.Default != "" && sb.Egress.Default != EgressResolved {
		c.add(nm.key("bind"), "needs egress default resolved (names are bound to the DNS proxy's answers)")
	}
	for i, n := range sb.Egress.Names.ReadOnly {
		c.namePattern(nm.key("read_only").idx(i), n)
	}
	for i, n := range sb.Egress.Names.Inspect {
		c.namePattern(nm.key("inspect").idx(i), n)
		if !sb.Egress.Names.Bind {
			c.add(nm.key("inspect").idx(i), "inspect needs names.bind: true (the relay terminates TLS)")
		}
	}
	for i, n := range sb.Egress.Names.ECH {
		c.namePattern(nm.key("ech").idx(i), n)
	}
	for i, sec := range sb.Egress.Names.Secrets {
		sp := nm.key("secrets").idx(i)
		if !sb.Egress.Names.Bind {
			c.add(sp, "secrets need names.bind: true (the relay swaps the placeholders)")
		}
		if !secretNameRE.MatchString(sec.Name) {
			c.add(sp.key("name"), "%q: want letters, digits, - and _", sec.Name)
		}
		if !envNameRE.MatchString(sec.Env) {
			c.add(sp.key("env"), "%q: want an environment variable name", sec.Env)
		}
		if (sec.FromEnv == "") == (sec.FromFile == "") {
			c.add(sp, "give exactly one of from_env and from_file")
		}
		if sec.FromFile != "" && !strings.HasPrefix(sec.FromFile, "/") {
			c.add(sp.key("from_file"), "%q: want an absolute path", sec.FromFile)
		}
		if len(sec.Hosts) == 0 {
			c.add(sp.key("hosts"), "required: the names the secret may be sent to")
		}
		for j, h := range sec.Hosts {
			c.namePattern(sp.key("hosts").idx(j), h)
		}
	}
	for i, pr := range sb.Egress.Names.UnnamedPorts {
		if _, _, err := pr.Bounds(); err != nil {
			c.add(nm.key("unnamed_ports").idx(i), "%v", err)
		}
	}
	c.listen(at.key("listen"), &sb.Listen)
	au := at.key("audit")
	if r := sb.Audit.SampleRate; r < 0 || r > 1 {
		c.add(au.key("sample_rate"), "%v out of range [0, 1] (0 = agent default)", r)
	}
	if f := sb.Audit.FileOpens; f != "" && f != FileOpensNone && f != FileOpensWrites && f != FileOpensAll {
		c.add(au.key("file_opens"), "%q: want none, writes or all", f)
	}
	es := at.key("escape")
	if sb.Escape.Threshold < 0 {
		c.add(es.key("threshold"), "must not be negative")
	}
	c.duration(es.key("window"), sb.Escape.Window)
	if a := sb.Escape.Action; a != "" && a != EscapeFreeze && a != EscapeAlert {
		c.add(es.key("action"), "%q: want freeze or alert", a)
	}
	if sc := sb.Escape.Scope; sc != "" && sc != EscapeScopeLeaf && sc != EscapeScopeSandbox {
		c.add(es.key("scope"), "%q: want leaf or sandbox", sc)
	}
	c.duration(at.key("canary").key("interval"), sb.Canary.Interval)
	if d := sb.Canary.Interval.Duration; d > 0 && d < MinCanaryInterval {
		c.add(at.key("canary").key("interval"), "%s is shorter than the minimum %s", d, MinCanaryInterval)
	}
	if a := sb.OnCanaryFailure; a != "" && a != CanaryAlert && a != CanaryFreeze {
		c.add(at.key("on_canary_failure"), "%q: want alert or freeze", a)
	}
	c.workspaceValues(at, sb)
}

// sandboxRequired checks what an effective (preset-merged) sandbox must
// have, and relations between fields.
func (c *checker) sandboxRequired(at path, sb *Sandbox) {
	c.workspaceRequired(at, sb)
	if sb.Name == "" {
		c.add(at.key("name"), "required")
	}
	if len(sb.Select.Cgroups)+len(sb.Select.Globs)+len(sb.Select.Containers)+len(sb.Select.Labels) == 0 {
		c.add(at.key("select"), "select at least one cgroup, glob, container or label")
	}
	if sb.Mode == "" {
		c.add(at.key("mode"), "required (enforce or record)")
	}
	if sb.DNS.Default == "" {
		c.add(at.key("dns", "default"), "required (allow or deny)")
	}
	if sb.Egress.Default == "" {
		c.add(at.key("egress", "default"), "required (resolved, deny or allow)")
	}
	to := sb.Exec.Timeouts
	stages := []struct {
		name string
		d    time.Duration
	}{{"warn", to.Warn.Duration}, {"term", to.Term.Duration}, {"kill", to.Kill.Duration}}
	prev := -1
	for i, s := range stages {
		if s.d == 0 {
			continue
		}
		if prev >= 0 && s.d <= stages[prev].d {
			c.add(at.key("exec", "timeouts", s.name), "%v must be later than %s (%v)", s.d, stages[prev].name, stages[prev].d)
		}
		prev = i
	}
	if sb.Exec.CircuitBreaker > 0 && to.Kill.Duration == 0 {
		c.add(at.key("exec", "circuit_breaker"), "counts hard timeouts, so exec.timeouts.kill must be set")
	}
	if sb.DNS.Detection.Enabled {
		det := at.key("dns", "detection")
		if sb.DNS.Detection.Window.Duration <= 0 {
			c.add(det.key("window"), "required when detection is enabled")
		}
		if sb.DNS.Detection.Action == "" {
			c.add(det.key("action"), "required when detection is enabled (block or record)")
		}
	}
	if sb.Escape.Enabled {
		es := at.key("escape")
		if sb.Escape.Threshold <= 0 {
			c.add(es.key("threshold"), "must be positive when the escape watch is enabled")
		}
		if sb.Escape.Window.Duration <= 0 {
			c.add(es.key("window"), "must be positive when the escape watch is enabled")
		}
		if sb.Escape.Action == "" {
			c.add(es.key("action"), "required when the escape watch is enabled (freeze or alert)")
		}
	}
}

// listen checks a sandbox's listen section.
func (c *checker) listen(at path, l *Listen) {
	switch l.Action {
	case "", ActionBlock, ActionRecord, ActionAllow:
	case ActionKill:
		c.add(at.key("action"), "kill: the bind hooks refuse, they cannot kill; want block, record or allow")
	default:
		c.add(at.key("action"), "%q: want block, record or allow", l.Action)
	}
	if len(l.Ports) > MaxListenPorts {
		c.add(at.key("ports"), "%d entries, at most %d (use ranges: \"9000-9100\")", len(l.Ports), MaxListenPorts)
	}
	for i, pr := range l.Ports {
		if _, _, err := pr.Bounds(); err != nil {
			c.add(at.key("ports").idx(i), "%v", err)
		}
	}
}

func (c *checker) action(at path, a Action, required bool) {
	switch a {
	case ActionAllow, ActionRecord, ActionBlock, ActionKill:
	case "":
		if required {
			c.add(at, "required (allow, record, block or kill)")
		}
	default:
		c.add(at, "%q: want allow, record, block or kill", a)
	}
}

func (c *checker) protocol(at path, p Protocol) {
	switch p {
	case "", ProtoTCP, ProtoUDP, ProtoAny:
	default:
		c.add(at, "%q: want tcp, udp or any", p)
	}
}

func (c *checker) fileRule(at path, r *FileRule, withAccess bool) {
	switch {
	case r.Path == "":
		c.add(at.key("path"), "required")
	case r.Path == workspaceVar || strings.HasPrefix(r.Path, workspaceVar+"/"):
		if rest := strings.TrimPrefix(r.Path, workspaceVar); rest != "" && filepath.Clean(rest) != strings.TrimSuffix(rest, "/") {
			c.add(at.key("path"), "%q is not a clean path", r.Path)
		}
	default:
		c.absPath(at.key("path"), r.Path, true)
		for _, comp := range strings.Split(r.Path, "/") {
			if strings.Contains(comp, "*") && comp != "*" {
				c.add(at.key("path"), "%q: '*' must be a whole path component", r.Path)
				break
			}
		}
	}
	switch r.Match {
	case MatchExact, MatchPrefix:
	case "":
		c.add(at.key("match"), "required (exact or prefix)")
	default:
		c.add(at.key("match"), "%q: want exact or prefix", r.Match)
	}
	if withAccess {
		switch r.Access {
		case AccessRead, AccessWrite, AccessAny:
		case "":
			c.add(at.key("access"), "required (read, write or any)")
		default:
			c.add(at.key("access"), "%q: want read, write or any", r.Access)
		}
	} else if r.Access != "" {
		c.add(at.key("access"), "exec rules have no access")
	}
	c.action(at.key("action"), r.Action, true)
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

// namePattern checks "example.com", "*.example.com" or ".example.com".
func (c *checker) namePattern(at path, n string) {
	name := strings.TrimSuffix(strings.ToLower(n), ".")
	name = strings.TrimPrefix(strings.TrimPrefix(name, "*."), ".")
	if name == "" || len(name) > 253 {
		c.add(at, "%q is not a domain name", n)
		return
	}
	for _, l := range strings.Split(name, ".") {
		if !dnsLabel.MatchString(l) {
			c.add(at, "%q: label %q is not a valid DNS label", n, l)
			return
		}
	}
}

var (
	secretNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)
