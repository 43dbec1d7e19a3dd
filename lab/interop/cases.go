package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// A Case is one interop test: a server command on one peer, then a client
// command on another, under one path MTU and one GID family.
type Case struct {
	Name    string
	MTU     int           // path MTU under test: 1024 (netdev MTU 1500) or 4096 (netdev MTU 4200)
	IP      int           // GID family: 4 (IPv4-mapped GIDs) or 6
	Timeout time.Duration // per side; the guest enforces it with timeout(1)
	// Ready says how the runner knows the server is up before starting the
	// client: "tcp:PORT" (a listening TCP socket: perftest and the pingpongs'
	// side channel), "cm:PORT" (a listening rdma_cm ID), "delay:SECONDS".
	Ready string
	// Loss is the percentage of frames dropped during the case: by netem on
	// every guest's egress and, in interop mode, by nftables on softrnic's
	// frames towards the guest; with Expect "loss" the case must show
	// recovery (NAKs, retransmissions or duplicates in the rxe counters).
	Loss int
	// Corrupt is the percentage of frames leaving the case's guests in which
	// netem flips one bit at a random offset (in the guest: before the tap,
	// so before softrnic's XDP hook and before the captures); in interop mode
	// nftables also damages that share of softrnic's frames towards the
	// guest (the byte after the BTH). A flip in the
	// RoCE part leaves a bad ICRC the receiver must drop the frame for; it
	// then recovers as from loss (expect=loss), or, in the self-check, the
	// lab's checks must notice (expect=detect).
	Corrupt int
	// Expect is "" (clean run), "loss" (must complete and show recovery in
	// rxe's counters) or "detect" (the lab's own checks must report a
	// problem: a negative test of the lab itself).
	Expect string
	// Allow lists rxe counters that may move without failing the case. It
	// exists for tools whose RC retransmission timeout cannot be raised
	// (ibv_rc_pingpong's is fixed at 4.096 us * 2^14 = 67 ms): under TCG on
	// a loaded host the guest's timers can expire while qemu has not yet put
	// its frames on the tap, giving timer-driven retransmissions that say
	// nothing about the peer. Gap counters (rcvd_seq_err,
	// out_of_seq_request) and the fatal ones cannot be allowed.
	Allow map[string]bool
	// XFail, when set, is why the case is known to fail (xfail="REASON"):
	// it still runs, and its failure is reported as XFAIL with the reason
	// instead of failing the run; a pass is reported as XPASS so that the
	// mark is removed once the cause is fixed. Only for what could not be
	// fixed yet, each with its reason.
	XFail string
	// Retries is how many more attempts a failed case gets (retries=N, at
	// most 2), and only when the evidence says the failure was the lab's
	// timing, not the wire: the guest's tap dropped frames during the
	// attempt (qemu under TCG did not drain it) and the only complaints
	// are rxe's recovery counters, which that loss explains. Any other
	// failure (exit status, data, fatal counters, ICRC) is never retried.
	Retries int
	Server  Side
	Client  Side
	Line    int // line in the case file, for messages
}

// A Side is one command and the peer that runs it: "host" (the test's
// namespace on this machine, where softrnic runs), "guest" (the rxe guest of
// the interop mode) or "a"/"b" (the two rxe guests of the self-check).
type Side struct {
	Peer string
	Cmd  string
}

// NetdevMTU is the Ethernet MTU that gives rxe (and softrnic) the case's
// path MTU: rxe derives its active MTU from the netdev's minus the RoCEv2
// headers, so 1500 yields 1024 and 4200 yields 4096.
func (c *Case) NetdevMTU() int {
	if c.MTU > 1024 {
		return 4200
	}
	return 1500
}

// HostSubcommand is the softrnic subcommand a host side needs ("perf" for
// "softrnic perf write_bw ..."), or "" when no side runs softrnic.
func (c *Case) HostSubcommand() string {
	for _, s := range []Side{c.Server, c.Client} {
		if s.Peer != "host" {
			continue
		}
		f := strings.Fields(s.Cmd)
		if len(f) >= 2 && f[0] == "softrnic" {
			return f[1]
		}
	}
	return ""
}

