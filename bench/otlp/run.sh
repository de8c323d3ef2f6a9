#!/usr/bin/env bash
# OTLP export throughput and agent CPU per record against the ledger alone,
# measured in one run (see bench/README.md). Builds the test Collector
# (test/otelcol) into the cache the tests use if it is not there.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
key=$(cat test/otelcol/main.go test/otelcol/go.mod test/otelcol/go.sum | sha256sum | cut -c1-16)
bin="${XDG_CACHE_HOME:-$HOME/.cache}/watcher/otelcol-$key"
[ -x "$bin" ] || (cd test/otelcol && go build -o "$bin" .)
exec nice -n 10 go run ./bench/otlp -collector "$bin" "$@"
