// Package otelcoltest runs a real OpenTelemetry Collector for tests: the
// one test/otelcol builds from the Collector's Go modules (OTLP receiver
// on gRPC and HTTP, file exporter writing OTLP JSON lines).
package otelcoltest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// collectorBinary returns a real OpenTelemetry Collector built from the
// Collector's Go modules (test/otelcol: OTLP receiver, file exporter):
// $WATCHER_OTELCOL, or built once into the user cache, keyed by the
// module's files.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("WATCHER_OTELCOL"); p != "" {
		return p
	}
	src, err := sourceDir()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatalf("collector source: %v", err)
		}
		h.Write(data)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "watcher", "otelcol-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	t.Logf("building the OpenTelemetry Collector from test/otelcol into %s (once)", bin)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build collector: %v\n%s", err, out)
	}
	return bin
}

// Collector is a running Collector writing what it receives to Out.
type Collector struct {
	t          testing.TB
	bin, dir   string
	GRPC, HTTP string // host:port of the OTLP receivers
	Out        string // the file exporter's output
	cmd        *exec.Cmd
}

// sourceDir finds test/otelcol from this file's package directory or any
// directory above the working directory.
func sourceDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "test", "otelcol")
		if _, err := os.Stat(filepath.Join(p, "main.go")); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("test/otelcol not found above the working directory")
		}
		dir = parent
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs a Collector for the test; it is stopped at cleanup.
func Start(t testing.TB) *Collector { return start(t, "", "") }

// StartTLS runs a Collector whose receivers serve TLS with the given
// certificate and key files.
func StartTLS(t testing.TB, certFile, keyFile string) *Collector { return start(t, certFile, keyFile) }

func start(t testing.TB, certFile, keyFile string) *Collector {
	t.Helper()
	tls := ""
	if certFile != "" {
		tls = fmt.Sprintf("\n        tls:\n          cert_file: %s\n          key_file: %s", certFile, keyFile)
	}
	c := &Collector{t: t, bin: Binary(t), dir: t.TempDir(), GRPC: freePort(t), HTTP: freePort(t)}
	c.Out = filepath.Join(c.dir, "logs.json")
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s%s
      http:
        endpoint: %s%s
exporters:
  file:
    path: %s
    append: true
    flush_interval: 50ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    logs:
      receivers: [otlp]
      exporters: [file]
    metrics:
      receivers: [otlp]
      exporters: [file]
`, c.GRPC, tls, c.HTTP, tls, c.Out)
	if err := os.WriteFile(filepath.Join(c.dir, "config.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Restart()
	t.Cleanup(c.Stop)
	return c
}

// Restart runs the collector (again, after Stop, on the same ports and
// file) and waits for both receivers to listen.
func (c *Collector) Restart() {
	c.t.Helper()
	log, err := os.OpenFile(filepath.Join(c.dir, "collector.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	c.cmd = exec.Command(c.bin, "--config", filepath.Join(c.dir, "config.yaml"))
	c.cmd.Stdout, c.cmd.Stderr = log, log
	if err := c.cmd.Start(); err != nil {
		c.t.Fatalf("start collector: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range []string{c.GRPC, c.HTTP} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				data, _ := os.ReadFile(filepath.Join(c.dir, "collector.log"))
				c.t.Fatalf("collector did not listen on %s: %s", addr, data)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Stop ends the collector (SIGTERM: it flushes the file) and waits.
func (c *Collector) Stop() {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
	c.cmd = nil
}
