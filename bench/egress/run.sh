#!/usr/bin/env bash
# Egress hook overhead, measured in one run against a baseline of the same
# run (needs root: loads BPF programs, creates cgroups):
#   - TCP connect/close loop and UDP send loop to an answered address:
#     bare (no program attached), outside the sandbox, inside it.
#     Targets: inside/bare <= 1.10, outside/bare <= 1.02.
#   - DNS through the kernel capture vs querying the proxy directly, from
#     inside a sandbox (needs internal/dnsproxy). Target: <= 1.10.
#   - Name binding (egress.names, the relay): per new connection (HTTPS
#     and plain HTTP) and bulk downloads, relayed vs direct from the same
#     sandbox, on the bare veth pair and on a 1 Gbit/s link (tbf).
#     Goal for bulk: >= 0.95x of direct.
# The ratios are printed at the end; nothing here fails on a timing.
set -euo pipefail
cd "$(dirname "$0")/../.."
benches='BenchmarkEgressOverhead|BenchmarkNameBinding'
if [ -d internal/dnsproxy ]; then
	benches="$benches|BenchmarkDNSCapture"
else
	echo "internal/dnsproxy absent: skipping the DNS capture benchmark" >&2
fi
go test -run '^$' -bench "^($benches)\$" -benchtime=1x -count=1 ./internal/enforce/egress/ 2>&1 |
	tee -a /dev/stderr | grep -E '^(egress overhead|dns capture|name binding|  https? )' || true
