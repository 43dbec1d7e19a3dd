package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// event mirrors struct event in vethtrace.c.
type event struct {
	Ktime          uint64
	Netns, Ifindex uint32
	XDP, PeerXDP   uint32
	Sport, Pad     uint16
	Pad2           uint32
}

func main() {
	limit := flag.Duration("for", 10*time.Minute, "stop after this long")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: vethtrace [-for DURATION] NETNS...")
		os.Exit(2)
	}
	if err := run(flag.Args(), *limit); err != nil {
		fmt.Fprintln(os.Stderr, "vethtrace:", err)
		os.Exit(1)
	}
}

// tracer is the loaded probe.
type tracer struct {
	objs   vethtraceObjects
	link   link.Link
	rd     *ringbuf.Reader
	offset int64 // CLOCK_MONOTONIC to Unix ns
}

// newTracer watches the namespaces (names under /run/netns, or paths).
func newTracer(names []string) (_ *tracer, err error) {
	t := &tracer{}
	if err := loadVethtraceObjects(&t.objs, nil); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	for _, n := range names {
		p := n
		if !filepath.IsAbs(p) {
			p = filepath.Join("/run/netns", n)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return nil, fmt.Errorf("namespace %s: %w", n, err)
		}
		if err := t.objs.Netns.Put(uint32(st.Ino), uint8(1)); err != nil {
			return nil, err
		}
	}
	if t.link, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: "netif_rx", Program: t.objs.NetifRx}); err != nil {
		return nil, fmt.Errorf("attach to netif_rx: %w", err)
	}
	if t.rd, err = ringbuf.NewReader(t.objs.Events); err != nil {
		return nil, err
	}
	var mono unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono) // fails only for a bad pointer
	t.offset = time.Now().UnixNano() - mono.Nano()
	return t, nil
}

// next blocks for the next event; ringbuf.ErrClosed after Close.
func (t *tracer) next() (event, time.Time, error) {
	for {
		rec, err := t.rd.Read()
		if err != nil {
			return event{}, time.Time{}, err
		}
		b := rec.RawSample
		if len(b) < 32 {
			continue
		}
		e := event{
			Ktime: binary.NativeEndian.Uint64(b[0:]), Netns: binary.NativeEndian.Uint32(b[8:]),
			Ifindex: binary.NativeEndian.Uint32(b[12:]), XDP: binary.NativeEndian.Uint32(b[16:]),
			PeerXDP: binary.NativeEndian.Uint32(b[20:]), Sport: binary.NativeEndian.Uint16(b[24:]),
		}
		return e, time.Unix(0, int64(e.Ktime)+t.offset).UTC(), nil
	}
}

// Close detaches the probe; a blocked next returns.
func (t *tracer) Close() error {
	var errs []error
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
	}
	if t.link != nil {
		errs = append(errs, t.link.Close())
	}
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}

func run(names []string, limit time.Duration) (err error) {
	t, err := newTracer(names)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, t.Close()) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sig:
		case <-time.After(limit):
		}
		_ = t.rd.Close() // wakes the reader below, which then returns ErrClosed
	}()
	fmt.Println("# vethtrace: RoCEv2 frames handed to the stack by a veth (xdp: the receiving veth had an XDP program)")
	for {
		e, at, err := t.next()
		if errors.Is(err, ringbuf.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Printf("%s netns=%d ifindex=%d xdp=%d peer_xdp=%d sport=%d\n",
			at.Format("15:04:05.000000"), e.Netns, e.Ifindex, e.XDP, e.PeerXDP, e.Sport)
	}
}
