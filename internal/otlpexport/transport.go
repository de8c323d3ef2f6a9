package otlpexport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// transport sends one request and returns how many records the Collector
// rejected (OTLP partial success).
type transport interface {
	// export sends an encoded ExportLogsServiceRequest.
	export(ctx context.Context, req []byte) (rejected uint64, err error)
	exportMetrics(ctx context.Context, req *colmetrics.ExportMetricsServiceRequest) error
	close() error
}

// permanentError is a refusal that retrying cannot change (a malformed
// request, an unknown endpoint); the batch is counted as rejected.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

func newTransport(c *Config) (transport, error) {
	if c.Protocol == ProtocolHTTP {
		return newHTTP(c)
	}
	return newGRPC(c)
}

// send exports one batch with the request timeout. It runs on the
// exporter's goroutine alone, which owns e.buf.
func (e *Exporter) send(ctx context.Context, batch []*item) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	e.buf = e.encodeRequest(e.buf, batch)
	return e.tr.export(ctx, e.buf)
}

// rawRequest is an already encoded request; rawCodec sends it as is and
// decodes responses as protobuf.
type rawRequest []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	if r, ok := v.(rawRequest); ok {
		return r, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

type grpcTransport struct {
	conn    *grpc.ClientConn
	metrics colmetrics.MetricsServiceClient
	md      metadata.MD
}

func newGRPC(c *Config) (transport, error) {
	creds := insecure.NewCredentials()
	if !c.Insecure {
		tc, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	// Reconnect within seconds of a Collector coming back (gRPC's default
	// backoff grows to two minutes), so the buffer drains soon after.
	conn, err := grpc.NewClient(c.Endpoint, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second,
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}}))
	if err != nil {
		return nil, fmt.Errorf("export %s: %w", c.Name, err)
	}
	md := metadata.MD{}
	for k, v := range c.Headers {
		md.Append(strings.ToLower(k), v)
	}
	return &grpcTransport{conn: conn, metrics: colmetrics.NewMetricsServiceClient(conn), md: md}, nil
}

func (g *grpcTransport) export(ctx context.Context, req []byte) (uint64, error) {
	if len(g.md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, g.md)
	}
	resp := new(collogs.ExportLogsServiceResponse)
	err := g.conn.Invoke(ctx, collogs.LogsService_Export_FullMethodName, rawRequest(req), resp, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
			return 0, &permanentError{fmt.Errorf("otlp grpc export: %w", err)}
		}
		return 0, fmt.Errorf("otlp grpc export: %w", err)
	}
	if ps := resp.GetPartialSuccess(); ps != nil {
		return uint64(ps.GetRejectedLogRecords()), nil
	}
	return 0, nil
}

func (g *grpcTransport) exportMetrics(ctx context.Context, req *colmetrics.ExportMetricsServiceRequest) error {
	if len(g.md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, g.md)
	}
	if _, err := g.metrics.Export(ctx, req); err != nil {
		return fmt.Errorf("otlp grpc metrics export: %w", err)
	}
	return nil
}

func (g *grpcTransport) close() error { return g.conn.Close() }

type httpTransport struct {
	url     string
	metrics string // the /v1/metrics URL beside url
	client  *http.Client
	headers map[string]string
}

func newHTTP(c *Config) (transport, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("export %s: endpoint: %w", c.Name, err)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/logs"
	}
	mu := *u
	mu.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/logs")
	if mu.Path == u.Path {
		mu.Path += "/v1"
	}
	mu.Path += "/metrics"
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if u.Scheme == "https" {
		tc, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = tc
	}
	return &httpTransport{url: u.String(), metrics: mu.String(), client: &http.Client{Transport: tr}, headers: c.Headers}, nil
}

func (h *httpTransport) export(ctx context.Context, req []byte) (uint64, error) {
	data, err := h.post(ctx, h.url, req)
	if err != nil {
		return 0, err
	}
	var out collogs.ExportLogsServiceResponse
	if proto.Unmarshal(data, &out) == nil && out.GetPartialSuccess() != nil {
		return uint64(out.GetPartialSuccess().GetRejectedLogRecords()), nil
	}
	return 0, nil
}

func (h *httpTransport) exportMetrics(ctx context.Context, req *colmetrics.ExportMetricsServiceRequest) error {
	body, err := proto.Marshal(req)
	if err != nil {
		return &permanentError{fmt.Errorf("otlp http metrics export: encode: %w", err)}
	}
	_, err = h.post(ctx, h.metrics, body)
	return err
}

// post sends one OTLP/HTTP protobuf request and returns the response body.
func (h *httpTransport) post(ctx context.Context, url string, body []byte) ([]byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, &permanentError{fmt.Errorf("otlp http export: %w", err)}
	}
	r.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	resp, err := h.client.Do(r)
	if err != nil {
		return nil, fmt.Errorf("otlp http export: %w", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusOK:
		return data, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusBadGateway ||
		resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout:
		return nil, fmt.Errorf("otlp http export: %s", resp.Status)
	default:
		return nil, &permanentError{fmt.Errorf("otlp http export: %s", resp.Status)}
	}
}

func (h *httpTransport) close() error { h.client.CloseIdleConnections(); return nil }
