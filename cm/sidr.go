package cm

import (
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// SIDR (IBA 12.11) resolves a service ID to a UD QP and Q_Key: rdma_cm's
// UDP port space uses it where RC uses REQ/REP.

// SIDRParams describe an active SIDR request.
type SIDRParams struct {
	Peer, Local netip.Addr
	ServiceID   uint64
	// RDMACM prefixes PrivateData with an rdma_cm header (Local, Peer,
	// SrcPort), as rdma_cm's UDP port space does.
	RDMACM      bool
	SrcPort     uint16
	PrivateData []byte
}

// SIDRReplyParams answer an EventSIDRRequest.
type SIDRReplyParams struct {
	Status      SIDRStatus
	QPN         uint32
	QKey        uint32
	PrivateData []byte // at most SIDRREPPrivateSize
}

// ResolveService sends a SIDR_REQ; EventSIDRReply or EventSIDRTimeout
// follows.
func (m *Manager) ResolveService(now clock.Time, p *SIDRParams) (ConnID, error) {
	if !p.Peer.IsValid() {
		return 0, ErrBadParams
	}
	var req SIDRREQ
	if p.RDMACM {
		if len(p.PrivateData) > SIDRREQPrivateSize-CMAHeaderSize {
			return 0, ErrPrivateTooBig
		}
		h := CMAHeader{SrcPort: p.SrcPort, Src: p.Local, Dst: p.Peer}
		if err := EncodeCMAHeader(req.PrivateData[:], &h); err != nil {
			return 0, err
		}
		copy(req.PrivateData[CMAHeaderSize:], p.PrivateData)
	} else {
		if len(p.PrivateData) > SIDRREQPrivateSize {
			return 0, ErrPrivateTooBig
		}
		copy(req.PrivateData[:], p.PrivateData)
	}
	c := m.newConn(true, p.Peer.Unmap())
	c.serviceID = p.ServiceID
	c.state = StateSIDRREQSent
	req.RequestID = uint32(c.id)
	req.PKey = defaultPKey
	req.ServiceID = p.ServiceID
	mad := MAD(c.msg[:])
	mad.InitCM(AttrSIDRREQ, c.tid)
	req.Encode(mad.Data())
	c.peerTimeout = m.respTimeout(m.cfg.CMResponseTimeout)
	c.arm(now, c.peerTimeout, m.cfg.MaxCMRetries)
	m.send(c.peer, &c.msg)
	return c.id, nil
}

// SIDRReply answers an EventSIDRRequest. The answer is kept for a while to
// answer duplicates of the request.
func (m *Manager) SIDRReply(now clock.Time, id ConnID, p *SIDRReplyParams) error {
	c := m.conns[id]
	if c == nil {
		return ErrNoConn
	}
	if c.state != StateSIDRREQRcvd {
		return ErrBadState
	}
	if len(p.PrivateData) > SIDRREPPrivateSize {
		return ErrPrivateTooBig
	}
	rep := SIDRREP{RequestID: c.remoteID, Status: p.Status, ServiceID: c.serviceID}
	if p.Status == SIDRSuccess {
		rep.QPN, rep.QKey = p.QPN&0xFFFFFF, p.QKey
	}
	copy(rep.PrivateData[:], p.PrivateData)
	m.replySIDR(now, c, &rep)
	return nil
}

func (m *Manager) replySIDR(now clock.Time, c *conn, rep *SIDRREP) {
	mad := MAD(c.msg[:])
	mad.InitCM(AttrSIDRREP, c.tid)
	rep.Encode(mad.Data())
	c.state = StateSIDRREPSent
	// A SIDR_REQ names no retry count: hold the answer for as long as a
	// requester with our own timeout and retries would keep asking.
	c.deadline = now.Add(m.respTimeout(m.cfg.CMResponseTimeout) * time.Duration(int(m.cfg.MaxCMRetries)+1))
	m.send(c.peer, &c.msg)
}

func (m *Manager) handleSIDRREQ(now clock.Time, from netip.Addr, mad MAD) {
	var req SIDRREQ
	req.Decode(mad.Data())
	key := remoteKey{peer: from, id: req.RequestID}
	if c := m.remote[key]; c != nil {
		m.stats.Duplicates++
		if c.state == StateSIDRREPSent {
			m.send(c.peer, &c.msg)
		}
		return
	}
	opts, ok := m.listeners[req.ServiceID]
	c := m.newConn(false, from)
	c.state = StateSIDRREQRcvd
	c.serviceID = req.ServiceID
	c.tid = mad.TID()
	c.remoteID = req.RequestID
	m.index(c, key)
	if !ok {
		m.stats.NoListener++
		m.replySIDR(now, c, &SIDRREP{RequestID: req.RequestID, Status: SIDRUnsupported, ServiceID: req.ServiceID})
		return
	}
	c.deadline = now.Add(m.respTimeout(m.cfg.CMResponseTimeout))
	e := Event{Kind: EventSIDRRequest, ID: c.id, Peer: from, ServiceID: req.ServiceID, PKey: req.PKey}
	private := req.PrivateData[:]
	if opts.RDMACM {
		h, err := DecodeCMAHeader(private)
		if err != nil || (opts.Addr.IsValid() && h.Dst != opts.Addr.Unmap()) {
			m.replySIDR(now, c, &SIDRREP{RequestID: req.RequestID, Status: SIDRReject, ServiceID: req.ServiceID})
			return
		}
		e.CMA, e.HasCMA = h, true
		private = private[CMAHeaderSize:]
	}
	setPrivate(&e, private)
	m.event(&e)
}

func (m *Manager) handleSIDRREP(from netip.Addr, mad MAD) {
	var rep SIDRREP
	rep.Decode(mad.Data())
	c := m.conns[ConnID(rep.RequestID)]
	if c == nil || c.state != StateSIDRREQSent || c.peer != from {
		m.stats.Unmatched++
		return
	}
	e := Event{Kind: EventSIDRReply, ID: c.id, Peer: c.peer, ServiceID: c.serviceID,
		SIDRStatus: rep.Status, QKey: rep.QKey}
	e.QP.RemoteQPN = rep.QPN
	e.QP.Peer = c.peer
	setPrivate(&e, rep.PrivateData[:])
	m.event(&e)
	m.remove(c)
}
