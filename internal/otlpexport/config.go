// Package otlpexport sends the ledger's records to an OpenTelemetry
// Collector as OTLP log records (gRPC or HTTP/protobuf), in sequence
// order, with what a central store needs to prove them: every record
// carries its ledger sequence number and leaf hash and its body is the
// ledger line itself; records an exporter leaves out (filtered, held back
// by the rate limit, dropped when its buffer is full) are covered by gap
// records carrying the Merkle subtree hashes of what was left out; the
// ledger's signed checkpoints are exported too. Verify (verify.go) checks
// a Collector's copy against them.
//
// The exporter is fed by the ledger's tap (ledger.Tap), which runs under
// the ledger's lock: Tap only copies into a bounded queue and never
// waits. Sending, retrying and loss reporting happen on the exporter's
// own goroutine.
package otlpexport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// Protocols.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http"
)

// Config is one exporter: where to send, what, and how much to hold.
type Config struct {
	// Name identifies the exporter in loss records and metrics.
	Name string
	// Protocol is grpc or http (OTLP/HTTP with protobuf bodies).
	Protocol string
	// Endpoint is host:port for grpc; for http a URL, to which /v1/logs
	// is added when it has no path.
	Endpoint string
	// Insecure sends in plaintext (gRPC; for http the URL's scheme says).
	Insecure bool
	// TLS files; empty uses the system roots.
	CAFile, CertFile, KeyFile, ServerName string
	// Headers are sent with every request (gRPC metadata or HTTP headers).
	Headers map[string]string
	Filter  Filter
	// BatchRecords is the most records per request (default 512).
	BatchRecords int
	// BatchInterval is how long a partial batch waits (default 1s).
	BatchInterval time.Duration
	// BufferRecords bounds the records held while the Collector is slow or
	// away (default 65536); beyond it records are dropped, counted and
	// covered by a gap record.
	BufferRecords int
	// RateLimit is records/s per sandbox (0: none), RateBurst the bucket.
	RateLimit float64
	RateBurst int
	// Timeout bounds one request (default 10s).
	Timeout time.Duration
	// CursorFile keeps how far the Collector acknowledged, so a restarted
	// agent sends what the last run could not (empty: no resume).
	CursorFile string
}

// Filter selects the records an exporter sends. Empty lists match all.
// Loss records and the exporter's own records always pass: a central
// store must learn what it is missing.
type Filter struct {
	Sandboxes   []string
	Kinds       []audit.Kind
	Verdicts    []audit.Verdict
	MinSeverity audit.Severity // routine (default) or alert
}

func (c *Config) withDefaults() {
	if c.Protocol == "" {
		c.Protocol = ProtocolGRPC
	}
	if c.BatchRecords <= 0 {
		c.BatchRecords = 512
	}
	if c.BatchInterval <= 0 {
		c.BatchInterval = time.Second
	}
	if c.BufferRecords <= 0 {
		c.BufferRecords = 65536
	}
	if c.BufferRecords < c.BatchRecords {
		c.BatchRecords = c.BufferRecords
	}
	if c.RateLimit > 0 && c.RateBurst <= 0 {
		c.RateBurst = max(1, int(2*c.RateLimit))
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
}

// Validate checks c and returns the first problem.
func (c *Config) Validate() error {
	switch c.Protocol {
	case "", ProtocolGRPC:
		if c.Endpoint == "" {
			return fmt.Errorf("export %s: endpoint required (host:port)", c.Name)
		}
	case ProtocolHTTP:
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("export %s: endpoint %q: want http(s)://host[:port][/path]", c.Name, c.Endpoint)
		}
	default:
		return fmt.Errorf("export %s: protocol %q: want grpc or http", c.Name, c.Protocol)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("export %s: cert_file and key_file go together", c.Name)
	}
	switch c.Filter.MinSeverity {
	case "", audit.SeverityRoutine, audit.SeverityAlert:
	default:
		return fmt.Errorf("export %s: min_severity %q: want routine or alert", c.Name, c.Filter.MinSeverity)
	}
	if c.RateLimit < 0 {
		return fmt.Errorf("export %s: rate_limit must not be negative", c.Name)
	}
	return nil
}

// tlsConfig builds the client TLS configuration from the files.
func (c *Config) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("export %s: ca_file: %w", c.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("export %s: ca_file %s: no PEM certificates", c.Name, c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("export %s: client certificate: %w", c.Name, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// selected reports whether the filter lets ev through.
func (f *Filter) selected(ev *audit.Event) bool {
	if ev.Kind == audit.KindLoss || ev.Mechanism == mechanism {
		return true
	}
	if len(f.Sandboxes) > 0 && !slices.Contains(f.Sandboxes, ev.Sandbox.Name) {
		return false
	}
	if len(f.Kinds) > 0 && !slices.Contains(f.Kinds, ev.Kind) {
		return false
	}
	if len(f.Verdicts) > 0 && !slices.Contains(f.Verdicts, ev.Verdict) {
		return false
	}
	if f.MinSeverity == audit.SeverityAlert && ev.Severity != audit.SeverityAlert {
		return false
	}
	return true
}
