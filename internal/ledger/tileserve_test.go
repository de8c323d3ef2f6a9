package ledger

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"filippo.io/torchwood"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// The served log is the one verify checks: a tlog-tiles client (torchwood)
// gets the checkpoint's root from the served hash tiles and every record,
// in order, from the served entry bundles.
func TestServeTiles(t *testing.T) {
	dir := t.TempDir()
	buildCheckpointed(t, dir, 700, 350)
	rep := requireClean(t, dir)
	srv := httptest.NewServer(TileHandler(dir))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	v, _ := note.NewVerifier(pubKeyOf(t, dir))
	c, err := ParseCosigned(ck, v)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size != rep.NextSeq || rep.Covered != c.Size {
		t.Fatalf("served checkpoint size %d; verify checked %d records, covered %d", c.Size, rep.NextSeq, rep.Covered)
	}
	fetcher, err := torchwood.NewTileFetcher(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tree := tlog.Tree{N: int64(c.Size), Hash: c.Root}
	root, err := tlog.TreeHash(tree.N, torchwood.TileHashReaderWithContext(ctx, tree, fetcher))
	if err != nil || root != c.Root {
		t.Fatalf("root from served tiles %v (%v), signed %v", root, err, c.Root)
	}
	client, err := torchwood.NewClient(fetcher)
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, dir)
	n := 0
	for i, entry := range client.Entries(ctx, tree, 0) {
		if tlog.RecordHash(entry) != recs[i].Hash || !strings.HasPrefix(string(recs[i].Raw), string(entry)) {
			t.Fatalf("entry %d differs from record %d", i, recs[i].Seq)
		}
		n++
	}
	if err := client.Err(); err != nil {
		t.Fatal(err)
	}
	// The client stops before a partial entry bundle at the end.
	if n < int(c.Size)/tileWidth*tileWidth {
		t.Fatalf("client read %d entries of %d", n, c.Size)
	}
	// The partial bundle is served too.
	last := tlog.Tile{H: TileHeight, L: -1, N: int64(c.Size / tileWidth), W: int(c.Size % tileWidth)}
	got, err := fetcher.ReadTiles(ctx, []tlog.Tile{last})
	if err != nil {
		t.Fatal(err)
	}
	rest, k := got[0], 0
	for len(rest) > 0 {
		var e []byte
		if e, rest, err = torchwood.ReadTileEntry(rest); err != nil {
			t.Fatal(err)
		}
		if tlog.RecordHash(e) != recs[n+k].Hash {
			t.Fatalf("partial bundle entry %d differs", k)
		}
		k++
	}
	if n+k != int(c.Size) {
		t.Fatalf("%d + %d entries, checkpoint has %d", n, k, c.Size)
	}
	for path, want := range map[string]int{
		"/tile/0/x001/000":  http.StatusNotFound, // beyond the log
		"/tile/0/000.p/300": http.StatusNotFound, // not a valid width
		"/tile/entries/009": http.StatusNotFound,
		"/ledger.key":       http.StatusNotFound,
		"/../ledger.key":    http.StatusNotFound,
		"/tile/0/000":       http.StatusOK,
		"/tile/1/000.p/2":   http.StatusOK,
		"/tile/entries/000": http.StatusOK,
		"/tile/entries/002.p/" + strconv.Itoa(int(c.Size%256)): http.StatusOK,
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp, err = http.Post(srv.URL+"/checkpoint", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
}
