package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Counters are rxe's hw_counters by name (ports/1/hw_counters in sysfs, the
// same values `rdma statistic` prints).
type Counters map[string]uint64

// ParseCounters reads the guest's "name value" lines.
func ParseCounters(r io.Reader) (Counters, error) {
	c := Counters{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("counter %s: %w", f[0], err)
		}
		c[f[0]] = v
	}
	return c, sc.Err()
}

// Delta is after minus before, per counter present in both.
func Delta(before, after Counters) Counters {
	d := Counters{}
	for k, a := range after {
		if b, ok := before[k]; ok && a >= b {
			d[k] = a - b
		}
	}
	return d
}

// recoveryCounters move when a peer recovers from loss: the requester saw a
// NAK sequence error or retried, the responder saw a gap or a duplicate.
var recoveryCounters = []string{"rcvd_seq_err", "completer_retry_err", "out_of_seq_request", "duplicate_request"}

// fatalCounters must never move: they end a QP in error or show the link
// went away. RNR counters are in this list too because no lab case provokes
// RNR on purpose (perftest and the pingpongs post receives before the peer
// sends).
var fatalCounters = []string{"retry_exceeded_err", "retry_rnr_exceeded_err", "send_err", "link_downed", "rcvd_rnr_err", "send_rnr_err"}

// egressDropped is not rxe's: the guest's init adds it from eth0's qdisc
// statistics. A frame the qdisc drops after rxe handed it over successfully
// is counted as sent by rxe and shows in none of its counters; the peer
// just sees a gap. Outside the loss cases it is the lab's own loss and
// fails the case, naming the lab rather than either RNIC.
const egressDropped = "lab_egress_dropped"

// rxeDropMessage matches what rxe logs (pr_warn_ratelimited in
// rxe_recv.c/rxe_icrc.c) when it drops a received packet: a bad ICRC
// ("bad ICRC from ADDR"), a packet for no QP ("no qp matches qpn"), or one
// addressed to a GID it does not have ("failed matching dgid"). rxe 6.1 has
// no counter for these, so the kernel log is where they show.
var rxeDropMessage = regexp.MustCompile(`(?i)\bicrc\b|no qp matches|failed matching dgid`)

// CheckCounters judges one guest's counter deltas and kernel log for a case.
// It returns the problems found (none means the rxe side is clean) and the
// sum of the recovery counters, which a loss case needs to be non-zero.
// Counters named in allow may move in a case that does not expect loss.
func CheckCounters(d Counters, dmesg string, expectLoss bool, allow map[string]bool) (problems []string, recovery uint64) {
	for _, k := range recoveryCounters {
		recovery += d[k]
		if d[k] != 0 && !expectLoss && !allow[k] {
			problems = append(problems, fmt.Sprintf("%s+%d", k, d[k]))
		}
	}
	if n := d[egressDropped]; n != 0 && !expectLoss {
		problems = append(problems, fmt.Sprintf("the guest's eth0 qdisc dropped %d frames (the lab's own loss, not a wire problem)", n))
	}
	for _, k := range fatalCounters {
		if d[k] != 0 {
			problems = append(problems, fmt.Sprintf("%s+%d", k, d[k]))
		}
	}
	for _, l := range strings.Split(dmesg, "\n") {
		if rxeDropMessage.MatchString(l) {
			problems = append(problems, "kernel: "+strings.TrimSpace(l))
			break
		}
	}
	return problems, recovery
}

// softrnicCounters is what each softrnic host of a case (tool or daemon)
// appends to $SOFTRNIC_COUNTERS when it closes (host.Counters): here only
// the request packets it sent more than once.
type softrnicCounters struct {
	Recovery struct {
		RetransPackets uint64 `json:"retrans_packets"`
	} `json:"recovery"`
}

// ReadRetransmitted sums the retransmitted request packets of every line
// of a case's counters file; ok is false when no host wrote one (it did not
// get to close: killed, or crashed).
func ReadRetransmitted(r io.Reader) (n uint64, ok bool, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var c softrnicCounters
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return n, ok, fmt.Errorf("softrnic counters: %w", err)
		}
		n += c.Recovery.RetransPackets
		ok = true
	}
	return n, ok, sc.Err()
}

// ExplainDuplicates takes out of d's duplicate_request the duplicates
// softrnic's own retransmissions account for: with adaptive
// retransmission softrnic repeats a packet when an answer is late (and
// under TCG the guest's answers can be a second late), and rxe counts the
// repeat as a duplicate request. budget is what softrnic says it
// retransmitted and not yet spent on another guest; what is taken from d
// is taken from it. Duplicates beyond it stay in d, for CheckCounters.
func ExplainDuplicates(d Counters, budget *uint64) (explained uint64) {
	explained = min(d["duplicate_request"], *budget)
	d["duplicate_request"] -= explained
	*budget -= explained
	return explained
}

// String prints the non-zero counters, sorted, for the results file.
func (c Counters) String() string {
	keys := make([]string, 0, len(c))
	for k, v := range c {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, c[k])
	}
	return b.String()
}
