package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// HoldRequest asks the agent to hold a tool call for a human (`watcher
// approve` on the agent's approvals socket): `watcher mcp wrap` under a
// running agent, whose gateway keeps the approvals.
type HoldRequest struct {
	Sandbox         string        `json:"sandbox"`
	Session         string        `json:"session"`
	CallID          string        `json:"call_id"`
	Tool            string        `json:"tool"`
	Arguments       string        `json:"arguments"`
	ArgumentsSHA256 string        `json:"arguments_sha256"`
	Rule            string        `json:"rule"`
	Why             string        `json:"why"`
	Peer            string        `json:"peer,omitempty"`
	Timeout         time.Duration `json:"timeout"`
}

// HoldAnswer is the human's answer (or the timeout's).
type HoldAnswer struct {
	Approved bool   `json:"approved"`
	TimedOut bool   `json:"timed_out"`
	By       string `json:"by"`
	Reason   string `json:"reason"`
}

// Holder is implemented by agents that hold calls for approval.
type Holder interface {
	Hold(ctx context.Context, req HoldRequest) (HoldAnswer, error)
}

// maxHold bounds a hold the socket serves.
const maxHold = time.Hour

func serveHold(mux *http.ServeMux, h Holder) {
	mux.HandleFunc("POST /hold", func(w http.ResponseWriter, r *http.Request) {
		var req HoldRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&req); err != nil {
			http.Error(w, "decode hold: "+err.Error(), http.StatusBadRequest)
			return
		}
		if req.Timeout <= 0 || req.Timeout > maxHold {
			http.Error(w, fmt.Sprintf("hold timeout %v: want more than 0 and at most %v", req.Timeout, maxHold), http.StatusBadRequest)
			return
		}
		// The request's context ends when the wrapper leaves: the hold too.
		ans, err := h.Hold(r.Context(), req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ans)
	})
}

// Hold waits for the agent's approvers to answer req (up to its timeout,
// or the end of ctx).
func (c *Client) Hold(ctx context.Context, req HoldRequest) (HoldAnswer, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return HoldAnswer{}, fmt.Errorf("encode hold: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", c.path)
	}}}
	hr, _ := http.NewRequestWithContext(ctx, "POST", "http://watcher/hold", bytes.NewReader(body))
	resp, err := hc.Do(hr)
	if err != nil {
		return HoldAnswer{}, fmt.Errorf("contact agent at %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return HoldAnswer{}, fmt.Errorf("agent: %s", bytesTrim(msg))
	}
	var ans HoldAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return HoldAnswer{}, fmt.Errorf("agent's answer: %w", err)
	}
	return ans, nil
}
