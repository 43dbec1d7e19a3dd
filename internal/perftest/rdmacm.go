package perftest

import (
	"context"
	"encoding/binary"
	"fmt"
)

// perftest -R (--rdma_cm) replaces the TCP side channel by an RC
// connection made through rdma_cm: every exchange of the TCP channel
// becomes one SEND on that control QP (the client sends first, as it writes
// first on TCP), key records travel as the binary struct pingpong_dest
// instead of text, and the test's QPs are connected by a second CM
// handshake rather than from the records (create_rdma_cm_connection):
//
//	version (16 B), page size (4 B), cache line (4 B), MTU (2 B "%d")
//	pingpong_dest of zeros                 (before the test QPs exist)
//	CM REQ/REP/RTU for each test QP        (same rdma_cm port)
//	pingpong_dest of zeros
//	then the test's phases as on TCP (Test.Plan), every record a
//	pingpong_dest and the reports five 8-byte SENDs, the closing handshake
//	without "done"; then DREQ/DREP for the test QPs and the control QP.
//
// The capture write_bw_rdmacm.pcap (ib_write_bw -R between two rxe hosts)
// holds exactly this sequence.

// CMDestSize is struct pingpong_dest as perftest up to early 2026 sends
// it over the control QP: lid, out_reads, qpn, psn, rkey (4 bytes each), 4
// bytes of alignment, vaddr (8), gid (16), srqn, gid_index (4 each), every
// integer big-endian (rdma_write_keys converts each to network order).
// CMDestSizeTail is the record of later perftests, whose struct has a
// tail_markers_vaddr (8) after vaddr, which moves the GID and what follows
// by 8 bytes. A -R peer reads records in its own layout only, so RunCM
// answers in the layout the peer used.
const (
	CMDestSize     = 56
	CMDestSizeTail = 64
)

// AppendCMDest appends d as a binary pingpong_dest of size bytes
// (CMDestSize or CMDestSizeTail, whose tail_markers_vaddr we send as 0: we
// have no data-validation tail markers); gidIndex is the index of d.GID in
// the sender's own GID table (perftest sends it, its peer only prints it).
func AppendCMDest(b []byte, d Dest, gidIndex, size int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(d.LID))
	b = binary.BigEndian.AppendUint32(b, uint32(d.OutReads))
	b = binary.BigEndian.AppendUint32(b, d.QPN)
	b = binary.BigEndian.AppendUint32(b, d.PSN)
	b = binary.BigEndian.AppendUint32(b, d.RKey)
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, d.VAddr)
	if size == CMDestSizeTail {
		b = binary.BigEndian.AppendUint64(b, 0)
	}
	b = append(b, d.GID[:]...)
	b = binary.BigEndian.AppendUint32(b, d.SRQN)
	return binary.BigEndian.AppendUint32(b, uint32(int32(gidIndex)))
}

// ParseCMDest reads a binary pingpong_dest of either layout, told apart by
// its length. Fields wider than their use (LID and out_reads are 16-bit,
// QPN and PSN 24-bit) are refused rather than truncated: such a record is
// not from a perftest.
func ParseCMDest(b []byte) (Dest, int, error) {
	if len(b) != CMDestSize && len(b) != CMDestSizeTail {
		return Dest{}, 0, fmt.Errorf("%w: %d bytes, want a pingpong_dest of %d or %d", errRecord, len(b), CMDestSize, CMDestSizeTail)
	}
	be := binary.BigEndian
	lid, outs, qpn, psn := be.Uint32(b[0:]), be.Uint32(b[4:]), be.Uint32(b[8:]), be.Uint32(b[12:])
	if lid > 0xffff || outs > 0xffff || qpn > 0xffffff || psn > 0xffffff {
		return Dest{}, 0, fmt.Errorf("%w: field out of range (lid %#x, out_reads %#x, QPN %#x, PSN %#x)", errRecord, lid, outs, qpn, psn)
	}
	g := 32 // the GID's offset
	if len(b) == CMDestSizeTail {
		g = 40
	}
	d := Dest{LID: uint16(lid), OutReads: uint16(outs), QPN: qpn, PSN: psn, RKey: be.Uint32(b[16:]),
		VAddr: be.Uint64(b[24:]), SRQN: be.Uint32(b[g+16:])}
	copy(d.GID[:], b[g:g+16])
	return d, int(int32(be.Uint32(b[g+20:]))), nil
}

// MsgChannel is the control QP of perftest -R as the protocol sees it:
// whole messages, in order (an RC QP delivers them so).
type MsgChannel interface {
	// Send sends b as one SEND and returns once it completed.
	Send(ctx context.Context, b []byte) error
	// Recv receives the next message into b and returns its length; a
	// message longer than b is an error.
	Recv(ctx context.Context, b []byte) (int, error)
}

// msgStream lets Conn's fixed-size exchanges run over a MsgChannel: one
// Write is one SEND; each read that Conn starts (io.ReadFull of exactly
// one field) must be satisfied by exactly one message, so a peer whose
// message sizes differ from ours is caught at once instead of desynchronising
// the channel.
type msgStream struct {
	ctx context.Context
	ch  MsgChannel
	buf [CMDestSizeTail]byte
}

