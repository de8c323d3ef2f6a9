package namerelay

// HTTP/2 on terminated names. A client that negotiates h2 with the relay
// gets an HTTP/2 server (golang.org/x/net/http2) whose handler judges
// every stream as checkRequest judges an HTTP/1.1 request, and answers a
// refusal on that stream alone: the other streams of the connection go
// on. Judged requests go upstream through a transport of the connection's
// own that dials only the original destination, verifies its certificate
// for the TLS name, and speaks HTTP/2 where the destination offers h2 in
// ALPN, HTTP/1.1 otherwise.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/watcherhq/watcher/internal/audit"
)

const (
	// h2MaxStreams bounds a client connection's concurrent streams.
	h2MaxStreams = 100
	// h2UpstreamConns bounds the upstream connections one client
	// connection opens when the destination speaks only HTTP/1.1 (over
	// HTTP/2 every stream shares one).
	h2UpstreamConns = 8
	// h2MaxProtocolEvents bounds the protocol errors recorded for one
	// connection: a client cannot flood the record with bad frames.
	h2MaxProtocolEvents = 8
)

var (
	errUpstreamDial = errors.New("the destination refused the connection")
	errUpstreamCert = errors.New("the destination's certificate does not verify")
)

// h2Conn is the terminated TLS connection with the preface, already
// read, in front of it. It keeps ConnectionState visible to the HTTP/2
// server, which refuses TLS below 1.2 and weak ciphers by it.
type h2Conn struct {
	*tls.Conn
	r io.Reader
}

func (c *h2Conn) Read(b []byte) (int, error) { return c.r.Read(b) }

// h2Relay serves one terminated HTTP/2 connection.
type h2Relay struct {
	s        *session
	sni      string
	tr       *http.Transport
	proxy    *httputil.ReverseProxy
	handlers sync.WaitGroup
	passOnce sync.Once

	mu        sync.Mutex
	protoErrs map[string]bool
	connErr   bool // a connection error was recorded
	closed    bool // ServeConn returned: no handler starts after Wait
}

// serveH2 serves the client's HTTP/2 connection (ALPN h2) for sni until
// either side closes it.
func (s *session) serveH2(client *tls.Conn, sni string) {
	client.SetReadDeadline(time.Now().Add(s.r.cfg.HelloTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	n, err := io.ReadFull(client, preface)
	if n == 0 {
		return // hung up, or silent: nothing was sent anywhere
	}
	client.SetReadDeadline(time.Time{})
	if err != nil || string(preface) != http2.ClientPreface {
		why := fmt.Sprintf("malformed HTTP/2 from the client: it negotiated h2 but sent %s, not the HTTP/2 connection preface", quote(string(preface[:n])))
		s.deny(sni, why)
		client.SetWriteDeadline(time.Now().Add(time.Second))
		fr := http2.NewFramer(client, nil)
		fr.WriteSettings()
		fr.WriteGoAway(0, http2.ErrCodeProtocol, []byte("watcher: "+why))
		return
	}

	h := &h2Relay{s: s, sni: sni, protoErrs: map[string]bool{}}
	h.tr = &http.Transport{
		DialTLSContext:      h.dialUpstream,
		ForceAttemptHTTP2:   true,
		MaxConnsPerHost:     h2UpstreamConns,
		MaxIdleConnsPerHost: h2UpstreamConns, // kept, not redialled per request
		IdleConnTimeout:     30 * time.Second,
		// The client's Accept-Encoding goes as sent and the body comes
		// back as the destination sent it.
		DisableCompression: true,
	}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// dialUpstream dials the original destination whatever the
			// URL says; the URL's host keys the transport's pool and
			// Host stays the judged name.
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", sni
		},
		Transport:    h.tr,
		ErrorHandler: h.upstreamFailed,
		ErrorLog:     log.New(io.Discard, "", 0),
	}
	srv := &http2.Server{MaxConcurrentStreams: h2MaxStreams, CountError: h.countError}
	srv.ServeConn(&h2Conn{Conn: client, r: io.MultiReader(bytes.NewReader(preface), client)}, &http2.ServeConnOpts{
		Handler: h,
		// The server reports connection errors only in its error log:
		// they are read from there and recorded, never printed.
		BaseConfig: &http.Server{ErrorLog: log.New(h2ErrorLog{h}, "", 0)},
	})
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.handlers.Wait()
	h.tr.CloseIdleConnections()
}

// enter counts a running handler, unless the connection is done.
func (h *h2Relay) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.handlers.Add(1)
	return true
}

