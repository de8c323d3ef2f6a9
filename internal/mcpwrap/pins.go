package mcpwrap

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Tool is a server's tool definition as tools/list gives it.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
}

// Hash is the SHA-256 of the definition's name, description and input
// schema, the schema re-encoded with sorted keys so that key order does
// not count as a change.
func (t Tool) Hash() string {
	var schema any
	if len(t.InputSchema) > 0 {
		if err := json.Unmarshal(t.InputSchema, &schema); err != nil {
			schema = string(t.InputSchema)
		}
	}
	b, _ := json.Marshal([]any{t.Name, t.Description, schema})
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Pin is the approved definition of one tool.
type Pin struct {
	SHA256      string    `json:"sha256"`
	Description string    `json:"description"`
	Since       time.Time `json:"since"`
	// By says how it was approved: first-seen, or accept-changes.
	By string `json:"by"`
}

// Pins are one server's approved tool definitions, kept in a file under
// the agent's state directory (root-only, protected from the sandboxes).
type Pins struct {
	path string
	mu   sync.Mutex
	file pinFile
}

type pinFile struct {
	Server string         `json:"server"`
	Tools  map[string]Pin `json:"tools"`
}

// PinKey names the pin file of a server: the sandbox and the command line
// (or URL) that starts it.
func PinKey(sandbox string, server []string) string {
	h := sha256.New()
	h.Write([]byte(sandbox))
	for _, a := range server {
		h.Write([]byte{0})
		h.Write([]byte(a))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// OpenPins reads DIR/KEY.json (none yet: no pins).
func OpenPins(dir, key, server string) (*Pins, error) {
	p := &Pins{path: filepath.Join(dir, key+".json"), file: pinFile{Server: server, Tools: map[string]Pin{}}}
	data, err := os.ReadFile(p.path)
	if os.IsNotExist(err) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tool pins: %w", err)
	}
	if err := json.Unmarshal(data, &p.file); err != nil {
		return nil, fmt.Errorf("tool pins %s: %w (remove it to pin anew)", p.path, err)
	}
	if p.file.Tools == nil {
		p.file.Tools = map[string]Pin{}
	}
	return p, nil
}

// Pin states.
const (
	PinNew     = "new"     // first seen: pinned now
	PinSame    = "same"    // as approved
	PinChanged = "changed" // differs from what was approved: refused
)

// Check compares t with its pin. A new tool is pinned; a changed one is
// re-pinned only with accept (the user approved the change).
func (p *Pins) Check(t Tool, accept bool) (state string, old Pin, err error) {
	sum := t.Hash()
	p.mu.Lock()
	defer p.mu.Unlock()
	old, had := p.file.Tools[t.Name]
	switch {
	case had && old.SHA256 == sum:
		return PinSame, old, nil
	case had && !accept:
		return PinChanged, old, nil
	}
	by := "first-seen"
	if had {
		by = "accept-changes"
	}
	p.file.Tools[t.Name] = Pin{SHA256: sum, Description: t.Description, Since: time.Now().UTC(), By: by}
	state = PinNew
	if had {
		state = PinChanged // and accepted
	}
	return state, old, p.saveLocked()
}

func (p *Pins) saveLocked() error {
	if err := os.MkdirAll(filepath.Dir(p.path), 0o700); err != nil {
		return fmt.Errorf("tool pins: %w", err)
	}
	b, err := json.MarshalIndent(p.file, "", "  ")
	if err != nil {
		return fmt.Errorf("tool pins: %w", err)
	}
	tmp := p.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("tool pins: %w", err)
	}
	if err := os.Rename(tmp, p.path); err != nil {
		return fmt.Errorf("tool pins: %w", err)
	}
	return nil
}

// Pinned says whether t's definition is the approved one of its name.
func (p *Pins) Pinned(t Tool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, had := p.file.Tools[t.Name]
	return had && old.SHA256 == t.Hash()
}

// Has says whether a definition of the tool name was ever approved.
func (p *Pins) Has(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, had := p.file.Tools[name]
	return had
}

// Path is the pin file.
func (p *Pins) Path() string { return p.path }
