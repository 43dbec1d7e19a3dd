package dcqcn

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// HostCCConfig says when a receiving host is congested itself: its NIC
// (here, the AF_XDP socket's rings) is about to drop frames for want of
// receive buffers, whatever the fabric says. hostCC (Agarwal et al.,
// SIGCOMM 2023) signals such host congestion to the senders through the
// congestion control they already run; DCQCN's is the CNP, so the
// notification point answers the packets that arrive while the host is
// congested as it answers CE-marked ones, without a mark from the network.
type HostCCConfig struct {
	// FillLow: the host is congested while fewer than this fraction of its
	// receive buffers wait on the FILL ring for the kernel (an AF_XDP
	// socket drops what arrives when it finds FILL empty). 0: 1/4.
	FillLow float64
	// RxHigh: the host is congested while at least this fraction of its
	// receive buffers hold frames received and not yet read (the RX ring
	// backing up: the reader is behind). 0: 1/2.
	RxHigh float64
	// Hold is how long the host stays congested after the last reading
	// over a threshold, so that one reading under it between bursts does
	// not end the signal. 0: 100 µs.
	Hold time.Duration
	// Off disables the signal.
	Off bool
}

// Default thresholds of HostCCConfig.
const (
	DefaultHostFillLow = 0.25
	DefaultHostRxHigh  = 0.5
	DefaultHostHold    = 100 * time.Microsecond
)

// ParseHostCC parses the tools' --host-cc and the daemon's dcqcn.host_cc:
// "on" (or empty) for the defaults, "off", or a comma-separated list of
// fill=F (FillLow), rx=R (RxHigh), each a fraction in (0, 1], and
// hold=DURATION (Hold, up to a second); what the list leaves out keeps
// its default. fill=1 calls every reading congested in which the reader
// holds frames: a deterministic signal for tests and experiments.
func ParseHostCC(s string) (HostCCConfig, error) {
	var c HostCCConfig
	switch s {
	case "", "on":
		return c, nil
	case "off":
		c.Off = true
		return c, nil
	}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("host congestion %q: %q is not KEY=VALUE (fill, rx, hold) or on, off", s, kv)
		}
		switch k {
		case "fill", "rx":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0 && f <= 1) {
				return c, fmt.Errorf("host congestion %s=%q: want a fraction in (0, 1]", k, v)
			}
			if k == "fill" {
				c.FillLow = f
			} else {
				c.RxHigh = f
			}
		case "hold":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > time.Second {
				return c, fmt.Errorf("host congestion hold=%q: want a duration in (0, 1s]", v)
			}
			c.Hold = d
		default:
			return c, fmt.Errorf("host congestion %q: unknown key %q (fill, rx, hold)", s, k)
		}
	}
	return c, nil
}

// String is c in ParseHostCC's syntax, with the defaults applied.
func (c HostCCConfig) String() string {
	if c.Off {
		return "off"
	}
	var h HostCC
	h.Init(c)
	c = h.cfg
	return fmt.Sprintf("fill=%g,rx=%g,hold=%v", c.FillLow, c.RxHigh, c.Hold)
}

// HostCCCounters count what the host-congestion detector saw.
type HostCCCounters struct {
	// Readings counts ring readings over a threshold.
	Readings uint64
	// Episodes counts the times the host went from uncongested to
	// congested.
	Episodes uint64
	// Marks counts the packets HostCC.Mark let the notification point
	// answer as CE-marked.
	Marks uint64
}

// HostCC detects host congestion from the receive rings' occupancy and
// decides, for each QP's arriving packet, whether the notification point
// answers it as if it were CE-marked: at most once per QP per interval,
// the NP's own CNP spacing, so that each mark asks for one CNP. One per
// receiving port; pure (an explicit now), no allocation.
type HostCC struct {
	cfg   HostCCConfig
	until clock.Time // congested before this time
	on    bool       // congested as of the last reading
	HostCCCounters
}

// NewHostCC returns a detector; zero fields of cfg take their defaults.
func NewHostCC(cfg HostCCConfig) *HostCC { h := new(HostCC); h.Init(cfg); return h }

// Init (re)initialises h in place.
func (h *HostCC) Init(cfg HostCCConfig) {
	if !(cfg.FillLow > 0) {
		cfg.FillLow = DefaultHostFillLow
	}
	if !(cfg.RxHigh > 0) {
		cfg.RxHigh = DefaultHostRxHigh
	}
	if cfg.Hold <= 0 {
		cfg.Hold = DefaultHostHold
	}
	*h = HostCC{cfg: cfg}
}

// Config returns the detector's configuration with its defaults applied.
func (h *HostCC) Config() HostCCConfig { return h.cfg }

// Observe reads the receive rings at now: fill buffers wait on the FILL
// ring, queued frames wait on the RX ring, out of buffers in all
// (buffers <= 0: unknown, no reading).
func (h *HostCC) Observe(now clock.Time, fill, queued, buffers int) {
	if h.cfg.Off || buffers <= 0 {
		return
	}
	b := float64(buffers)
	if float64(fill) >= h.cfg.FillLow*b && float64(queued) < h.cfg.RxHigh*b {
		return
	}
	h.Readings++
	if !h.Congested(now) {
		h.Episodes++
	}
	h.until = now + clock.Time(h.cfg.Hold)
	h.on = true
}

// Congested reports whether the host is congested at now.
func (h *HostCC) Congested(now clock.Time) bool {
	if h.on && now >= h.until {
		h.on = false
	}
	return h.on
}

// HostMark is one QP's state for HostCC.Mark: when its last host mark
// was, and how many it had. The zero value has never been marked.
type HostMark struct {
	last   clock.Time
	marked bool
	Marks  uint64 // the QP's host marks (np_host_cc_marks)
}

// Mark reports whether a packet of the QP whose state is m, arriving at
// now, is to be answered as CE-marked for host congestion: the host is
// congested and the QP's last host mark is at least interval old (0 or
// less: the Hold). The caller passes packets its NP would answer (data,
// not acknowledgements) that the network did not mark already.
func (h *HostCC) Mark(now clock.Time, m *HostMark, interval time.Duration) bool {
	if !h.Congested(now) {
		return false
	}
	if interval <= 0 {
		interval = h.cfg.Hold
	}
	if m.marked && now-m.last < clock.Time(interval) {
		return false
	}
	m.marked, m.last = true, now
	m.Marks++
	h.Marks++
	return true
}
