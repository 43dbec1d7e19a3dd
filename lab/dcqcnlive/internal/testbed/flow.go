package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afpacket"
)

// FlowSpec is one flow of an experiment: a sender on Src (h1 or h2) and a
// receiver on Dst (r).
type FlowSpec struct {
	ID       int   // 1, 2, ...
	Src, Dst *Host // sender and receiver hosts
	// RateBitsPerSec is the rate the sender starts at: the (dilated) line
	// rate for a DCQCN sender, the fixed rate of a raw one.
	RateBitsPerSec uint64
	PayloadBytes   int // RDMA payload per packet (the path MTU)
	// Duration is how long the flow is to send (processes that take a
	// duration up front need it; Stop ends the flow in any case).
	Duration time.Duration
	TClass   uint8 // IPv4 TOS of data packets: DSCP<<2 | ECN; ECT(0) is 2
	DestQP   uint32
	// CC (softrnic's --cc: "dcqcn:paper", "swift:default", ...), Profile
	// (its profile) and Scale (time dilation S) say which congestion
	// control a congestion-controlled sender runs: the profile at its
	// undilated line rate, dilated by S (for DCQCN, DilateRP and DilateNP).
	CC      string
	Profile string
	Scale   float64
}

// EndpointCounters are what a flow's endpoints report about themselves,
// with the mlx5 counter names where the engine has them.
type EndpointCounters struct {
	SentFrames    uint64 `json:"sent_frames"`
	SentBytes     uint64 `json:"sent_bytes"`
	SkippedFrames uint64 `json:"skipped_frames"` // raw sender: frames given up because the sender fell behind its schedule
	RecvFrames    uint64 `json:"recv_frames"`
	RecvBytes     uint64 `json:"recv_bytes"`
	RecvCE        uint64 `json:"np_ecn_marked_roce_packets"`
	RecvBadICRC   uint64 `json:"recv_bad_icrc"`
	CNPSent       uint64 `json:"np_cnp_sent"`
	CNPHandled    uint64 `json:"rp_cnp_handled"`
	CNPIgnored    uint64 `json:"rp_cnp_ignored"`
	// RPRateMbps is the rate the sender's congestion control allowed when
	// it stopped, from its JSON (softrnic endpoints; 0 otherwise): DCQCN's
	// rate (R_C), TIMELY's rate, Swift's pacing rate capped by its window
	// over its smoothed RTT. RPAlpha is DCQCN's α. A flow whose mean rate
	// at the bottleneck is well below what its congestion control allowed
	// was held back by its host (CPU), not by the algorithm.
	RPRateMbps float64 `json:"rp_rate_mbps,omitempty"`
	RPAlpha    float64 `json:"rp_alpha,omitempty"`
	// The sender QPs' own congestion-control counts and last figures (perf
	// --json's cc object): RTT samples, decreases, loss events, times the
	// window was full; Swift's window in packets, the smoothed and minimum
	// RTT, the last host delay and fabric target (µs).
	CCRTTSamples uint64  `json:"cc_rtt_samples,omitempty"`
	CCDecreases  uint64  `json:"cc_decreases,omitempty"`
	CCLossEvents uint64  `json:"cc_loss_events,omitempty"`
	CCWindowFull uint64  `json:"cc_window_full,omitempty"`
	Cwnd         float64 `json:"cwnd,omitempty"`
	SRTTUs       float64 `json:"srtt_us,omitempty"`
	MinRTTUs     float64 `json:"min_rtt_us,omitempty"`
	HostDelayUs  float64 `json:"host_delay_us,omitempty"`
	TargetUs     float64 `json:"target_us,omitempty"`
}

// Flow is a running flow.
type Flow interface {
	// Stop stops the sender (bounded in time); the receiver keeps counting
	// until Endpoints.Close.
	Stop() error
	// Counters reads the endpoints' counters.
	Counters() EndpointCounters
}

// Endpoints makes the flows of an experiment. Today there is RawECT, an
// uncontrolled raw sender; softrnic's engine, once it has DCQCN on the wire,
// is the implementation the experiment exists for.
type Endpoints interface {
	// Name is a short label ("raw-ect0", "softrnic").
	Name() string
	// CongestionControlled says whether senders react to CNPs.
	CongestionControlled() bool
	// StartFlow starts one flow; it returns once the sender is sending.
	StartFlow(t *Topology, spec FlowSpec) (Flow, error)
	// Close stops everything still running and releases the receivers.
	Close() error
}

// RawECT sends RoCEv2 RC SEND_ONLY frames with the flow's TOS (ECT(0)
// normally), a valid ICRC and a fixed rate from an AF_PACKET socket on the
// sender host, and counts them, their CE marks and their ICRC at r with
// another AF_PACKET socket. It is NOT congestion-controlled: it never reads
// a CNP, so it proves the bottleneck and the marker, not DCQCN.
type RawECT struct {
	mu   sync.Mutex
	sink *rawSink
	runs []*rawFlow
}

