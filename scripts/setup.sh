#!/usr/bin/env bash
# Installs what watcher's build, demo and tests need on Debian 12 (as root):
# the BPF toolchain, qemu for the LSM tests, DNS daemons and tools for the
# DNS and egress tests, promtool, and the Go modules.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
export DEBIAN_FRONTEND=noninteractive

packages=(
	clang llvm libbpf-dev bpftool          # bpf2go and vmlinux.h
	qemu-system-x86 busybox-static cpio    # make test-vm (stock kernel under qemu)
	unbound dnsmasq-base dnsutils          # DNS proxy tests against real resolvers, dig
	iproute2 openssh-client xxd python3 ed procps kmod util-linux binutils  # egress and Atomic Red Team tests
	prometheus                             # promtool test rules
	make git ca-certificates
	gcc zstd curl python3-venv locales tzdata   # test/workloads: the benign battery
	docker.io                              # internal/posture: a real container's posture (the test starts its own dockerd)
)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "== apt-get install ${missing[*]}"
	# Packages such as prometheus and unbound start services on install: the
	# tests start their own instances, so keep the package ones down.
	prc=/usr/sbin/policy-rc.d
	had_prc=0; [ -e "$prc" ] && had_prc=1
	[ $had_prc = 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$prc"; chmod +x "$prc"; }
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	[ $had_prc = 1 ] || rm -f "$prc"
fi

# test/workloads runs npm; nodejs from another source may already bring it.
if ! command -v npm >/dev/null; then
	echo "== apt-get install npm"
	apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

# watcher mcp wrap's tests run the reference MCP servers from npm, kept in
# a cache directory of their own (pinned versions; npm skips what is there).
mcp_servers=/var/cache/watcher/mcp-servers
mcp_want="@modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31"
if ! [ -f "$mcp_servers/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" ] ||
	! [ -f "$mcp_servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ]; then
	echo "== npm install MCP servers into $mcp_servers"
	mkdir -p "$mcp_servers"
	[ -f "$mcp_servers/package.json" ] || echo '{"private": true}' > "$mcp_servers/package.json"
	# shellcheck disable=SC2086
	(cd "$mcp_servers" && npm install --no-audit --no-fund --silent $mcp_want)
fi

echo "== go mod download"
go mod download
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

# MCP: the official Python (mcp on PyPI) and TypeScript
# (@modelcontextprotocol/sdk) SDK clients the MCP tests run against
# `watcher mcp serve`, and the MCP conformance suite. Under
# $WATCHER_MCP_CACHE (default /var/cache/watcher-test/mcp): py/ is a venv,
# node/ a node_modules prefix. Tests skip, naming the package, without them.
# The conformance suite is pinned: 0.1.13 and later need Node 22 (fs.globSync)
# and Debian 12 has Node 18/20.
mcp_cache=${WATCHER_MCP_CACHE:-/var/cache/watcher-test/mcp}
mkdir -p "$mcp_cache/node"
if [ ! -x "$mcp_cache/py/bin/python" ] || ! "$mcp_cache/py/bin/python" -c 'import mcp' 2>/dev/null; then
	echo "== pip install mcp (venv $mcp_cache/py)"
	python3 -m venv "$mcp_cache/py"
	"$mcp_cache/py/bin/pip" install -q --retries 1 --timeout 20 mcp || echo "== pip install mcp failed: the Python MCP client test will skip"
fi
if [ ! -d "$mcp_cache/node/node_modules/@modelcontextprotocol/sdk" ] ||
	! grep -q '"version": "0.1.12"' "$mcp_cache/node/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
	echo "== npm install @modelcontextprotocol/sdk @modelcontextprotocol/conformance@0.1.12 ($mcp_cache/node)"
	npm install --silent --no-audit --no-fund --prefix "$mcp_cache/node" @modelcontextprotocol/sdk @modelcontextprotocol/conformance@0.1.12 ||
		echo "== npm install failed: the TypeScript MCP client test and the conformance run will skip"
fi

# internal/otlpexport's tests send to a real OpenTelemetry Collector built
# from the Collector's Go modules (test/otelcol, its own module so they
# stay out of watcher's go.mod); built once into the cache the tests use.
echo "== build the test OpenTelemetry Collector (test/otelcol)"
otelcol_key=$(cat test/otelcol/main.go test/otelcol/go.mod test/otelcol/go.sum | sha256sum | cut -c1-16)
otelcol_bin="${XDG_CACHE_HOME:-$HOME/.cache}/watcher/otelcol-$otelcol_key"
[ -x "$otelcol_bin" ] || (cd test/otelcol && go build -o "$otelcol_bin" .)
