package runner

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// perftest -R -c UD: the control channel is the same RC connection as for
// RC tests, but each test QP is a UD QP found through SIDR in rdma_cm's UDP
// port space (same port number): the client's SIDR_REQ, the server's
// SIDR_REP naming its QP and RDMA_UDP_QKEY. Both sides' UD QPs carry that
// Q_Key (rdma_cm gives it to every RDMA_PS_UDP QP) and start at PSN 0.
// When the server must send too (latency tests, and bandwidth tests with
// -b), it cannot learn the client's QP from SIDR: the client sends one
// SEND with immediate data holding its QPN (and the QPN as 4 payload
// bytes, host order) to the server's QP right after the SIDR_REP, and the
// server makes its address handle from that receive (perftest's
// send_qp_num_for_ah / create_ah_from_wc_recv). Checked against a capture
// of two Debian perftest 4.5 hosts (ib_send_lat -R -c UD, rxe).

// udRemote is what the CM told us of the peer's UD QP.
type udRemote struct {
	qpn, qkey uint32
}

// udServerSends says whether the server side sends too, and so needs the
// client's QPN and address: the latency tests (perftest also for -b, which
// `softrnic perf` does not offer).
func (t *Test) udServerSends() bool {
	return t.p.Measure == perftest.Latency
}

// udRemoteQKey is the Q_Key our UD sends carry: perftest's DEF_QKEY over
// the TCP side channel, rdma_cm's RDMA_UDP_QKEY with -R.
func (t *Test) udRemoteQKey() uint32 {
	if t.p.RDMACM {
		return rdmacm.UDPQKey
	}
	return udQKey
}

// connectUD implements ConnectQPs for -c UD (see above).
func (c *cmLocal) connectUD(n perftest.Negotiated) error {
	t := c.Test
	if err := t.setupMR(n); err != nil {
		return err
	}
	for i := 0; i < t.p.QPs; i++ {
		q, sq, rq, err := t.newQP(i)
		if err != nil {
			return err
		}
		t.qps = append(t.qps, q) // close destroys its CQ even if the QP fails
		if q.qp, err = t.pd.CreateQP(t.qpAttr(ib.UD, q.cq, sq, rq)); err != nil {
			return err
		}
		t.qpns = append(t.qpns, q.qpn())
		if err := rdmacm.PrepareUD(q.qp); err != nil {
			return err
		}
		var r udRemote
		if t.client {
			r, err = c.udClient(q)
		} else {
			r, err = c.udServer(q)
		}
		if err != nil {
			return fmt.Errorf("perf: rdma_cm UD QP %d: %w", i, err)
		}
		c.ud = append(c.ud, r)
	}
	return nil
}

// udAH makes q's address handle to peer, with the UDP source port rxe
// would use for q.
func (t *Test) udAH(q *qp, peer ib.AddressVector) error {
	av := ib.AddressVector{DGID: ib.GIDFrom(peer.DGID.Addr()), SGIDIndex: uint8(t.gidIdx), TrafficClass: uint8(t.p.TClass), HopLimit: uint8(t.p.HopLimit),
		UDPSrcPort: rnic.UDSourcePort(q.qpn())}
	ah, err := t.pd.CreateAH(&av)
	if err != nil {
		return fmt.Errorf("address handle to %v: %w", peer.DGID.Addr(), err)
	}
	q.ah = ah
	return nil
}