// Name implements Endpoints.
func (*RawECT) Name() string { return "raw-ect0" }

// CongestionControlled implements Endpoints: raw senders ignore CNPs.
func (*RawECT) CongestionControlled() bool { return false }

// StartFlow implements Endpoints.
func (r *RawECT) StartFlow(t *Topology, spec FlowSpec) (Flow, error) {
	if spec.RateBitsPerSec == 0 || spec.PayloadBytes <= 0 || spec.PayloadBytes%4 != 0 {
		return nil, errors.New("testbed: raw flow needs a rate and a payload size that is a multiple of 4")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sink == nil {
		s, err := startSink(spec.Dst)
		if err != nil {
			return nil, err
		}
		r.sink = s
	}
	f := &rawFlow{sink: r.sink, key: flowKey{spec.Src.Link.Addr, spec.DestQP}, done: make(chan error, 1)}
	s := frame.Spec{
		Src: spec.Src.Link.Addr, Dst: spec.Dst.Link.Addr, TOS: spec.TClass,
		SrcPort: 0xC000 | uint16(spec.ID),
		BTH:     bth.BTHFields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: spec.DestQP},
	}
	copy(s.DstMAC[:], spec.Src.Peer.MAC)
	copy(s.SrcMAC[:], spec.Src.Link.MAC)
	f.spec = s
	f.frameLen = frame.Size(&s, spec.PayloadBytes)
	if f.frameLen > t.MTU+14 {
		return nil, fmt.Errorf("testbed: %d-byte payload makes %d-byte frames, MTU %d", spec.PayloadBytes, f.frameLen, t.MTU)
	}
	f.payload = spec.PayloadBytes
	f.rate = spec.RateBitsPerSec
	if err := spec.Src.NS.Do(func() error {
		p, err := afpacket.Open(afpacket.Config{IfIndex: spec.Src.Link.Index, RingBytes: 1 << 20})
		f.port = p
		return err
	}); err != nil {
		return nil, fmt.Errorf("testbed: raw sender on %s: %w", spec.Src.Name, err)
	}
	r.sink.register(f.key)
	go f.run()
	r.runs = append(r.runs, f)
	return f, nil
}

// Close implements Endpoints.
func (r *RawECT) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range r.runs {
		errs = append(errs, f.Stop())
	}
	if r.sink != nil {
		errs = append(errs, r.sink.close())
		r.sink = nil
	}
	return errors.Join(errs...)
}

type flowKey struct {
	src netip.Addr
	qp  uint32
}

// rawFlow is one paced sender.
type rawFlow struct {
	port     *afpacket.Port
	copier   port.Copier // its frames are built in run's buffers
	spec     frame.Spec
	frameLen int
	payload  int
	rate     uint64
	sink     *rawSink
	key      flowKey

	sent, sentBytes, skipped atomic.Uint64
	stop                     atomic.Bool
	stopped                  bool
	done                     chan error
	stopMu                   sync.Mutex
}

// maxBatch frames go out per sendmmsg. A sender may fall behind its
// schedule by maxDebt frames or maxDebtTime, whichever is more, before it
// gives frames up: a descheduled sender must not come back with a
// line-rate burst, but a sleep on a loaded host lasts milliseconds, so the
// allowance must cover a few sleeps or the rate could not be reached.
const (
	maxBatch    = 32
	maxDebt     = 8
	maxDebtTime = 3 * time.Millisecond
)

// debtLimit is the catch-up allowance in frames for a sender of rate b/s
// sending frames of bitsPerFrame.
func debtLimit(rate, bitsPerFrame uint64) uint64 {
	return max(maxDebt, rate*uint64(maxDebtTime/time.Microsecond)/1e6/bitsPerFrame)
}

