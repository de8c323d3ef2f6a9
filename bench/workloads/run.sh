#!/usr/bin/env bash
# Wall time of the benign workload battery (test/workloads) bare and caged,
# measured in the same run: ./bench/workloads/run.sh [ROUNDS, default 1] (as root).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
WL_BENCH="${1:-1}" go test -count=1 -timeout 60m -run '^TestWallTime$' ./test/workloads/ -v 2>&1 | grep -v '^=== RUN\|^--- \|^PASS\|^ok '