// ParseCases reads a case file. Each non-blank line that does not start with
// '#' is
//
//	NAME | ATTRS | SERVER-PEER: COMMAND | CLIENT-PEER: COMMAND
//
// NAME may hold brace groups, "{a,b,c}", which expand the line into one case
// per combination; $1..$9 in ATTRS and the commands stand for the value the
// 1st..9th group took. ATTRS are space-separated key=value pairs: mtu, ip,
// timeout (seconds), ready, loss, expect. Fields are separated by " | ", so
// a command cannot contain " | ".
func ParseCases(r io.Reader) ([]Case, error) {
	var out []Case
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		f := strings.Split(t, " | ")
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: want 4 fields separated by \" | \", got %d", line, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		names, choices, err := expandBraces(f[0])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		for i, name := range names {
			sub := func(s string) string { return substGroups(s, choices[i]) }
			c := Case{Name: name, MTU: 1024, IP: 4, Timeout: 60 * time.Second, Line: line}
			if err := c.setAttrs(sub(f[1])); err != nil {
				return nil, fmt.Errorf("line %d (%s): %w", line, name, err)
			}
			if c.Server, err = parseSide(sub(f[2])); err != nil {
				return nil, fmt.Errorf("line %d (%s): server: %w", line, name, err)
			}
			if c.Client, err = parseSide(sub(f[3])); err != nil {
				return nil, fmt.Errorf("line %d (%s): client: %w", line, name, err)
			}
			if c.Server.Peer == c.Client.Peer {
				return nil, fmt.Errorf("line %d (%s): server and client on the same peer %q", line, name, c.Server.Peer)
			}
			if prev, dup := seen[name]; dup {
				return nil, fmt.Errorf("line %d: case %s already defined on line %d", line, name, prev)
			}
			seen[name] = line
			out = append(out, c)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseSide(s string) (Side, error) {
	peer, cmd, ok := strings.Cut(s, ":")
	peer, cmd = strings.TrimSpace(peer), strings.TrimSpace(cmd)
	if !ok || cmd == "" {
		return Side{}, fmt.Errorf("want PEER: COMMAND, got %q", s)
	}
	switch peer {
	case "host", "guest", "a", "b":
	default:
		return Side{}, fmt.Errorf("unknown peer %q (host, guest, a, b)", peer)
	}
	return Side{Peer: peer, Cmd: cmd}, nil
}

func (c *Case) setAttrs(s string) error {
	kvs, err := splitAttrs(s)
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("attribute %q is not key=value", kv)
		}
		var err error
		switch k {
		case "mtu":
			c.MTU, err = strconv.Atoi(v)
			if err == nil && c.MTU != 1024 && c.MTU != 4096 {
				err = fmt.Errorf("mtu %d: the lab tests path MTUs 1024 and 4096", c.MTU)
			}
		case "ip":
			c.IP, err = strconv.Atoi(v)
			if err == nil && c.IP != 4 && c.IP != 6 {
				err = fmt.Errorf("ip must be 4 or 6")
			}
		case "timeout":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && (n <= 0 || n > 600) {
				err = fmt.Errorf("timeout %d s out of (0, 600]", n)
			}
			c.Timeout = time.Duration(n) * time.Second
		case "ready":
			kind, arg, _ := strings.Cut(v, ":")
			n, e := strconv.ParseFloat(arg, 64)
			switch {
			case kind != "tcp" && kind != "cm" && kind != "delay":
				err = fmt.Errorf("ready %q: want tcp:PORT, cm:PORT or delay:SECONDS", v)
			case e != nil || n < 0 || n > 65535 || (kind == "delay" && n > 30):
				err = fmt.Errorf("ready %q: bad number", v)
			}
			c.Ready = v
		case "loss":
			c.Loss, err = strconv.Atoi(v)
			if err == nil && (c.Loss < 0 || c.Loss > 50) {
				err = fmt.Errorf("loss %d%% out of [0, 50]", c.Loss)
			}
		case "allow":
			c.Allow = map[string]bool{}
			for _, n := range strings.Split(v, ",") {
				if n != "completer_retry_err" && n != "duplicate_request" {
					err = fmt.Errorf("allow %q: only completer_retry_err and duplicate_request may be allowed", n)
					break
				}
				c.Allow[n] = true
			}
		case "corrupt":
			c.Corrupt, err = strconv.Atoi(v)
			if err == nil && (c.Corrupt <= 0 || c.Corrupt > 50) {
				err = fmt.Errorf("corrupt %d%% out of (0, 50]", c.Corrupt)
			}
		case "xfail":
			c.XFail = v
			if strings.TrimSpace(v) == "" {
				err = fmt.Errorf("xfail needs a reason: xfail=\"WHY\"")
			}
		case "retries":
			c.Retries, err = strconv.Atoi(v)
			if err == nil && (c.Retries < 0 || c.Retries > 2) {
				err = fmt.Errorf("retries %d out of [0, 2]", c.Retries)
			}
		case "expect":
			if v != "loss" && v != "detect" {
				err = fmt.Errorf("expect %q: \"loss\" or \"detect\"", v)
			}
			c.Expect = v
		default:
			err = fmt.Errorf("unknown attribute %q", k)
		}
		if err != nil {
			return err
		}
	}
	if c.Expect != "" && c.Loss == 0 && c.Corrupt == 0 {
		return fmt.Errorf("expect=%s without loss=PCT or corrupt=PCT", c.Expect)
	}
	return nil
}

