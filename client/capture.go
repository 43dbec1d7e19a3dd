package client

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
)

// CaptureOptions select what a capture records.
type CaptureOptions struct {
	Count    int    // stop after this many frames; 0 = until Close
	QPN      uint32 // with FilterQP, only this QP's frames
	FilterQP bool
	PCAPNG   bool // pcapng with each frame's direction, instead of classic pcap
}

// CaptureStats is what a finished capture reports.
type CaptureStats struct {
	Written uint64 // frames in the file
	Dropped uint64 // frames lost because the writer fell behind the data path
}

// Capture asks the daemon to write the RoCE frames it sends and receives
// into f, which this process opened for writing (the daemon writes through
// the descriptor, so the file has this user's ownership and rights). Only
// root may capture. Use a Client dedicated to the capture: its connection
// carries the capture's end. Stop it early by closing the Client; the
// daemon flushes the file first.
func (c *Client) Capture(f *os.File, opt CaptureOptions) (*CaptureRun, error) {
	req := proto.CaptureReq{Count: uint32(opt.Count), QPN: opt.QPN}
	if opt.FilterQP {
		req.FilterQP = 1
	}
	if opt.PCAPNG {
		req.PCAPNG = 1
	}
	if _, _, err := c.call(proto.OpCapture, &req, 0, int(f.Fd())); err != nil {
		return nil, err
	}
	return &CaptureRun{c: c, seq: c.seq}, nil
}

// CaptureRun is a running capture.
type CaptureRun struct {
	c   *Client
	seq uint32
}

// Wait blocks until the capture ends (its Count reached, or an error) and
// returns what it wrote.
func (r *CaptureRun) Wait() (CaptureStats, error) {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	for {
		h, body, fds, err := r.c.conn.Recv()
		if err != nil {
			return CaptureStats{}, fmt.Errorf("softrnic capture: %w", err)
		}
		proto.CloseFDs(fds)
		if h.Op != proto.OpCapture || h.Seq != r.seq {
			continue
		}
		if h.Errno != 0 {
			return CaptureStats{}, &proto.Error{Op: proto.OpCapture, Errno: unix.Errno(h.Errno), Msg: string(body)}
		}
		var res proto.CaptureResult
		if err := proto.DecodeBody(body, &res); err != nil {
			return CaptureStats{}, err
		}
		return CaptureStats{Written: res.Written, Dropped: res.Dropped}, nil
	}
}
