// Command genmodel builds the hostname trigram model that the DNS proxy's
// encoded-name detector embeds (internal/dnsproxy/hostmodel.bin).
//
// Training data: the Cisco Umbrella top-100k list in the shared corpus
// sources, with every name of the evaluation set (dns/benign.tsv) removed
// together with every other name under the same registrable domain, and with
// a fifth of the remaining registrable domains held out for validation
// (hostmodel.Holdout). The malicious evaluation names are never read. Each
// distinct label counts once, so the model describes the vocabulary of
// hostnames rather than the popularity of "www".
//
//	go run ./internal/dnsproxy/internal/genmodel -corpus ../shared/corpus -out internal/dnsproxy/hostmodel.bin
package main

import (
	"bufio"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/watcherhq/watcher/internal/dnsproxy/internal/hostmodel"
	"golang.org/x/net/publicsuffix"
)

func main() {
	corpus := flag.String("corpus", "../shared/corpus", "shared corpus directory")
	out := flag.String("out", "internal/dnsproxy/hostmodel.bin", "model file to write")
	flag.Parse()
	if err := run(*corpus, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genmodel:", err)
		os.Exit(1)
	}
}

func run(corpus, out string) error {
	excluded := map[string]bool{}
	bf, err := os.Open(filepath.Join(corpus, "dns", "benign.tsv"))
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bf)
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), "\t")
		if rd, err := publicsuffix.EffectiveTLDPlusOne(strings.ToLower(name)); err == nil {
			excluded[rd] = true
		}
		excluded[strings.ToLower(name)] = true
	}
	bf.Close()
	if err := sc.Err(); err != nil {
		return err
	}

	uf, err := os.Open(filepath.Join(corpus, "sources", "umbrella-top-100k.txt.gz"))
	if err != nil {
		return err
	}
	defer uf.Close()
	zr, err := gzip.NewReader(uf)
	if err != nil {
		return err
	}
	tri := make([]float64, hostmodel.Symbols*hostmodel.Symbols*hostmodel.Symbols)
	seen := map[string]bool{}
	var names, skipped, held int
	sc = bufio.NewScanner(zr)
	for sc.Scan() {
		line := sc.Text()
		if _, after, ok := strings.Cut(line, ","); ok {
			line = after
		}
		name := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(line)), ".")
		if name == "" {
			continue
		}
		rd, err := publicsuffix.EffectiveTLDPlusOne(name)
		if err != nil || excluded[rd] || excluded[name] {
			skipped++
			continue
		}
		if hostmodel.Holdout(rd) {
			held++
			continue
		}
		names++
		suffix, _ := publicsuffix.PublicSuffix(name)
		head := strings.TrimSuffix(strings.TrimSuffix(name, suffix), ".")
		for _, label := range strings.Split(head, ".") {
			if label == "" || seen[label] {
				continue
			}
			seen[label] = true
			hostmodel.Count(tri, label, 1)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	m, err := hostmodel.Build(tri)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, m.Encode(), 0o644); err != nil {
		return err
	}
	fmt.Printf("trained on %d names (%d distinct labels); excluded %d (evaluation domains), held out %d\n",
		names, len(seen), skipped, held)
	return nil
}
