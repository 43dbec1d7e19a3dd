package bpf

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Generator transmits frames out of an interface from inside the kernel: the
// trafficgen program run with BPF_PROG_TEST_RUN in live frame mode
// (BPF_F_TEST_XDP_LIVE_FRAMES, Linux 5.18+), whose XDP_TX verdict the kernel
// turns into a redirect out of the interface. It exists for receive benches:
// an AF_XDP copy-mode sender pays an skb, a copy and the peer's NAPI poll per
// frame in its sendto, and on a small machine that, not the receiver, sets
// the receive rate. The generator skips the skb and the system call per
// frame, so the receiver is what is measured.
//
// The interface must take XDP redirects (ndo_xdp_xmit): on a veth that means
// an XDP program attached to it or GRO on, and the peer must have an XDP
// program attached (veth delivers redirected frames only to the peer's XDP
// receive path). Needs CAP_BPF and CAP_NET_ADMIN.
type Generator struct {
	prog    *ebpf.Program
	ifindex int
}

// xdpMD is struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// testXDPLiveFrames is BPF_F_TEST_XDP_LIVE_FRAMES.
const testXDPLiveFrames = 1 << 1

// ErrLiveFramesRefused is what Send returns, wrapped, when the kernel
// answers live frame mode with EPERM although the caller loaded the
// program, as some vendor kernels do even for root. Benches and tests
// that need the generator cannot run there.
var ErrLiveFramesRefused = errors.New("bpf: the kernel refuses BPF_PROG_RUN in live frame mode")

// MaxGeneratorFrame bounds the frames Send accepts: live frame mode builds
// each frame in one page after the XDP headroom and before the
// skb_shared_info tail (about 3.5 KiB on 4 KiB pages; kept conservative).
const MaxGeneratorFrame = 3000

// NewGenerator loads the generator for the interface ifindex.
func NewGenerator(ifindex int) (*Generator, error) {
	spec, err := loadTrafficgen()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Trafficgen *ebpf.Program `ebpf:"trafficgen"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("bpf: load trafficgen: %w", err)
	}
	return &Generator{prog: objs.Trafficgen, ifindex: ifindex}, nil
}

// Send transmits n copies of frame and returns when the kernel has handed
// them all to the interface (each then succeeds or is dropped by the
// receiver, as on a wire). It must run on a thread in the interface's network
// namespace: the kernel resolves the ifindex there. Send allocates (the
// test-run call marshals its arguments): it is for benches, not hot paths.
func (g *Generator) Send(frame []byte, n uint32) error {
	if len(frame) < 14 || len(frame) > MaxGeneratorFrame {
		return fmt.Errorf("bpf: generator frame of %d bytes: must be 14 to %d", len(frame), MaxGeneratorFrame)
	}
	if n == 0 {
		return nil
	}
	md := xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(g.ifindex)}
	// Live frame mode reports no verdict (the frames went their way).
	_, err := g.prog.Run(&ebpf.RunOptions{
		Data:    frame,
		Context: &md,
		Repeat:  n,
		Flags:   testXDPLiveFrames,
	})
	if err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("bpf: generator on ifindex %d (live frame mode needs Linux 5.18+ and an ifindex in this namespace): %w", g.ifindex, err)
		}
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("%w (generator on ifindex %d): %w", ErrLiveFramesRefused, g.ifindex, err)
		}
		return fmt.Errorf("bpf: generator on ifindex %d: %w", g.ifindex, err)
	}
	return nil
}

// Close unloads the generator.
func (g *Generator) Close() error { return g.prog.Close() }

// Sink is an XDP program, attached to an interface, that drops every frame
// and counts the RoCEv2 ones: the peer of a transmit bench. On veth the sender's sendto
// runs the peer's receive path, so what the peer does with a frame is billed
// to the sender; dropping at the XDP hook is the least it can cost, the
// nearest thing to a wire that takes frames away, and the count proves the
// frames got there.
type Sink struct {
	prog *ebpf.Program
	sunk *ebpf.Map
	link link.Link
}

// AttachSink loads the sink and attaches it to ifindex in driver mode (the
// interface must support native XDP, as veth does), in the calling thread's
// network namespace.
func AttachSink(ifindex int) (*Sink, error) {
	spec, err := loadTrafficgen()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Sink *ebpf.Program `ebpf:"sink"`
		Sunk *ebpf.Map     `ebpf:"sunk"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("bpf: load sink: %w", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.Sink, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		objs.Sink.Close()
		objs.Sunk.Close()
		return nil, fmt.Errorf("bpf: attach sink to ifindex %d: %w", ifindex, err)
	}
	return &Sink{prog: objs.Sink, sunk: objs.Sunk, link: l}, nil
}

// Count is the number of RoCEv2 frames (UDP to 4791) the sink has dropped,
// over all CPUs; the stack's own frames (ARP, neighbour discovery) are
// dropped without being counted.
func (s *Sink) Count() (uint64, error) {
	var percpu []uint64
	if err := s.sunk.Lookup(uint32(0), &percpu); err != nil {
		return 0, fmt.Errorf("bpf: read sink count: %w", err)
	}
	var n uint64
	for _, v := range percpu {
		n += v
	}
	return n, nil
}

// Close detaches and unloads the sink.
func (s *Sink) Close() error {
	return errors.Join(s.link.Close(), s.prog.Close(), s.sunk.Close())
}
