#!/bin/sh
# veth-stall.sh: reproducer for the AF_XDP-over-veth stall under CPU load:
# RUNS loaded runs of `softrnic perf send_lat -s 64 -n ITERS`
# between two network namespaces joined by a veth pair, with HOGS busy loops
# (`yes > /dev/null`) competing for the CPUs. Each run is bounded by
# TIMEOUT seconds (then both ends get SIGQUIT, so their goroutine dumps are in
# the logs). A run that fails (RETRY_EXC_ERR, timeout) is reported with both
# ends' output, the timeline of each end's XDP attachment (sampled every
# 100 ms), the veth counters (ethtool -S: frames that ran XDP, were redirected, dropped) and
# UdpNoPorts (RoCE frames that reached a stack without a UDP 4791 socket,
# i.e. passed XDP or arrived when no program was attached). Exit status 1 if
# any run failed.
#
#   sudo bench/io/veth-stall.sh [-b softrnic-binary] [-T vethtrace-binary] [-r RUNS] [-n ITERS] [-H HOGS] [-t TIMEOUT] [-x 'more perf flags']
#
# With bench/io/vethtrace (built here unless -T names it), every RoCE frame
# that a veth of the two namespaces hands to the stack instead of its XDP
# path is logged with whether that veth had a program attached; failures
# show the run's events and the summary counts those with a program attached
# (a real bypass of XDP; none was seen in any run so far: the frames that reach a stack
# are retransmissions after the other end exited and detached).
#
# Names carry the pid so that parallel runs do not collide; everything
# (namespaces, hogs, servers) is removed on exit, also on Ctrl-C.
set -u
BIN=${BIN:-}
VT=${VT:-}
RUNS=20
ITERS=30000
HOGS=2
TIMEOUT=120
EXTRA=""
while getopts b:T:r:n:H:t:x: o; do
	case $o in
	b) BIN=$OPTARG ;;
	T) VT=$OPTARG ;;
	r) RUNS=$OPTARG ;;
	n) ITERS=$OPTARG ;;
	H) HOGS=$OPTARG ;;
	t) TIMEOUT=$OPTARG ;;
	x) EXTRA=$OPTARG ;;
	*) exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "veth-stall.sh: needs root (namespaces, veth, XDP)" >&2; exit 2; }
if [ -z "$BIN" ]; then
	BIN=$(mktemp -d)/softrnic
	go build -o "$BIN" ./cmd/softrnic || exit 1
fi
if [ -z "$VT" ]; then
	VT=$(mktemp -d)/vethtrace
	go build -o "$VT" ./bench/io/vethtrace 2>/dev/null || VT=""
