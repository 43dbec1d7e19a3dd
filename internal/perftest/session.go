package perftest

import (
	"context"
	"fmt"
	"io"
)

// Negotiated is what the two ends agreed before any QP exists.
type Negotiated struct {
	PeerVersion string
	PageSize    int // max of both: the cycle buffer remote addresses wrap in
	CacheLine   int // max of both: remote addresses advance by size rounded up to it
	MTU         MTU // min of both
	Sizes       []uint64
}

// Local is the device side of a test, called back by Run at each phase.
type Local interface {
	// Dests creates the QPs and buffers for the agreed parameters and
	// returns one key record per QP, in QP order.
	Dests(n Negotiated) ([]Dest, error)
	// Connect moves the QPs to RTR (and RTS where the test sends) toward
	// the peer's records, one per QP in the same order.
	Connect(remote []Dest) error
	// PostReceives posts the receive buffers for messages of size bytes.
	PostReceives(size uint64) error
	// Run runs the measurement at size bytes. Bandwidth tests return what
	// they measured (it is sent to the peer); latency tests return a zero
	// BWReport and report on their own.
	Run(size uint64) (BWReport, error)
}

// Config is this end's side of the preamble.
type Config struct {
	Test      Test
	Client    bool
	MTU       MTU // our port's active MTU (or -m)
	PageSize  int
	CacheLine int
}

// Outcome is what a finished session learnt.
type Outcome struct {
	Negotiated
	Remote []Dest
	// PeerReport is the peer's bandwidth report where the test exchanges
	// reports (non-send bandwidth tests). A passive server prints it as the
	// test's result, as perftest does.
	PeerReport *BWReport
	// Local is the last report our Run returned.
	Local BWReport
}

// Run drives one test over the side channel: version, page and cache-line
// size, MTU, then the test's phases (Test.Plan), calling l for everything
// that touches the device. Cancelling ctx closes rw if it is an io.Closer,
// which unblocks a peer that stopped answering.
func Run(ctx context.Context, rw io.ReadWriter, cfg Config, l Local) (Outcome, error) {
	var out Outcome
	if cl, ok := rw.(io.Closer); ok {
		// The run then fails with ctx's error; the close's is no news.
		stop := context.AfterFunc(ctx, func() { _ = cl.Close() })
		defer stop()
	}
	c := NewConn(rw, cfg.Client)
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
				d, err := c.HandShake(mine[i])
				if err != nil {
					return out, err
				}
				if keysSeen && d != remote[i] {
					return out, fmt.Errorf("perftest: peer's QP %d record changed between exchanges", i)
				}
				remote[i] = d
			}
			if !keysSeen {
				keysSeen = true
				if IsV4Mapped(remote[0].GID) != IsV4Mapped(mine[0].GID) {
					return out, fmt.Errorf("perftest: GID types differ (local %v, peer %v): use the same IP version on both ends",
						mine[0].Addr(), remote[0].Addr())
				}
			}
			out.Remote = remote
		case StepConnect:
			if err := l.Connect(remote); err != nil {
				return out, err
			}
		case StepBarrier:
			if _, err := c.HandShake(mine[0]); err != nil {
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
				// perftest's passive server sends an uninitialised report;
				// ours says honestly what it knows and measured nothing.
				my = BWReport{Size: out.Sizes[len(out.Sizes)-1]}
			}
			peer, err := c.ExchangeReports(my)
			if err != nil {
				return out, err
			}
			out.PeerReport = &peer
		case StepClose:
			if _, err := c.HandShake(mine[0]); err != nil {
				return out, err
			}
			if err := c.Finish(); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}
