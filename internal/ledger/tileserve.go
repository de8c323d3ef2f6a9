package ledger

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"filippo.io/torchwood"
	"golang.org/x/mod/sumdb/tlog"
)

// TileHandler serves the ledger in dir read-only as a C2SP tlog-tiles log,
// so monitors and mirrors can follow it without access to the host:
//
//	GET /checkpoint                     the latest checkpoint, with cosignatures
//	GET /tile/<L>/<N>[.p/<W>]           hash tiles (from the tree hash files)
//	GET /tile/entries/<N>[.p/<W>]       entry bundles: each record as hashed,
//	                                    that is its line up to ,"hash":
//
// A client checks what it fetches against the checkpoint (torchwood's
// Client does). Full tiles never change and are served as immutable;
// records longer than 65535 bytes cannot be an entry (uint16 length) and
// make their bundle fail with 500.
func TileHandler(dir string) http.Handler {
	tiles := OpenTiles(dir)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only", http.StatusMethodNotAllowed)
			return
		}
		path := strings.TrimPrefix(r.URL.Path, "/")
		if path == "checkpoint" {
			data, err := os.ReadFile(filepath.Join(dir, latestName))
			if err != nil {
				http.Error(w, "no checkpoint yet", http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.Write(data)
			return
		}
		t, err := torchwood.ParseTilePath(path)
		if err != nil || t.H != TileHeight {
			http.NotFound(w, r)
			return
		}
		var data []byte
		if t.L == -1 {
			data, err = readEntryBundle(dir, tiles, t)
		} else {
			data, err = tiles.ReadTile(t)
		}
		switch {
		case errors.Is(err, fs.ErrNotExist):
			http.NotFound(w, r)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if t.W == tileWidth {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-store")
		}
		w.Write(data)
	})
}

// readEntryBundle returns the entries of records [N*256, N*256+W), which
// must be in the tree hash files (acknowledged).
func readEntryBundle(dir string, tiles *Tiles, t tlog.Tile) ([]byte, error) {
	start := uint64(t.N) * tileWidth
	end := start + uint64(t.W)
	if t.W < 1 || t.W > tileWidth || end > tiles.Size() {
		return nil, fmt.Errorf("entries %d..%d: %w", start, end-1, fs.ErrNotExist)
	}
	rd, err := NewReaderFrom(dir, start)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var out []byte
	for next := start; next < end; {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("entries %d..%d: record %d: %w", start, end-1, next, fs.ErrNotExist)
		}
		if err != nil {
			return nil, err
		}
		if rec.Seq < next {
			continue
		}
		if rec.Seq != next {
			return nil, fmt.Errorf("record %d where %d was expected (removed by retention?): %w", rec.Seq, next, fs.ErrNotExist)
		}
		f, err := parseFrame(rec.Raw)
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", next, err)
		}
		if out, err = torchwood.AppendTileEntry(out, f.body); err != nil {
			return nil, fmt.Errorf("record %d: %w", next, err)
		}
		next++
	}
	return out, nil
}