// ServeHTTP judges one stream and relays it when it passes.
func (h *h2Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if !h.enter() {
		return // the connection is gone; its transport is closing
	}
	defer h.handlers.Done()
	answer := func(code int, body string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
	if req.Method == http.MethodConnect {
		// A tunnel's bytes would pass unjudged and unsubstituted; not
		// even record-only mode can relay what it does not read.
		name := req.Host
		if h, _, err := net.SplitHostPort(name); err == nil {
			name = h
		}
		h.s.deny(normName(name), "CONNECT over HTTP/2 on a terminated name: a tunnel's bytes would not be judged")
		answer(http.StatusMethodNotAllowed, "watcher: CONNECT (a tunnel) is not relayed on a name watcher terminates TLS for\n")
		return
	}
	if !h.s.checkRequest(req, h.sni, answer) {
		return
	}
	h.proxy.ServeHTTP(w, req)
}

// dialUpstream opens verified TLS to the original destination, offering
// h2 and http/1.1.
func (h *h2Relay) dialUpstream(ctx context.Context, _, _ string) (net.Conn, error) {
	raw, err := h.s.dial()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUpstreamDial, err)
	}
	up := tls.Client(raw, &tls.Config{ServerName: h.sni, RootCAs: h.s.r.cfg.UpstreamRoots, NextProtos: []string{"h2", "http/1.1"}})
	hctx, cancel := context.WithTimeout(ctx, h.s.r.cfg.DialTimeout)
	defer cancel()
	if err := up.HandshakeContext(hctx); err != nil {
		raw.Close()
		var verr *tls.CertificateVerificationError
		if errors.As(err, &verr) {
			h.s.refuse(h.sni, "terminated TLS: the destination's certificate does not verify: "+err.Error(), nil)
			return nil, fmt.Errorf("%w: %w", errUpstreamCert, err)
		}
		return nil, fmt.Errorf("%w: TLS: %w", errUpstreamDial, err)
	}
	h.passOnce.Do(h.s.passed)
	return up, nil
}

// upstreamFailed answers a stream the destination could not take.
func (h *h2Relay) upstreamFailed(w http.ResponseWriter, req *http.Request, err error) {
	if req.Context().Err() != nil {
		return // the client cancelled the stream or went away
	}
	body := "watcher: the destination did not answer\n"
	switch {
	case errors.Is(err, errUpstreamCert):
		body = "watcher: the destination's certificate does not verify\n"
	case errors.Is(err, errUpstreamDial):
		body = "watcher: the destination refused the connection\n"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, body)
}

// countError receives the HTTP/2 server's error types
// ("conn_PROTOCOL_ERROR_headers_even", "frame_data_stream_0",
// "stream_PROTOCOL_ERROR_bad_path_method"); the protocol violations are
// recorded. A stream closed or refused for flow control is not a
// malformed client.
func (h *h2Relay) countError(errType string) {
	switch {
	case strings.HasPrefix(errType, "conn_"), strings.HasPrefix(errType, "frame_"):
		h.protocolError(errType, true)
	case strings.HasPrefix(errType, "stream_PROTOCOL_ERROR_"):
		h.protocolError(errType, false)
	}
}

// protocolError records a malformed frame sequence once per kind; the
// server answers it (GOAWAY or RST_STREAM with PROTOCOL_ERROR). conn says
// it ends the connection: the server's log line for the same error is
// then not recorded again.
func (h *h2Relay) protocolError(detail string, conn bool) {
	h.mu.Lock()
	skip := h.protoErrs[detail] || len(h.protoErrs) >= h2MaxProtocolEvents || (conn && h.connErr)
	if !skip {
		h.protoErrs[detail] = true
		h.connErr = h.connErr || conn
	}
	h.mu.Unlock()
	if !skip {
		h.s.deny(h.sni, "malformed HTTP/2 from the client: "+detail)
	}
}

// h2ErrorLog reads the HTTP/2 server's log lines for connection errors
// that reach no CountError (a frame out of order: CONTINUATION without
// HEADERS, another frame inside a header block).
type h2ErrorLog struct{ h *h2Relay }

func (l h2ErrorLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	// "http2: server connection error from 127.0.0.1:5555: connection error: PROTOCOL_ERROR"
	if _, rest, ok := strings.Cut(line, "server connection error from "); ok {
		if _, detail, ok := strings.Cut(rest, ": "); ok {
			l.h.protocolError(detail+" (a frame out of sequence or unreadable)", true)
		}
	} else if _, detail, ok := strings.Cut(line, "server closing client connection: "); ok {
		l.h.protocolError(detail, true)
	}
	return len(p), nil
}

// deny records a refusal that record-only mode cannot let through: what
// the client sent cannot be relayed at all.
func (s *session) deny(name, why string) {
	s.r.stats.refused.Add(1)
	s.r.event(s.info, s.pol, audit.VerdictDenied, name, why)
}