// splitAttrs splits ATTRS at blanks, keeping a double-quoted value whole
// (xfail="rxe 6.1 does X"); the quotes are removed.
func splitAttrs(s string) ([]string, error) {
	var out []string
	var b strings.Builder
	quoted, in := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case !quoted && (r == ' ' || r == '\t'):
			if in {
				out = append(out, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteRune(r)
			in = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if in {
		out = append(out, b.String())
	}
	return out, nil
}

// expandBraces expands every "{a,b}" group of name (cartesian product, first
// group varying slowest) and returns the names with the choice made per group.
func expandBraces(name string) ([]string, [][]string, error) {
	type group struct {
		start, end int
		alts       []string
	}
	var groups []group
	for i := 0; i < len(name); i++ {
		switch name[i] {
		case '{':
			j := strings.IndexByte(name[i:], '}')
			if j < 0 {
				return nil, nil, fmt.Errorf("unclosed { in %q", name)
			}
			body := name[i+1 : i+j]
			if strings.ContainsAny(body, "{") {
				return nil, nil, fmt.Errorf("nested braces in %q", name)
			}
			alts := strings.Split(body, ",")
			for _, a := range alts {
				if a == "" {
					return nil, nil, fmt.Errorf("empty alternative in %q", name)
				}
			}
			groups = append(groups, group{i, i + j + 1, alts})
			i += j
		case '}':
			return nil, nil, fmt.Errorf("stray } in %q", name)
		}
	}
	if len(groups) > 9 {
		return nil, nil, fmt.Errorf("more than 9 brace groups in %q", name)
	}
	names := []string{""}
	choices := [][]string{nil}
	prev := 0
	for _, g := range groups {
		var nn []string
		var nc [][]string
		for k, n := range names {
			for _, a := range g.alts {
				nn = append(nn, n+name[prev:g.start]+a)
				nc = append(nc, append(append([]string(nil), choices[k]...), a))
			}
		}
		names, choices = nn, nc
		prev = g.end
	}
	for k := range names {
		names[k] += name[prev:]
	}
	return names, choices, nil
}

var groupRef = regexp.MustCompile(`\$[1-9]`)

// substGroups replaces $1..$9 with the brace choices; references to groups
// that do not exist are left alone (they may be shell positional parameters).
func substGroups(s string, choice []string) string {
	return groupRef.ReplaceAllStringFunc(s, func(m string) string {
		i := int(m[1] - '1')
		if i < len(choice) {
			return choice[i]
		}
		return m
	})
}

// Filter keeps the cases whose name matches the regular expression only (all
// when only is empty).
func Filter(cs []Case, only string) ([]Case, error) {
	if only == "" {
		return cs, nil
	}
	re, err := regexp.Compile(only)
	if err != nil {
		return nil, fmt.Errorf("-only: %w", err)
	}
	var out []Case
	for _, c := range cs {
		if re.MatchString(c.Name) {
			out = append(out, c)
		}
	}
	return out, nil
}