// udClient resolves the server's UD QP (again while the server does not
// listen yet, as dial does for RC) and, when the server sends too, tells it
// our QPN.
func (c *cmLocal) udClient(q *qp) (udRemote, error) {
	t, s := c.Test, c.s
	var peer *rdmacm.UDPeer
	for i := 1; ; i++ {
		var err error
		peer, err = s.cm.ResolveUD(t.ctx, s.peer, s.port, nil)
		var se *rdmacm.SIDRError
		if err == nil {
			break
		}
		if !errors.As(err, &se) || se.Status != cm.SIDRUnsupported || i >= cmDataDialAttempts {
			return udRemote{}, err
		}
		select {
		case <-t.ctx.Done():
			return udRemote{}, t.ctx.Err()
		case <-time.After(cmDataDialDelay):
		}
	}
	if err := t.udAH(q, peer.AV); err != nil {
		return udRemote{}, err
	}
	r := udRemote{qpn: peer.QPN, qkey: peer.QKey}
	if !t.udServerSends() {
		return r, nil
	}
	// The QPN in the first 4 bytes of the QP's region (what perftest
	// copies into its buffer), and as the immediate; the region's pattern
	// (what --verify expects us to send) is put back afterwards.
	var saved [4]byte
	copy(saved[:], q.src)
	defer copy(q.src, saved[:])
	binary.NativeEndian.PutUint32(q.src[:4], q.qpn())
	if _, err := q.qp.PostSend([]verbs.SendWR{{ID: 0, Opcode: ib.SendWithImm, Flags: ib.Signaled, Imm: q.qpn(),
		SG: []ib.SGE{{Addr: q.va, Length: 4, LKey: t.mr.LKey()}}, AH: q.ah, RemoteQPN: r.qpn, RemoteQKey: r.qkey}}); err != nil {
		return r, err
	}
	wc, err := udWait(t.ctx, q.cq)
	if err != nil {
		return r, err
	}
	if wc.Status != ib.Success || wc.IsRecv {
		return r, fmt.Errorf("sending our QPN: %v", wc.Status)
	}
	return r, nil
}

// udServer answers the next SIDR request with q's QP and, when we send
// too, learns the client's QP from its first SEND: its receive must be in
// the device before the SIDR_REP goes, since the client sends as soon as
// it has the reply.
func (c *cmLocal) udServer(q *qp) (udRemote, error) {
	t, s := c.Test, c.s
	if s.udl == nil {
		return udRemote{}, errors.New("no UD listener")
	}
	req, err := s.udl.GetRequest(t.ctx)
	if err != nil {
		return udRemote{}, err
	}
	sends := t.udServerSends()
	// The QPN message lands (after its GRH slot) at the start of the
	// QP's region: its pattern is put back afterwards.
	var saved [grhLen + 4]byte
	copy(saved[:], q.src)
	defer copy(q.src, saved[:])
	if sends {
		if _, err := q.qp.PostRecv([]verbs.RecvWR{{ID: 0, SG: []ib.SGE{{Addr: q.va, Length: grhLen + 4, LKey: t.mr.LKey()}}}}); err != nil {
			return udRemote{}, err
		}
		if rs, ok := q.qp.(verbs.RecvSyncer); ok {
			if err := rs.SyncRecv(t.ctx); err != nil {
				return udRemote{}, err
			}
		}
	}
	if err := req.Accept(q.qp, nil); err != nil {
		return udRemote{}, err
	}
	if !sends {
		return udRemote{}, nil
	}
	wc, err := udWait(t.ctx, q.cq)
	if err != nil {
		return udRemote{}, err
	}
	if wc.Status != ib.Success || !wc.IsRecv || wc.Flags&ib.WCWithImm == 0 {
		return udRemote{}, fmt.Errorf("the client's QPN: completion %v opcode %v", wc.Status, wc.Opcode)
	}
	if err := t.udAH(q, ib.AddressVector{DGID: ib.GIDFrom(wc.SrcIP)}); err != nil {
		return udRemote{}, err
	}
	return udRemote{qpn: wc.Imm & bth.QPNMask, qkey: rdmacm.UDPQKey}, nil
}

// udWait waits (bounded) for the one completion of the connection step.
func udWait(ctx context.Context, cq verbs.CQ) (ib.WC, error) {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wc [1]ib.WC
	for cq.Poll(wc[:]) == 0 {
		if err := wctx.Err(); err != nil {
			return ib.WC{}, fmt.Errorf("waiting for a completion: %w", err)
		}
		if err := cq.Wait(10 * time.Millisecond); err != nil {
			return ib.WC{}, err
		}
	}
	return wc[0], nil
}
