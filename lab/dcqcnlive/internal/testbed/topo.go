package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/lab/dcqcnlive/internal/ecnmark"
)

// Bottleneck describes sw→r: the tbf qdisc and the marker that mirrors it.
type Bottleneck struct {
	RateBitsPerSec uint64 // tbf rate
	BurstBytes     uint64 // tbf burst (bucket); keep it at 2–4 MTU
	LimitBytes     uint64 // tbf limit (bytes of backlog before drops)
	// Marker is the RED ramp (Kmin, Kmax, Pmax, Seed, Trace); its rate,
	// burst and limit are taken from the fields above.
	Marker ecnmark.Config
}

// Host is an end host: its namespace, its interface toward sw, and sw's
// interface facing it.
type Host struct {
	Name string // "h1", "h2", "r"
	NS   *netnstest.NS
	Link netnstest.Link // the host's interface
	Peer netnstest.Link // sw's interface on the same veth pair
}

// Topology is a built testbed.
type Topology struct {
	H1, H2, R  Host
	SW         *netnstest.NS
	Bottleneck Bottleneck
	MTU        int
	Marker     *ecnmark.Marker

	nl *netlink.Handle // netlink in sw, for qdisc statistics
}

// Subnets: 10.77.1.0/24 h1–sw, 10.77.2.0/24 h2–sw, 10.77.3.0/24 r–sw, sw
// being .1 on each. The namespaces are the test's own, so fixed addresses
// never meet any others.
var subnets = [3]string{"10.77.1.%d/24", "10.77.2.%d/24", "10.77.3.%d/24"}

// Build makes the testbed. mtu 0 means 1500. On error everything made so
// far is removed.
func Build(b Bottleneck, mtu int) (t *Topology, err error) {
	if mtu == 0 {
		mtu = 1500
	}
	if b.BurstBytes < uint64(mtu)+14 {
		return nil, fmt.Errorf("testbed: tbf burst %d bytes is below one frame (%d)", b.BurstBytes, mtu+14)
	}
	if b.LimitBytes < b.BurstBytes {
		return nil, errors.New("testbed: tbf limit below its burst")
	}
	mc := b.Marker
	mc.RateBitsPerSec, mc.BurstBytes, mc.LimitBytes = b.RateBitsPerSec, b.BurstBytes, b.LimitBytes
	t = &Topology{Bottleneck: b, MTU: mtu}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
			t = nil
		}
	}()
	for _, p := range []struct {
		ns  **netnstest.NS
		tag string
	}{{&t.H1.NS, "h1"}, {&t.H2.NS, "h2"}, {&t.SW, "sw"}, {&t.R.NS, "r"}} {
		if *p.ns, err = netnstest.Create("dl" + p.tag); err != nil {
			return t, err
		}
	}
	t.H1.Name, t.H2.Name, t.R.Name = "h1", "h2", "r"
	for i, h := range t.Hosts() {
		host := []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf(subnets[i], 2))}
		gw := []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf(subnets[i], 1))}
		if h.Link, h.Peer, err = netnstest.Connect(h.NS, t.SW, host, gw, mtu); err != nil {
			return t, err
		}
	}
	if err := nsExec(t.SW, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return t, err
	}
	for _, h := range t.Hosts() {
		steps := [][]string{
			{"route", "add", "default", "via", h.Peer.Addr.String()},
			{"neigh", "replace", h.Peer.Addr.String(), "lladdr", h.Peer.MAC.String(), "dev", h.Link.Name, "nud", "permanent"},
		}
		for _, s := range steps {
			if _, err := h.NS.IP(s...); err != nil {
				return t, err
			}
		}
		if _, err := t.SW.IP("neigh", "replace", h.Link.Addr.String(), "lladdr", h.Link.MAC.String(), "dev", h.Peer.Name, "nud", "permanent"); err != nil {
			return t, err
		}
		// Offloads off: a GSO super-frame would pass tbf and the marker
		// as one packet, and GRO would merge frames in sw.
		for _, e := range []struct {
			ns  *netnstest.NS
			dev string
		}{{h.NS, h.Link.Name}, {t.SW, h.Peer.Name}} {
			if err := nsExec(e.ns, "ethtool", "-K", e.dev, "gro", "off", "gso", "off", "tso", "off"); err != nil {
				return t, err
			}
		}
	}
	swr := t.R.Peer.Name
	if err := nsExec(t.SW, "tc", "qdisc", "add", "dev", swr, "root", "tbf",
		"rate", fmt.Sprintf("%dbit", b.RateBitsPerSec),
		"burst", fmt.Sprint(b.BurstBytes), "limit", fmt.Sprint(b.LimitBytes)); err != nil {
		return t, err
	}
	if t.Marker, err = ecnmark.Load(mc); err != nil {
		return t, err
	}
	if err := t.SW.Do(func() error { return t.Marker.Attach(t.R.Peer.Index) }); err != nil {
		return t, err
	}
	h, err := netns.GetFromName(t.SW.Name)
	if err != nil {
		return t, fmt.Errorf("testbed: open %s: %w", t.SW.Name, err)
	}
	defer h.Close()
	if t.nl, err = netlink.NewHandleAt(h); err != nil {
		return t, fmt.Errorf("testbed: netlink in %s: %w", t.SW.Name, err)
	}
	return t, nil
}

