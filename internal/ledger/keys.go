package ledger

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// GenerateKey creates a new Ed25519 signing key in the signed-note format
// named name, writes the private key to keyFile (mode 0600, refusing to
// overwrite) and returns the public verifier key.
func GenerateKey(keyFile, name string) (vkey string, err error) {
	skey, vkey, err := note.GenerateKey(rand.Reader, name)
	if err != nil {
		return "", fmt.Errorf("generate key: %w", err)
	}
	if err := writeFileSync(keyFile, []byte(skey+"\n"), 0o600, true); err != nil {
		return "", fmt.Errorf("write key %s: %w", keyFile, err)
	}
	return vkey, nil
}

// loadKey reads a signed-note private key and returns its signer and the
// matching public verifier key.
func loadKey(keyFile string) (note.Signer, string, error) {
	data, err := os.ReadFile(keyFile)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("signing key %s is missing: %w", keyFile, err)
		}
		return nil, "", fmt.Errorf("read signing key %s: %w", keyFile, err)
	}
	skey := strings.TrimSpace(string(data))
	signer, err := note.NewSigner(skey)
	if err != nil {
		return nil, "", fmt.Errorf("signing key %s: %w", keyFile, err)
	}
	vkey, err := PublicKey(skey)
	if err != nil {
		return nil, "", fmt.Errorf("signing key %s: %w", keyFile, err)
	}
	return signer, vkey, nil
}

// PublicKey derives the verifier key ("name+hash+base64") from a
// signed-note private key ("PRIVATE+KEY+name+hash+base64").
func PublicKey(skey string) (string, error) {
	rest, ok := strings.CutPrefix(skey, "PRIVATE+KEY+")
	if !ok {
		return "", errors.New("not a signed-note private key")
	}
	parts := strings.SplitN(rest, "+", 3)
	if len(parts) != 3 {
		return "", errors.New("malformed private key")
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != 1 {
		return "", errors.New("malformed private key (want an Ed25519 key)")
	}
	pub := ed25519.NewKeyFromSeed(raw[1:]).Public().(ed25519.PublicKey)
	return note.NewEd25519VerifierKey(parts[0], pub)
}

// ReadPublicKey reads a verifier key file (as written to ledger.pub or
// printed by `watcher ledger pubkey`).
func ReadPublicKey(file string) (note.Verifier, string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, "", fmt.Errorf("read public key %s: %w", file, err)
	}
	vkey := strings.TrimSpace(string(data))
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, "", fmt.Errorf("public key %s: %w", file, err)
	}
	return v, vkey, nil
}

// Checkpoint is a signed statement of the ledger's size and Merkle root, in
// the C2SP tlog-checkpoint format inside a C2SP signed note:
//
//	<origin>
//	<size>
//	<base64 root hash>
//	time <RFC 3339 UTC>        (extension line)
//
//	— <key name> <base64 signature>
type Checkpoint struct {
	// Origin names the ledger: "watcher-ledger/<ledger id>".
	Origin string
	// Size is the number of records covered (seqs 0..Size-1).
	Size uint64
	// Root is the RFC 6962 Merkle tree hash of those records.
	Root tlog.Hash
	// Time is when the checkpoint was signed.
	Time time.Time
	// Note is the signed note with the ledger's signature alone.
	Note []byte
	// Cosigs are the witnesses' cosignature lines ("— name base64\n"),
	// stored after the ledger's signature in DIR/checkpoint; Note followed
	// by them is the cosigned checkpoint (see Cosigned).
	Cosigs []byte
	// File is where it was read from, if anywhere.
	File string
}

func originFor(id string) string { return "watcher-ledger/" + id }

func checkpointText(origin string, size uint64, root tlog.Hash, t time.Time) string {
	return fmt.Sprintf("%s\n%d\n%s\ntime %s\n", origin, size, base64.StdEncoding.EncodeToString(root[:]),
		t.UTC().Format(time.RFC3339Nano))
}

func signCheckpoint(signer note.Signer, origin string, size uint64, root tlog.Hash, t time.Time) (*Checkpoint, error) {
	msg, err := note.Sign(&note.Note{Text: checkpointText(origin, size, root, t)}, signer)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	return &Checkpoint{Origin: origin, Size: size, Root: root, Time: t.UTC(), Note: msg}, nil
}

// ParseCheckpoint verifies a signed checkpoint against the verifier key and
// parses it. The note must be byte-for-byte canonical (one signature, by
// that key, with canonical base64), so every changed bit is detected.
func ParseCheckpoint(msg []byte, v note.Verifier) (*Checkpoint, error) {
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		return nil, fmt.Errorf("checkpoint signature: %w", err)
	}
	if len(n.Sigs) != 1 || len(n.UnverifiedSigs) != 0 {
		return nil, errors.New("checkpoint must carry exactly one signature")
	}
	sig, err := base64.StdEncoding.DecodeString(n.Sigs[0].Base64)
	if err != nil || base64.StdEncoding.EncodeToString(sig) != n.Sigs[0].Base64 {
		return nil, errors.New("checkpoint signature is not canonical base64")
	}
	canonical := n.Text + "\n— " + n.Sigs[0].Name + " " + n.Sigs[0].Base64 + "\n"
	if !bytes.Equal([]byte(canonical), msg) {
		return nil, errors.New("checkpoint note is not in canonical form")
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	if len(lines) != 4 {
		return nil, fmt.Errorf("checkpoint has %d lines of text, want 4", len(lines))
	}
	c := &Checkpoint{Origin: lines[0], Note: msg}
	if !strings.HasPrefix(c.Origin, "watcher-ledger/") {
		return nil, fmt.Errorf("checkpoint origin %q is not a watcher ledger", c.Origin)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != lines[1] {
		return nil, fmt.Errorf("checkpoint size %q malformed", lines[1])
	}
	c.Size = size
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != tlog.HashSize || base64.StdEncoding.EncodeToString(root) != lines[2] {
		return nil, fmt.Errorf("checkpoint root %q malformed", lines[2])
	}
	copy(c.Root[:], root)
	ts, ok := strings.CutPrefix(lines[3], "time ")
	if !ok {
		return nil, fmt.Errorf("checkpoint time line %q malformed", lines[3])
	}
	if c.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
		return nil, fmt.Errorf("checkpoint time line %q malformed", lines[3])
	}
	if checkpointText(c.Origin, c.Size, c.Root, c.Time) != n.Text {
		return nil, errors.New("checkpoint text is not in canonical form")
	}
	return c, nil
}

// writeFileSync writes data to name durably: a temporary file, fsync,
// rename, fsync of the directory. With exclusive it refuses to replace an
// existing file.
func writeFileSync(name string, data []byte, perm os.FileMode, exclusive bool) error {
	if exclusive {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return err
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			os.Remove(name)
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			os.Remove(name)
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return syncDir(filepath.Dir(name))
	}
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(name))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
