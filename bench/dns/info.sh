#!/usr/bin/env bash
# DNS information budget, benign and malicious side by side: replays the
# shared corpus (/work/shared/corpus/dns, read in place) through the whole
# proxy chain with a real upstream on loopback, one sandbox stream per
# session, on a simulated clock (internal/dnsproxy/replay_test.go):
#   - benign sessions: the names of one registrable domain, at most 50 per
#     session, 24 distinct names a minute, each asked as A and AAAA;
#   - tunnel streams: each tool's names under its parent, a query a second;
#   - slow exfiltration: 1 byte/s for 20 minutes in five encodings.
# Columns: where the information budget first refused a query (query #, and
# simulated time for exfiltration), and where the former fixed cut (more than
# 16 distinct names in 5 minutes) would have, measured in the same run.
#
# Usage: bench/dns/info.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -count=1 -v -run '^TestInformationBudgetReplay$' ./internal/dnsproxy/ |
	sed -n 's/^ *replay_test.go:[0-9]*: //p; /^--- /p; /^ok\|^FAIL/p'
