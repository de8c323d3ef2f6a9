#!/usr/bin/env bash
# Pipelines into grep let it read to the end (no -q): with pipefail, an
# early exit would kill the writer with SIGPIPE.
# Shell tools: archives, find/sed, process substitution, /proc/self,
# /dev/fd, ssh-keygen, locale, time zones, hostname, CA certificates.
set -euo pipefail
cd "$WL_DIR"
mkdir -p data && for i in 1 2 3; do printf 'line %s\n' "$i" > "data/f$i.txt"; done
tar -czf data.tgz data && tar -tzf data.tgz | grep f2.txt
tar -cf - data | zstd -q -o data.tar.zst && zstd -dc data.tar.zst | tar -tf - | grep f3.txt
gzip -k data/f1.txt && gunzip -c data/f1.txt.gz | grep 'line 1'
find data -name '*.txt' | wc -l | grep 3
sed -i 's/line/row/' data/f1.txt && grep -q row data/f1.txt
diff <(sort data/f2.txt) <(cat data/f2.txt)
cat <(echo piped) | grep piped
ls /proc/self/fd >/dev/null && ls /dev/fd >/dev/null
grep -q '^Name:' /proc/self/status && cat /proc/self/cmdline >/dev/null && readlink /proc/self/exe >/dev/null
exec 3<data/f2.txt && cat /dev/fd/3 >/dev/null && exec 3<&-
ssh-keygen -q -t ed25519 -N '' -f key -C wl && test -s key.pub
locale >/dev/null && LC_ALL=C.UTF-8 date >/dev/null
TZ=Europe/Paris date >/dev/null && test -e /usr/share/zoneinfo/Europe/Paris && cat /etc/localtime >/dev/null
cat /etc/hostname >/dev/null && hostname >/dev/null
test -s /etc/ssl/certs/ca-certificates.crt && head -c 100 /etc/ssl/certs/ca-certificates.crt >/dev/null
cat /etc/passwd /etc/os-release >/dev/null
ps -o pid= -p $$ >/dev/null
echo shell-ok
