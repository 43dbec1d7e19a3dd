package netnstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// RoCEv2Port is the UDP destination port of RoCEv2, the only traffic a
// LossyPath impairs.
const RoCEv2Port = 4791

// Impairment is what a LossyPath does to RoCEv2 frames, the same in each
// direction. Rates are per mille of the frames entering the bridge, drawn
// independently for every frame (nftables numgen random).
type Impairment struct {
	// LossPerMille frames of 1000 are dropped.
	LossPerMille int
	// DupPerMille frames of 1000 not dropped are delivered twice: the copy
	// leaves the far port straight away, the original follows through the
	// bridge, back to back.
	DupPerMille int
}

func (im Impairment) check() error {
	if im.LossPerMille < 0 || im.LossPerMille > 1000 || im.DupPerMille < 0 || im.DupPerMille > 1000 {
		return fmt.Errorf("netnstest: impairment %+v: rates are per mille, 0..1000", im)
	}
	return nil
}

// LossyOptions shape NewLossyPath.
type LossyOptions struct {
	MTU int // of every link and the bridge; 0: 1500
	// Subnet is the third octet of the hosts' 10.98.x.0/24 and
	// fd00:98:x::/64; 0 picks one from the pid.
	Subnet int
	Impairment
}

// LossyPath is two hosts, A and B, each in its own namespace, whose only
// path crosses a third namespace holding a Linux bridge between two veth
// ports: A's peer (PortA) and B's peer (PortB). nftables rules on the
// ingress (netdev family) of both ports impair RoCEv2 frames (UDP
// destination port 4791, IPv4 and IPv6) at random, in both directions; ARP,
// neighbour discovery and the TCP side channels of perftest and rdma_cm go
// through untouched. The hosts' links are what a softrnic device opens, as
// a Pair's are.
//
// Frames are not reordered: this kernel has no netem qdisc, nor fq or etf
// to release a frame later, nor nftables' queue to userspace, so no kernel
// facility here can hold a frame back; a duplicate's copy arrives just
// before its original, which is no reordering either.
type LossyPath struct {
	A, B         Link // the hosts' interfaces
	Bridge       *NS
	PortA, PortB string // bridge ports, in Bridge: the veth peers of A and B
	table        string
	im           Impairment
	closeOnce    sync.Once
	closeErr     error
}

// NewLossyPath makes the three namespaces, the links and the bridge, and
// loads opt's impairment. The caller must Close it; on failure everything
// made so far is removed.
func NewLossyPath(opt LossyOptions) (p *LossyPath, err error) {
	if err := opt.check(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, errors.New("netnstest: a lossy path needs nft(8) (Debian package nftables)")
	}
	p = &LossyPath{table: "softrnic_lossy"}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
			p = nil
		}
	}()
	a, err := Create("la")
	if err != nil {
		return p, err
	}
	p.A.NS = a
	b, err := Create("lb")
	if err != nil {
		return p, err
	}
	p.B.NS = b
	if p.Bridge, err = Create("lbr"); err != nil {
		return p, err
	}
	sub := opt.Subnet
	if sub == 0 {
		sub = os.Getpid()%200 + 20
	}
	mtu := opt.MTU
	if mtu == 0 {
		mtu = 1500
	}
	pf := func(host int) []netip.Prefix {
		return []netip.Prefix{
			netip.MustParsePrefix(fmt.Sprintf("10.98.%d.%d/24", sub, host)),
			netip.MustParsePrefix(fmt.Sprintf("fd00:98:%x::%d/64", sub, host)),
		}
	}
	var pa, pb Link
	if p.A, pa, err = Connect(a, p.Bridge, pf(1), nil, mtu); err != nil {
		return p, err
	}
	if p.B, pb, err = Connect(b, p.Bridge, pf(2), nil, mtu); err != nil {
		return p, err
	}
	p.PortA, p.PortB = pa.Name, pb.Name
	br := Unique("lbr")
	// No STP: the ports forward as soon as they are up.
	if _, err := p.Bridge.IP("link", "add", br, "mtu", fmt.Sprint(mtu), "type", "bridge", "stp_state", "0"); err != nil {
		return p, err
	}
	for _, port := range []string{p.PortA, p.PortB} {
		if _, err := p.Bridge.IP("link", "set", port, "master", br); err != nil {
			return p, err
		}
	}
	if _, err := p.Bridge.IP("link", "set", br, "up"); err != nil {
		return p, err
	}
	return p, p.Set(opt.Impairment)
}