func (s *msgStream) Write(b []byte) (int, error) {
	if err := s.ch.Send(s.ctx, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s *msgStream) Read(p []byte) (int, error) {
	n, err := s.ch.Recv(s.ctx, s.buf[:])
	if err != nil {
		return 0, err
	}
	if n != len(p) {
		return 0, fmt.Errorf("perftest: control message of %d bytes, want %d", n, len(p))
	}
	return copy(p, s.buf[:n]), nil
}

// LocalCM is the device side of a -R test: Local, plus the CM connection
// of the test's QPs.
type LocalCM interface {
	Local
	// ConnectQPs creates the test's buffers and connects its QPs through
	// rdma_cm (the client dials, the server accepts), one connection per
	// QP. Dests is called after it and returns the connected QPs' records;
	// Connect then only learns the peer's records (the CM has already
	// moved the QPs to RTS).
	ConnectQPs(n Negotiated) error
}

// RunCM drives one -R test over the control channel ch: the preamble, the
// zero records around ConnectQPs, then the test's phases as Run does on
// TCP. gidIndex is sent in our records.
func RunCM(ctx context.Context, ch MsgChannel, cfg Config, gidIndex int, l LocalCM) (Outcome, error) {
	var out Outcome
	c := NewConn(&msgStream{ctx: ctx, ch: ch}, cfg.Client)
	var err error
	if out.PeerVersion, err = c.ExchangeVersion(); err != nil {
		return out, err
	}
	if out.PageSize, out.CacheLine, err = c.ExchangeSysData(cfg.PageSize, cfg.CacheLine); err != nil {
		return out, err
	}
	if out.MTU, err = c.ExchangeMTU(cfg.MTU); err != nil {
		return out, err
	}
	if out.Sizes, err = cfg.Test.Sizes(out.MTU); err != nil {
		return out, err
	}
	// One record each way, the client first (ctx_hand_shake). Records go
	// in the layout the peer last used (CMDestSize until it has spoken):
	// the server always hears the client first and answers in kind.
	layout := CMDestSize
	var in [CMDestSizeTail]byte
	handShake := func(my Dest, idx int) (Dest, error) {
		var mine [CMDestSizeTail]byte
		recv := func() (Dest, error) {
			n, err := ch.Recv(ctx, in[:])
			if err != nil {
				return Dest{}, fmt.Errorf("perftest: pingpong_dest exchange: %w", err)
			}
			d, _, err := ParseCMDest(in[:n])
			if err == nil {
				layout = n
			}
			return d, err
		}
		if !cfg.Client {
			d, err := recv()
			if err != nil {
				return d, err
			}
			return d, ch.Send(ctx, AppendCMDest(mine[:0], my, idx, layout))
		}
		if err := ch.Send(ctx, AppendCMDest(mine[:0], my, idx, layout)); err != nil {
			return Dest{}, fmt.Errorf("perftest: pingpong_dest exchange: %w", err)
		}
		return recv()
	}
	// perftest's create_rdma_cm_connection: a handshake with its still
	// zeroed record before and after the CM connects the test QPs.
	if _, err := handShake(Dest{}, 0); err != nil {
		return out, err
	}
	if err := l.ConnectQPs(out.Negotiated); err != nil {
		return out, err
	}
	if _, err := handShake(Dest{}, 0); err != nil {
		return out, err
	}
	mine, err := l.Dests(out.Negotiated)
	if err != nil {
		return out, err
	}
	if len(mine) == 0 || (cfg.Test.QPs > 0 && len(mine) != cfg.Test.QPs) {
		return out, fmt.Errorf("perftest: %d local QPs, want %d", len(mine), cfg.Test.QPs)
	}
	remote := make([]Dest, len(mine))
	keysSeen := false
	for _, st := range cfg.Test.Plan(cfg.Client, out.Sizes) {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		switch st.Kind {
		case StepKeys:
			for i := range mine {
				d, err := handShake(mine[i], gidIndex)
				if err != nil {
					return out, err
				}
				if keysSeen && d != remote[i] {
					return out, fmt.Errorf("perftest: peer's QP %d record changed between exchanges", i)
				}
				remote[i] = d
			}
			keysSeen = true
			out.Remote = remote
		case StepConnect:
			if err := l.Connect(remote); err != nil {
				return out, err
			}
		case StepBarrier, StepClose:
			// -R closes with the handshake alone: no "done" follows.
			if _, err := handShake(mine[0], gidIndex); err != nil {
				return out, err
			}
		case StepPostRecv:
			if err := l.PostReceives(st.Size); err != nil {
				return out, err
			}
		case StepRun:
			if out.Local, err = l.Run(st.Size); err != nil {
				return out, err
			}
		case StepReports:
			my := out.Local
			if !cfg.Client {
				my = BWReport{Size: out.Sizes[len(out.Sizes)-1]}
			}
			peer, err := c.ExchangeReports(my)
			if err != nil {
				return out, err
			}
			out.PeerReport = &peer
		}
	}
	return out, nil
}
