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
# Then the channels of issue 27 (internal/dnsproxy/channelbench_test.go):
# which name among 256 and which query type among 8 is asked, at 40 q/s for
# a simulated hour against a logging authoritative server (bytes/hour that
# reached it), whether a flood of unlisted names lifts a domain's cut-off,
# and the benign CDN pattern (40 names, A + AAAA + HTTPS every TTL).
#
# Usage: bench/dns/info.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -count=1 -v -run '^(TestInformationBudgetReplay|TestChannelBench)$' ./internal/dnsproxy/ |
	sed -n 's/^ *\(replay\|channelbench\)_test.go:[0-9]*: //p; /^--- /p; /^ok\|^FAIL/p'