fi
ID=$$
NA=vsA$ID NB=vsB$ID VA=vsa$ID VB=vsb$ID
LOG=$(mktemp -d)
HOGPIDS=""
VTPID=""
cleanup() {
	for p in $HOGPIDS $VTPID; do kill "$p" 2>/dev/null; done
	ip netns pids "$NA" 2>/dev/null | xargs -r kill 2>/dev/null
	ip netns pids "$NB" 2>/dev/null | xargs -r kill 2>/dev/null
	ip netns del "$NA" 2>/dev/null
	ip netns del "$NB" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
ip netns add "$NA" && ip netns add "$NB" || exit 1
ip link add "$VA" netns "$NA" type veth peer name "$VB" netns "$NB" || exit 1
ip -n "$NA" addr add 10.77.0.1/24 dev "$VA"
ip -n "$NB" addr add 10.77.0.2/24 dev "$VB"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up; done
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up
i=0
while [ "$i" -lt "$HOGS" ]; do
	yes > /dev/null &
	HOGPIDS="$HOGPIDS $!"
	i=$((i + 1))
done
if [ -n "$VT" ]; then
	"$VT" -for "$((RUNS * (TIMEOUT + 15)))s" "$NA" "$NB" > "$LOG/vethtrace" 2>&1 &
	VTPID=$!
fi
echo "namespaces $NA ($(stat -L -c %i /run/netns/$NA)) and $NB ($(stat -L -c %i /run/netns/$NB)); logs in $LOG"
fail=0
run=1
while [ "$run" -le "$RUNS" ]; do
	vt0=$(wc -l < "$LOG/vethtrace" 2>/dev/null || echo 0)
	# Watch both ends' XDP attachment through the run: a change is logged
	# with the time (the bypass of XDP shows up as a detached program).
	(
		last=""
		k=0
		while [ "$k" -lt $((TIMEOUT * 10)) ]; do
			cur="A:$(ip -n "$NA" -d link show "$VA" 2>/dev/null | grep -o 'prog/xdp id [0-9]*') B:$(ip -n "$NB" -d link show "$VB" 2>/dev/null | grep -o 'prog/xdp id [0-9]*')"
			if [ "$cur" != "$last" ]; then echo "$(date +%T.%N | cut -c1-12) $cur"; last=$cur; fi
			sleep 0.1
			k=$((k + 1))
		done
	) > "$LOG/xdpwatch" 2>&1 &
	wpid=$!
	timeout -s QUIT -k 5 "$TIMEOUT" ip netns exec "$NB" "$BIN" perf send_lat -d "$VB" -s 64 -n "$ITERS" $EXTRA > "$LOG/server" 2>&1 &
	spid=$!
	sleep 0.3
	timeout -s QUIT -k 5 "$TIMEOUT" ip netns exec "$NA" "$BIN" perf send_lat -d "$VA" -s 64 -n "$ITERS" $EXTRA 10.77.0.2 > "$LOG/client" 2>&1
	crc=$?
	wait "$spid"
	src=$?
	kill "$wpid" 2>/dev/null
	wait "$wpid" 2>/dev/null
	if [ "$crc" = 0 ] && [ "$src" = 0 ]; then
		echo "run $run: ok ($(grep -E '^ *64 ' "$LOG/client" | head -1 | tr -s ' '))"
	else
		fail=$((fail + 1))
		echo "run $run: FAILED (client $crc, server $src)"
		# A run that timed out got SIGQUIT: its goroutine dump is in the log.
		cp "$LOG/client" "$LOG/client.$run"
		cp "$LOG/server" "$LOG/server.$run"
		grep -v '^goroutine\|^\s\|^$' "$LOG/client" | sed 's/^/  client: /' | tail -8
		grep -v '^goroutine\|^\s\|^$' "$LOG/server" | sed 's/^/  server: /' | tail -8
		echo "  full logs: $LOG/client.$run $LOG/server.$run"
		sed 's/^/  xdp attachment: /' "$LOG/xdpwatch"
		tail -n +"$((vt0 + 1))" "$LOG/vethtrace" 2>/dev/null | head -20 | sed 's/^/  RoCE to a stack: /'
		for s in "$NA $VA" "$NB $VB"; do
			set -- $s
			echo "  $2: $(ip netns exec "$1" ethtool -S "$2" | tr -s ' \n' ' ')"
			echo "  $2: $(ip -n "$1" -s link show "$2" | tr -s ' \n' ' ')"
			echo "  $2: $(ip netns exec "$1" nstat -az UdpNoPorts UdpInErrors IpExtInNoRoutes 2>/dev/null | tail -n +2 | tr -s ' \n' ' ')"
		done
	fi
	run=$((run + 1))
done
echo "veth-stall: $fail of $RUNS runs failed (send_lat -s 64 -n $ITERS $EXTRA, $HOGS hogs)"
if [ -n "$VT" ]; then
	echo "veth-stall: RoCE frames handed to a stack: $(grep -c 'xdp=' "$LOG/vethtrace"), of which with an XDP program attached to that veth: $(grep -c ' xdp=1' "$LOG/vethtrace")"
fi
[ "$fail" = 0 ]