// NewTestLossyPath is NewLossyPath for a test: it skips when not root or
// without nft(8), and removes the namespaces in a Cleanup, which runs even
// when the test fails.
func NewTestLossyPath(tb testing.TB, opt LossyOptions) *LossyPath {
	tb.Helper()
	SkipUnlessRoot(tb)
	if _, err := exec.LookPath("nft"); err != nil {
		tb.Skip("needs nft(8) (Debian package nftables)")
	}
	p, err := NewLossyPath(opt)
	if err != nil {
		tb.Fatalf("netnstest: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("netnstest: cleanup: %v", err)
		}
	})
	return p
}

// Close removes the three namespaces and every interface in them. Calls
// after the first do nothing (a bench's signal handler may race its own
// cleanup).
func (p *LossyPath) Close() error {
	p.closeOnce.Do(func() {
		var errs []error
		for _, n := range []*NS{p.A.NS, p.B.NS, p.Bridge} {
			if n != nil {
				errs = append(errs, n.Close())
			}
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// Impairment is what the path does now.
func (p *LossyPath) Impairment() Impairment { return p.im }

// Set replaces the impairment, in both directions at once (one nftables
// transaction), and starts the counters again from zero.
func (p *LossyPath) Set(im Impairment) error {
	if err := im.check(); err != nil {
		return err
	}
	var r strings.Builder
	// Creating the table first makes the delete valid when it does not
	// exist yet; the whole file is one transaction.
	fmt.Fprintf(&r, "table netdev %s {}\ndelete table netdev %s\ntable netdev %s {\n", p.table, p.table, p.table)
	for _, d := range p.directions() {
		for _, c := range []string{"frames", "dropped", "duplicated"} {
			fmt.Fprintf(&r, "\tcounter %s_%s {}\n", d.name, c)
		}
		fmt.Fprintf(&r, "\tchain %s {\n\t\ttype filter hook ingress device %q priority filter; policy accept;\n", d.name, d.in)
		fmt.Fprintf(&r, "\t\tudp dport %d counter name %q\n", RoCEv2Port, d.name+"_frames")
		if im.LossPerMille > 0 {
			fmt.Fprintf(&r, "\t\tudp dport %d numgen random mod 1000 < %d counter name %q drop\n", RoCEv2Port, im.LossPerMille, d.name+"_dropped")
		}
		if im.DupPerMille > 0 {
			fmt.Fprintf(&r, "\t\tudp dport %d numgen random mod 1000 < %d counter name %q dup to %q\n", RoCEv2Port, im.DupPerMille, d.name+"_duplicated", d.out)
		}
		r.WriteString("\t}\n")
	}
	r.WriteString("}\n")
	if _, err := p.nft(r.String(), "-f", "-"); err != nil {
		return err
	}
	p.im = im
	return nil
}

type direction struct{ name, in, out string }

func (p *LossyPath) directions() []direction {
	return []direction{{"a2b", p.PortA, p.PortB}, {"b2a", p.PortB, p.PortA}}
}

// DirCounters count one direction's RoCEv2 frames at the bridge.
type DirCounters struct {
	Frames     uint64 `json:"frames"`     // entered the bridge
	Dropped    uint64 `json:"dropped"`    // of those, dropped
	Duplicated uint64 `json:"duplicated"` // of those, delivered twice
	Bytes      uint64 `json:"bytes"`      // of the frames that entered (Ethernet header on)
}

// Delivered is how many frames left the bridge, duplicates included.
func (d DirCounters) Delivered() uint64 { return d.Frames - d.Dropped + d.Duplicated }

// PathCounters are both directions' counters since the last Set.
type PathCounters struct {
	AtoB DirCounters `json:"a_to_b"`
	BtoA DirCounters `json:"b_to_a"`
}

// Counters reads the path's counters.
func (p *LossyPath) Counters() (PathCounters, error) {
	out, err := p.nft("", "-j", "list", "counters", "table", "netdev", p.table)
	if err != nil {
		return PathCounters{}, err
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
				Bytes   uint64 `json:"bytes"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return PathCounters{}, fmt.Errorf("netnstest: nft counters: %w", err)
	}
	var pc PathCounters
	for _, e := range doc.Nftables {
		c := e.Counter
		if c == nil {
			continue
		}
		dir, what, _ := strings.Cut(c.Name, "_")
		d := &pc.AtoB
		if dir == "b2a" {
			d = &pc.BtoA
		}
		switch what {
		case "frames":
			d.Frames, d.Bytes = c.Packets, c.Bytes
		case "dropped":
			d.Dropped = c.Packets
		case "duplicated":
			d.Duplicated = c.Packets
		}
	}
	return pc, nil
}

// nft runs nft(8) in the bridge's namespace with stdin, bounded in time.
func (p *LossyPath) nft(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.Bridge.Name, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
