package main

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/watcherhq/watcher/internal/ledger"
)

// serveTiles serves the ledger in dir read-only as C2SP tlog-tiles on
// addr (watcher run --serve-tiles). It returns the server and the address
// it listens on.
func serveTiles(addr, dir string) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--serve-tiles: %w", err)
	}
	srv := &http.Server{Handler: ledger.TileHandler(dir), ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}
