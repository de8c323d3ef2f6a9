#!/usr/bin/env bash
# DNS proxy benchmark: unbound, dnsmasq and the watcher proxy measured in the
# same run, on loopback, with equivalent allow/deny data:
#   allowed  www.siteN.com      (500 names; unbound/dnsmasq local data; the
#                                proxy allows .siteN.com, answers from cache)
#   blocked  ads.trackerN.net   (250; NXDOMAIN; proxy deny list)
#   unknown  host.unknownN.org  (250; NXDOMAIN; proxy default deny)
# Query mix 50% allowed / 25% blocked / 25% unknown.
#
# Each server runs pinned to CPU 1 with one thread (unbound num-threads 1,
# dnsmasq is single-threaded, proxy GOMAXPROCS=1); load generators on CPU 0.
#   - max q/s and average latency: dnsperf (Debian 12 dnsperf 2.10 has no
#     latency percentiles),
#   - p50/p99 at a fixed 10k q/s: bench/dns/loadgen (open loop, Go),
#   - proxy memory (VmRSS) across three phases of unique names.
#
# Usage: bench/dns/run.sh [seconds per dnsperf run, default 10]
set -euo pipefail

DUR=${1:-10}
cd "$(dirname "$0")/../.."
REPO=$(pwd)

need=()
command -v dnsperf >/dev/null || need+=(dnsperf)
[ -x /usr/sbin/unbound ] || command -v unbound >/dev/null || need+=(unbound)
# dnsmasq-base is the binary alone; the dnsmasq package would also start a
# system service on port 53.
[ -x /usr/sbin/dnsmasq ] || command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing: ${need[*]}"
	# Keep package scripts from starting services (unbound would take :53).
	made_policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
	[ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
UNBOUND=$(command -v unbound || echo /usr/sbin/unbound)
DNSMASQ=$(command -v dnsmasq || echo /usr/sbin/dnsmasq)

WORK=$(mktemp -d /tmp/dnsbench.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT

UNBOUND_PORT=5390 PROXY_PORT=5391 DNSMASQ_PORT=5392
for p in $UNBOUND_PORT $PROXY_PORT $DNSMASQ_PORT; do
	if ss -Hlnu "sport = :$p" | grep -q .; then echo "port $p busy" >&2; exit 1; fi
done

# --- data ---
{
	echo "server:"
	printf '\tinterface: 127.0.0.1\n\tport: %s\n\tdo-daemonize: no\n\tuse-syslog: no\n\tlogfile: ""\n' $UNBOUND_PORT
	printf '\tusername: ""\n\tchroot: ""\n\tdirectory: "%s"\n\tpidfile: ""\n\tdo-ip6: no\n\tnum-threads: 1\n' "$WORK"
	printf '\tmodule-config: "iterator"\n\taccess-control: 127.0.0.0/8 allow\n\tverbosity: 0\n'
	printf '\tlocal-zone: "." static\n'
	for i in $(seq 1 500); do printf '\tlocal-data: "www.site%d.com. 3600 IN A 198.51.%d.%d"\n' "$i" $((i / 250)) $((i % 250)); done
	for i in $(seq 1 250); do printf '\tlocal-zone: "tracker%d.net." always_nxdomain\n' "$i"; done
} >"$WORK/unbound.conf"
{
	for i in $(seq 1 500); do printf 'host-record=www.site%d.com,198.51.%d.%d\n' "$i" $((i / 250)) $((i % 250)); done
	for i in $(seq 1 250); do printf 'address=/tracker%d.net/\n' "$i"; done
	echo 'address=/#/'
	echo 'local-ttl=3600'
	echo 'cache-size=10000'
} >"$WORK/dnsmasq.conf"
{
	# A watcher policy: the proxy serves what the planner compiles from it.
	echo "version: 1"
	echo "sandboxes:"
	echo "  - name: bench"
	echo "    select: {cgroups: [/bench]}"
	echo "    dns:"
	echo "      default: deny"
	echo "      detection: {enabled: true, rate_limit: 0}"
	echo "      allow:"
	for i in $(seq 1 500); do echo "        - .site$i.com"; done
	echo "      deny:"
	for i in $(seq 1 250); do echo "        - .tracker$i.net"; done
} >"$WORK/policy.yaml"
: >"$WORK/mix.txt"
for r in $(seq 1 4); do
	for i in $(seq 1 250); do
		j=$(((i + r * 250) % 500 + 1))
		printf 'www.site%d.com A\nads.tracker%d.net A\nwww.site%d.com A\nhost.unknown%d.org A\n' "$i" "$i" "$j" "$i"
	done
done >>"$WORK/mix.txt"
printf 'www.site1.com A\n' >"$WORK/unique.txt"

# --- servers ---
taskset -c 1 "$UNBOUND" -d -c "$WORK/unbound.conf" >"$WORK/unbound.log" 2>&1 &
PIDS+=($!)
taskset -c 1 "$DNSMASQ" --keep-in-foreground --conf-file="$WORK/dnsmasq.conf" --no-resolv --no-hosts \
	--bind-interfaces --listen-address=127.0.0.1 --port=$DNSMASQ_PORT --user=root \
	--pid-file="$WORK/dnsmasq.pid" --log-facility="$WORK/dnsmasq.log" &
PIDS+=($!)
go build -o "$WORK/proxyserver" ./bench/dns/proxyserver
go build -o "$WORK/loadgen" ./bench/dns/loadgen
GOMAXPROCS=1 taskset -c 1 "$WORK/proxyserver" -listen 127.0.0.1:$PROXY_PORT -policy "$WORK/policy.yaml" \
	-upstream 127.0.0.1:$UNBOUND_PORT >"$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=($PROXY_PID)

wait_up() {
	for _ in $(seq 1 100); do
		if dig +time=1 +tries=1 +short -p "$1" @127.0.0.1 www.site1.com A 2>/dev/null | grep -q 198.51; then return 0; fi
		sleep 0.1
	done
	echo "server on port $1 did not come up" >&2
	cat "$WORK"/*.log >&2
	exit 1
}
wait_up $UNBOUND_PORT
wait_up $DNSMASQ_PORT
wait_up $PROXY_PORT

# Sanity: each server gives the same verdicts.
for name in www.site7.com ads.tracker7.net host.unknown7.org; do
	line="$name:"
	for p in $UNBOUND_PORT $DNSMASQ_PORT $PROXY_PORT; do
		line="$line $(dig +time=1 +tries=1 -p $p @127.0.0.1 $name A | sed -n 's/.*status: \([A-Z]*\).*/\1/p')"
	done
	echo "verdicts (unbound dnsmasq proxy) $line"
done

# Warm every cache with one pass of the mix.
for p in $UNBOUND_PORT $DNSMASQ_PORT $PROXY_PORT; do
	taskset -c 0 dnsperf -s 127.0.0.1 -p $p -d "$WORK/mix.txt" -n 1 -q 100 >/dev/null
done

declare -A QPS AVG P50 P99 LOST
measure() { # name port
	local out
	out=$(taskset -c 0 dnsperf -s 127.0.0.1 -p "$2" -d "$WORK/mix.txt" -l "$DUR" -c 4 -q 256 2>&1)
	QPS[$1]=$(echo "$out" | awk '/Queries per second:/ {print $4}')
	AVG[$1]=$(echo "$out" | awk '/Average Latency/ {printf "%.1f", $4 * 1e6}')
	LOST[$1]=$(echo "$out" | awk '/Queries lost:/ {print $3}')
	out=$(taskset -c 0 "$WORK/loadgen" -server 127.0.0.1:"$2" -queries "$WORK/mix.txt" -qps 10000 -duration "${DUR}s")
	P50[$1]=$(echo "$out" | sed -n 's/.*p50_us=\([0-9.]*\).*/\1/p')
	P99[$1]=$(echo "$out" | sed -n 's/.*p99_us=\([0-9.]*\).*/\1/p')
	echo "  $1 loadgen@10k: $out"
}
echo "measuring (${DUR}s each)..."
measure unbound $UNBOUND_PORT
measure dnsmasq $DNSMASQ_PORT
measure proxy $PROXY_PORT

rss() { awk '/VmRSS/ {print $2}' /proc/"$PROXY_PID"/status; }
echo "proxy memory under unique names (20k q/s, new name every query):"
R0=$(rss)
MEM="start=${R0}kB"
for phase in 1 2 3; do
	taskset -c 0 "$WORK/loadgen" -server 127.0.0.1:$PROXY_PORT -queries "$WORK/mix.txt" -qps 20000 -duration "${DUR}s" -unique >/dev/null
	MEM="$MEM phase$phase=$(rss)kB"
done
echo "  $MEM"

echo
printf '%-8s %12s %10s %10s %10s %12s %14s\n' server "q/s(dnsperf)" "avg_us" "p50_us@10k" "p99_us@10k" "lost" "q/s vs unbound"
for s in unbound dnsmasq proxy; do
	ratio=$(awk -v a="${QPS[$s]}" -v b="${QPS[unbound]}" 'BEGIN {printf "%.2f", a / b}')
	printf '%-8s %12s %10s %10s %10s %12s %14s\n' "$s" "${QPS[$s]}" "${AVG[$s]}" "${P50[$s]}" "${P99[$s]}" "${LOST[$s]}" "$ratio"
done
echo
echo "targets: proxy q/s >= unbound's (ratio >= 1.00): $(awk -v a="${QPS[proxy]}" -v b="${QPS[unbound]}" 'BEGIN {print (a >= b) ? "met" : "NOT met"}');" \
	"proxy p99 <= 1000us at 10k q/s: $(awk -v a="${P99[proxy]}" 'BEGIN {print (a <= 1000) ? "met" : "NOT met"}')"
kill -INT $PROXY_PID
wait $PROXY_PID 2>/dev/null || true
grep -h stats "$WORK/proxy.log" | tail -1
