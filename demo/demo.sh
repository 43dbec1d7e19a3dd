#!/usr/bin/env bash
# demo.sh — two softrnic hosts in network namespaces joined by a veth pair,
# running perftest-compatible benchmarks over RoCEv2 through AF_XDP, every
# received byte verified. Needs root. Removes everything it made on exit.
#
# usage: demo/demo.sh [BIN]     (BIN defaults to bin/softrnic)
set -euo pipefail

bin=${1:-bin/softrnic}
[ -x "$bin" ] || { echo "demo: $bin not built (make build)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "demo: needs root (network namespaces, XDP)" >&2; exit 2; }
bin=$(realpath "$bin")

# Unique names: several demos (or tests) may run at once.
tag=$$
a=srnic-demo-a-$tag b=srnic-demo-b-$tag
va=sda$tag vb=sdb$tag
cleanup() {
	ip netns del "$a" 2>/dev/null || true
	ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

ip netns add "$a"
ip netns add "$b"
ip link add "$va" netns "$a" type veth peer name "$vb" netns "$b"
# MTU 4200: room for RoCE path MTU 4096 frames (4154 bytes with IPv4 headers).
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" mtu 4200 up
ip -n "$b" link set "$vb" mtu 4200 up
ip -n "$a" addr add 10.99.0.1/24 dev "$va"
ip -n "$b" addr add 10.99.0.2/24 dev "$vb"

# run TEST ARGS...: server in b, client in a; both bounded in time.
run() {
	local t=$1; shift
	echo
	echo "=== softrnic perf $t $*"
	timeout 60 ip netns exec "$b" "$bin" perf "$t" -d "$vb" -F "$@" >/tmp/softrnic-demo-server.$tag 2>&1 &
	local srv=$!
	sleep 0.5
	timeout 60 ip netns exec "$a" "$bin" perf "$t" -d "$va" -F "$@" 10.99.0.2
	wait "$srv" || { echo "server failed:"; cat /tmp/softrnic-demo-server.$tag; return 1; }
	rm -f /tmp/softrnic-demo-server.$tag
}

run write_bw -s 65536 -n 2000 --verify
run read_bw -s 65536 -n 1000 --verify
run send_bw -s 4096 -n 2000 --verify
run atomic_bw -n 2000
run send_lat -s 64 -n 2000
echo
echo "demo: all runs completed"
