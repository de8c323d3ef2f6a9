#!/usr/bin/env bash
# A reading agent (read-only preset): search code, read logs and system
# files, list directories; writes only to the terminal.
set -euo pipefail
cd "$WL_SRC"
grep -rln 'func ' --include='*.go' . >/dev/null
find . -maxdepth 2 -type f >/dev/null
git log --oneline -3 >/dev/null
# git status refreshes the index when it can (a write): reading tools ask
# it not to, as the read-only preset says.
git --no-optional-locks status --short >/dev/null
ls -la / /etc /usr/share/zoneinfo >/dev/null
ls "$HOME" >/dev/null && cat "$HOME/.gitconfig" >/dev/null
cat /etc/hostname /etc/os-release /proc/self/status /proc/cpuinfo >/dev/null
diff <(ls /etc | sort) <(ls /etc | sort)
wc -l /etc/ssl/certs/ca-certificates.crt >/dev/null
TZ=Asia/Tokyo date >/dev/null && locale >/dev/null
echo read-ok
