#!/bin/sh
# Regenerates the benign workload traces the escape tests replay: the
# syscalls a sandbox's escape score looks at, recorded with strace from real
# workloads an agent runs (a Go build and test, a Python script, git in a
# workspace, the diagnostics an ops agent runs). Run from this directory: sh gen.sh (needs strace, go, python3,
# git). The traces are committed, so the tests need none of these tools.
set -eu
here=$(pwd)
ws=$(mktemp -d)
trap 'rm -rf "$ws"' EXIT
calls=openat,open,creat,connect,mount,umount2,ptrace,chroot,pivot_root,setns,unshare,init_module,finit_module,bpf,kill,clone,clone3,fork,vfork,process_vm_readv,io_uring_setup
trace() { # name cmd...
	name=$1; shift
	strace -f -qq -y -e trace=$calls -e signal=none -o "$ws/$name.strace" "$@" >/dev/null 2>&1
	gzip -9n <"$ws/$name.strace" >"$here/$name.strace.gz"
}

# Go: a small module with a dependency-free program and a test.
mkdir -p "$ws/gobuild" && cd "$ws/gobuild"
cat >go.mod <<'G'
module example.com/hello

go 1.22
G
cat >main.go <<'G'
package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

func main() {
	_ = http.DefaultClient
	b, _ := json.Marshal(map[string]string{"hello": "world"})
	fmt.Fprintln(os.Stdout, string(b))
}
G
cat >main_test.go <<'G'
package main

import "testing"

func TestMain_(t *testing.T) { main() }
G
trace go-build sh -c 'go build -o hello . && ./hello && go vet ./... && go test -count=1 ./...'

# Python: a script that reads and writes files, parses JSON and CSV, runs a
# subprocess and uses a temporary directory.
mkdir -p "$ws/py" && cd "$ws/py"
printf 'name,qty\napple,3\npear,5\n' >data.csv
cat >script.py <<'P'
import csv, json, os, subprocess, sys, tempfile, hashlib, sqlite3
rows = list(csv.DictReader(open("data.csv")))
total = sum(int(r["qty"]) for r in rows)
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "out.json")
    json.dump({"total": total}, open(p, "w"))
    print(hashlib.sha256(open(p, "rb").read()).hexdigest())
db = sqlite3.connect("inventory.db")
db.execute("create table if not exists t (name text, qty int)")
db.executemany("insert into t values (?, ?)", [(r["name"], r["qty"]) for r in rows])
db.commit()
print(subprocess.run(["ls", "-la"], capture_output=True, text=True).stdout)
print(sys.version, os.cpu_count())
P
trace python-script python3 script.py

# git: the operations an agent makes in a checkout.
mkdir -p "$ws/repo" && cd "$ws/repo"
trace git-workspace sh -c '
git init -q . && git config user.email agent@example.com && git config user.name agent &&
printf "a\n" >a.txt && git add a.txt && git commit -qm first &&
git checkout -qb feature && printf "b\n" >>a.txt && git commit -qam second &&
git log --oneline && git diff HEAD~1 && git status --short && git checkout -q - &&
git merge -q feature && git tag v1 && git gc -q && git log --stat | head -20'

# Diagnostics: what an agent asked "why is this host slow" runs. ps, top and
# lsof read every process's /proc entries, df and findmnt the mount table.
cd "$ws"
trace diagnostics sh -c 'ps aux; top -bn1 | head -15; pgrep -a sh; df -h; findmnt; free -m; uname -a; id;
lsof -n 2>/dev/null | head -50; ls -la /proc/1/ 2>/dev/null | head; cat /proc/loadavg /proc/meminfo | head; ss -tan | head'