// Hosts returns h1, h2 and r.
func (t *Topology) Hosts() []*Host { return []*Host{&t.H1, &t.H2, &t.R} }

// Close removes the namespaces (and with them the veths, the qdiscs and the
// filter) and releases the marker. It is safe on a partly built topology.
func (t *Topology) Close() error {
	var errs []error
	if t.nl != nil {
		t.nl.Close()
	}
	for _, ns := range []*netnstest.NS{t.H1.NS, t.H2.NS, t.SW, t.R.NS} {
		if ns != nil {
			errs = append(errs, ns.Close())
		}
	}
	if t.Marker != nil {
		errs = append(errs, t.Marker.Close())
	}
	return errors.Join(errs...)
}

// QdiscStats is what tbf reports (`tc -s qdisc show dev sw-r`).
type QdiscStats struct {
	BacklogBytes, BacklogPackets uint32
	Drops, Overlimits            uint32
	SentBytes                    uint64
	SentPackets                  uint32
}

// BottleneckStats reads the tbf qdisc's statistics over netlink.
func (t *Topology) BottleneckStats() (QdiscStats, error) {
	link, err := t.nl.LinkByIndex(t.R.Peer.Index)
	if err != nil {
		return QdiscStats{}, fmt.Errorf("testbed: sw→r link: %w", err)
	}
	qs, err := t.nl.QdiscList(link)
	if err != nil {
		return QdiscStats{}, fmt.Errorf("testbed: qdiscs on sw→r: %w", err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if q.Type() != "tbf" || a.Parent != netlink.HANDLE_ROOT {
			continue
		}
		if a.Statistics == nil || a.Statistics.Queue == nil || a.Statistics.Basic == nil {
			return QdiscStats{}, errors.New("testbed: tbf reported no statistics")
		}
		s := a.Statistics
		return QdiscStats{
			BacklogBytes: s.Queue.Backlog, BacklogPackets: s.Queue.Qlen,
			Drops: s.Queue.Drops, Overlimits: s.Queue.Overlimits,
			SentBytes: s.Basic.Bytes, SentPackets: s.Basic.Packets,
		}, nil
	}
	return QdiscStats{}, errors.New("testbed: no tbf root qdisc on sw→r")
}

// nsExec runs a command inside ns (ip netns exec), bounded in time.
func nsExec(ns *netnstest.NS, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testbed: %s in %s: %w: %s", strings.Join(args, " "), ns.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nsExecStdin is nsExec with stdin.
func nsExecStdin(ns *netnstest.NS, stdin string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: %s in %s: %w: %s", strings.Join(args, " "), ns.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}
