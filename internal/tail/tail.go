// Package tail streams live events from the agent to `watcher tail`
// clients over a root-only unix socket.
//
// Protocol: the client writes one JSON Filter line; the server answers with
// one JSON Message per line. A client that cannot keep up is dropped with a
// final notice message, and the drop is counted: a slow reader never slows
// the agent.
package tail

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// DefaultSocket is the agent's live-event socket.
const DefaultSocket = "/run/watcher/events.sock"

// Filter selects events; empty fields match everything.
type Filter struct {
	// Sandboxes: names (or decimal cgroup ids) to keep.
	Sandboxes []string `json:"sandboxes,omitempty"`
	// Kinds to keep.
	Kinds []audit.Kind `json:"kinds,omitempty"`
	// Verdicts to keep.
	Verdicts []audit.Verdict `json:"verdicts,omitempty"`
	// Since drops events older than this time.
	Since time.Time `json:"since,omitzero"`
}

// Match reports whether e passes the filter.
func (f *Filter) Match(e *audit.Event) bool {
	if len(f.Sandboxes) > 0 && !slices.Contains(f.Sandboxes, e.Sandbox.Name) &&
		!slices.Contains(f.Sandboxes, fmt.Sprint(e.Sandbox.CgroupID)) {
		return false
	}
	if len(f.Kinds) > 0 && !slices.Contains(f.Kinds, e.Kind) {
		return false
	}
	if len(f.Verdicts) > 0 && !slices.Contains(f.Verdicts, e.Verdict) {
		return false
	}
	if !f.Since.IsZero() && e.Time.Before(f.Since) {
		return false
	}
	return true
}

// Message is one line from the server: an event, or a notice.
type Message struct {
	Event  *audit.Event `json:"event,omitempty"`
	Notice string       `json:"notice,omitempty"`
}

// Server accepts tail clients and implements audit.Sink.
type Server struct {
	ln        net.Listener
	queueSize int

	mu      sync.Mutex
	clients map[*client]struct{}
	dropped atomic.Uint64 // clients dropped for being slow
	wg      sync.WaitGroup
}

type client struct {
	conn   net.Conn
	filter Filter
	ch     chan audit.Event
	once   sync.Once
	slow   atomic.Bool
}

// Listen creates the socket at path (directory 0700, socket 0600), replacing
// a stale socket left by a killed agent.
func Listen(path string, queueSize int) (*Server, error) {
	if queueSize <= 0 {
		queueSize = 4096
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("tail socket dir: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("tail socket %s: another agent is listening", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("tail socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("tail socket: %w", err)
	}
	s := &Server{ln: ln, queueSize: queueSize, clients: map[*client]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the socket path.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// DroppedClients counts clients dropped for falling behind.
func (s *Server) DroppedClients() uint64 { return s.dropped.Load() }

// Clients is the number of connected clients.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.serve(conn)
	}
}

func (s *Server) serve(conn net.Conn) {
	defer s.wg.Done()
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(conn, 64*1024)).ReadBytes('\n')
	if err != nil {
		return
	}
	c := &client{conn: conn, ch: make(chan audit.Event, s.queueSize)}
	if err := json.Unmarshal(line, &c.filter); err != nil {
		json.NewEncoder(conn).Encode(Message{Notice: "bad filter: " + err.Error()})
		return
	}
	conn.SetReadDeadline(time.Time{})
	s.mu.Lock()
	s.clients[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.clients, c)
		s.mu.Unlock()
	}()
	// Notice the client hanging up even when no events flow.
	gone := make(chan struct{})
	go func() { io.Copy(io.Discard, conn); close(gone) }()

	w := bufio.NewWriter(conn)
	enc := json.NewEncoder(w)
	for {
		select {
		case e, ok := <-c.ch:
			if !ok {
				enc.Encode(Message{Notice: "dropped: this client fell behind the event stream"})
				w.Flush()
				return
			}
			if err := enc.Encode(Message{Event: &e}); err != nil {
				return
			}
			if len(c.ch) == 0 {
				conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if err := w.Flush(); err != nil {
					return
				}
			}
		case <-gone:
			return
		}
	}
}

// Notify hands e to every interested client without blocking; a client
// whose queue is full is dropped.
func (s *Server) Notify(e audit.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.clients {
		if c.slow.Load() || !c.filter.Match(&e) {
			continue
		}
		select {
		case c.ch <- e:
		default:
			c.slow.Store(true)
			s.dropped.Add(1)
			c.once.Do(func() { close(c.ch) })
		}
	}
	return nil
}

// Close stops accepting, disconnects clients and removes the socket.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.clients {
		c.conn.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// ErrAgentNotRunning is returned by Dial when nothing listens on the socket.
var ErrAgentNotRunning = errors.New("the watcher agent is not running (no live-event socket)")

// Dial connects to the agent and sends the filter.
func Dial(path string, f Filter) (*Stream, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscallECONNREFUSED) {
			return nil, fmt.Errorf("%w: %s", ErrAgentNotRunning, path)
		}
		return nil, fmt.Errorf("connect to agent at %s: %w", path, err)
	}
	b, _ := json.Marshal(f)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		conn.Close()
		return nil, fmt.Errorf("send filter: %w", err)
	}
	return &Stream{conn: conn, dec: json.NewDecoder(bufio.NewReader(conn))}, nil
}

// Stream reads messages from the agent.
type Stream struct {
	conn net.Conn
	dec  *json.Decoder
}

// Next returns the next message; io.EOF when the agent closes the stream.
func (s *Stream) Next() (Message, error) {
	var m Message
	err := s.dec.Decode(&m)
	return m, err
}

// Close ends the stream.
func (s *Stream) Close() error { return s.conn.Close() }
