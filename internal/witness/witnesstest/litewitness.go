// Package witnesstest runs a real C2SP tlog-witness, litewitness from
// filippo.io/torchwood (the version go.mod names as a tool), on loopback
// for tests. It is imported by tests only.
package witnesstest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/torchwood"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"zombiezen.com/go/sqlite"
	"zombiezen.com/go/sqlite/sqlitex"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds litewitness once per test process.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "litewitness-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "litewitness")
		cmd := exec.Command("go", "build", "-o", binPath, "filippo.io/torchwood/cmd/litewitness")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build litewitness: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Witness is a running litewitness.
type Witness struct {
	// URL is its base URL on loopback.
	URL string
	// Name is the witness's name; VKey its cosignature/v1 verifier key.
	Name, VKey string

	t     testing.TB
	dir   string
	db    string
	sock  string
	fp    string
	addr  string
	cmd   *exec.Cmd
	agent net.Listener
	log   *bytes.Buffer
	done  chan struct{}
}

// Start starts a witness knowing no logs, with a fresh key; it is stopped
// at the end of the test.
func Start(t testing.TB) *Witness {
	t.Helper()
	bin := binary(t)
	var rb [4]byte
	rand.Read(rb[:])
	w := &Witness{t: t, dir: t.TempDir(), Name: "witness.test/" + hex.EncodeToString(rb[:])}
	w.db = filepath.Join(w.dir, "litewitness.db")
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// A dedicated in-process ssh-agent holds the witness key, as
	// litewitness wants.
	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: priv}); err != nil {
		t.Fatal(err)
	}
	w.sock = filepath.Join(w.dir, "agent.sock")
	if w.agent, err = net.Listen("unix", w.sock); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := w.agent.Accept()
			if err != nil {
				return
			}
			go func() { agent.ServeAgent(keyring, c); c.Close() }()
		}
	}()
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	w.fp = ssh.FingerprintSHA256(sshPub)
	s, err := torchwood.NewCosignatureSigner(w.Name, priv)
	if err != nil {
		t.Fatal(err)
	}
	w.VKey = s.Verifier().String()
	w.exec(bin)
	t.Cleanup(func() {
		w.Stop()
		w.agent.Close()
	})
	return w
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (w *Witness) exec(bin string) {
	t := w.t
	if w.addr == "" {
		w.addr = freeAddr(t)
		w.URL = "http://" + w.addr
	}
	w.log = &bytes.Buffer{}
	w.cmd = exec.Command(bin, "-name", w.Name, "-db", w.db, "-ssh-agent", w.sock, "-key", w.fp, "-listen", w.addr)
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("start litewitness: %v", err)
	}
	w.done = make(chan struct{})
	go func() { w.cmd.Wait(); close(w.done) }()
	for i := 0; ; i++ {
		select {
		case <-w.done:
			t.Fatalf("litewitness exited: %s", w.log)
		default:
		}
		resp, err := http.Get(w.URL + "/")
		if err == nil {
			resp.Body.Close()
			return
		}
		if i > 300 {
			t.Fatalf("litewitness did not listen on %s: %v\n%s", w.addr, err, w.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the witness process (its database stays).
func (w *Witness) Stop() {
	if w.cmd == nil {
		return
	}
	w.cmd.Process.Signal(os.Interrupt)
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
	}
	w.cmd = nil
}

// Restart starts the stopped witness again on the same address.
func (w *Witness) Restart() {
	w.exec(binary(w.t))
}

// Log returns what litewitness printed.
func (w *Witness) Log() string { return w.log.String() }

// AddLog registers a log (origin and its verifier key) at size 0, as
// torchwood's witnessctl add-log and add-key do.
func (w *Witness) AddLog(origin, vkey string) {
	t := w.t
	t.Helper()
	db, err := sqlite.OpenConn(w.db, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	empty := sha256.Sum256(nil)
	err = sqlitex.ExecScript(db, `
		CREATE TABLE IF NOT EXISTS log (origin TEXT PRIMARY KEY, tree_size INTEGER NOT NULL, tree_hash TEXT NOT NULL);
		CREATE TABLE IF NOT EXISTS key (origin TEXT NOT NULL, key TEXT NOT NULL, FOREIGN KEY(origin) REFERENCES log(origin));`)
	if err == nil {
		err = sqlitex.Execute(db, "INSERT INTO log (origin, tree_size, tree_hash) VALUES (?, 0, ?)",
			&sqlitex.ExecOptions{Args: []any{origin, base64.StdEncoding.EncodeToString(empty[:])}})
	}
	if err == nil {
		err = sqlitex.Execute(db, "INSERT INTO key (origin, key) VALUES (?, ?)",
			&sqlitex.ExecOptions{Args: []any{origin, strings.TrimSpace(vkey)}})
	}
	if err != nil {
		t.Fatalf("register log %s with the witness: %v", origin, err)
	}
}

// Size returns the size the witness has cosigned for origin.
func (w *Witness) Size(origin string) int64 {
	t := w.t
	t.Helper()
	db, err := sqlite.OpenConn(w.db, sqlite.OpenReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int64 = -1
	err = sqlitex.Execute(db, "SELECT tree_size FROM log WHERE origin = ?", &sqlitex.ExecOptions{
		Args: []any{origin}, ResultFunc: func(s *sqlite.Stmt) error { n = s.ColumnInt64(0); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