func (f *rawFlow) run() {
	bufs := make([][]byte, maxBatch)
	for i := range bufs {
		bufs[i] = make([]byte, f.frameLen)
		for k := range bufs[i] {
			bufs[i][k] = byte(k) // payload pattern; headers overwrite the front
		}
	}
	out := make([][]byte, 0, maxBatch)
	var b frame.Builder
	var psn uint32
	start := monoNow()
	bitsPerFrame := uint64(f.frameLen) * 8
	var sched uint64 // frames the schedule has used up (sent or skipped)
	debt := debtLimit(f.rate, bitsPerFrame)
	var err error
	for !f.stop.Load() {
		now := monoNow()
		due := (now - start) / 1000 * f.rate / 1e6 / bitsPerFrame // µs·bit/s, no overflow for hours
		if due > sched+debt {
			f.skipped.Add(due - debt - sched)
			sched = due - debt
		}
		n := min(int(due-sched), maxBatch)
		if n == 0 {
			next := start + (sched+1)*bitsPerFrame*1e6/f.rate*1000
			time.Sleep(time.Duration(max(next-now, 50_000)))
			continue
		}
		out = out[:0]
		for i := 0; i < n; i++ {
			f.spec.BTH.PSN = bth.PSN(psn + uint32(i))
			f.spec.IPID = uint16(psn + uint32(i))
			if err = buildRaw(&b, bufs[i], &f.spec, f.payload); err != nil {
				break
			}
			out = append(out, bufs[i])
		}
		if err != nil {
			break
		}
		sent, serr := f.copier.Send(f.port, out)
		if serr != nil {
			err = serr
			break
		}
		psn += uint32(sent)
		sched += uint64(sent)
		f.sent.Add(uint64(sent))
		f.sentBytes.Add(uint64(sent * f.frameLen))
		if sent < n {
			time.Sleep(100 * time.Microsecond) // socket buffer full
		}
	}
	f.done <- err
}

// buildRaw writes one frame into buf: headers, the payload already there,
// pad, lengths, checksum and ICRC. It does not allocate.
func buildRaw(b *frame.Builder, buf []byte, s *frame.Spec, payload int) error {
	if _, err := b.Headers(buf, s); err != nil {
		return err
	}
	_, err := b.Finish(buf, payload)
	return err
}

// Stop implements Flow.
func (f *rawFlow) Stop() error {
	f.stopMu.Lock()
	defer f.stopMu.Unlock()
	if f.stopped {
		return nil
	}
	f.stopped = true
	f.stop.Store(true)
	err := <-f.done
	return errors.Join(err, f.port.Close())
}

// Counters implements Flow.
func (f *rawFlow) Counters() EndpointCounters {
	c := f.sink.counts(f.key)
	c.SentFrames, c.SentBytes, c.SkippedFrames = f.sent.Load(), f.sentBytes.Load(), f.skipped.Load()
	return c
}

// rawSink receives every raw flow at r.
type rawSink struct {
	port *afpacket.Port
	mu   sync.Mutex
	per  map[flowKey]*EndpointCounters
	// other counts RoCEv2 frames of no registered flow, unparsable ones
	// included.
	other atomic.Uint64
	stop  atomic.Bool
	done  chan error
}

func startSink(h *Host) (*rawSink, error) {
	s := &rawSink{per: map[flowKey]*EndpointCounters{}, done: make(chan error, 1)}
	if err := h.NS.Do(func() error {
		p, err := afpacket.Open(afpacket.Config{IfIndex: h.Link.Index})
		s.port = p
		return err
	}); err != nil {
		return nil, fmt.Errorf("testbed: raw receiver on %s: %w", h.Name, err)
	}
	// No UDP socket listens on 4791 at r: without this the kernel would
	// answer every frame with ICMP port unreachable (rate-limited). Best
	// effort: without nftables the ICMP goes back to the senders, off the
	// bottleneck.
	_ = nsExecStdin(h.NS, "table inet softrnic_dcqcnlive {\n chain in {\n  type filter hook input priority 0; policy accept;\n  udp dport 4791 drop\n }\n}\n", "nft", "-f", "-")
	go s.loop()
	return s, nil
}

func (s *rawSink) register(k flowKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.per[k] == nil {
		s.per[k] = &EndpointCounters{}
	}
}

func (s *rawSink) loop() {
	frames := make([][]byte, 64)
	var f frame.Frame
	var err error
	for !s.stop.Load() {
		n, rerr := s.port.Recv(frames, 50*time.Millisecond)
		if rerr != nil {
			err = rerr
			break
		}
		if n > 0 {
			s.account(frames[:n], &f)
		}
	}
	s.done <- err
}

// account counts received frames; it does not allocate.
func (s *rawSink) account(frames [][]byte, f *frame.Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range frames {
		if frame.Parse(b, f) != nil {
			s.other.Add(1)
			continue
		}
		c := s.per[flowKey{f.Src(), f.BTH().DestQP()}]
		if c == nil {
			s.other.Add(1)
			continue
		}
		c.RecvFrames++
		c.RecvBytes += uint64(len(b))
		if f.ECN() == 3 {
			c.RecvCE++
		}
		if !f.VerifyICRC() {
			c.RecvBadICRC++
		}
	}
}

func (s *rawSink) counts(k flowKey) EndpointCounters {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.per[k]; c != nil {
		return *c
	}
	return EndpointCounters{}
}

func (s *rawSink) close() error {
	s.stop.Store(true)
	err := <-s.done
	return errors.Join(err, s.port.Close())
}
