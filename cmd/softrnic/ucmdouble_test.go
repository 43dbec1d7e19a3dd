package main

import (
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
)

// ucmDouble stands in for the daemons' UCM service (daemon/proto/ucm.go),
// which they do not serve yet, so that the C library's connection code
// runs end to end: a proxy in front of each real daemon forwards every
// other operation (the QPs, CQs and their traffic are the daemon's, over
// the veth) and answers the UCM operations from one in-memory CM shared by
// all proxies, which pairs a CONNECT with the LISTEN of the proxy whose
// daemon has the peer GID and moves the events between their channels as
// the daemons' CM will after the REQ/REP/RTU/REJ/DREQ/SIDR exchange.
type ucmDouble struct {
	mu   sync.Mutex
	next proto.Handle
	ids  map[proto.Handle]*ucmID
}

type ucmChannel struct {
	s   *ucmSession
	fd  int // the daemon's end
	seq uint32
}

type ucmID struct {
	s         *ucmSession
	h         proto.Handle
	ch        *ucmChannel
	space     uint16
	listening bool
	port      uint16
	addr      [16]byte // listener: bound GID, zero for any
	ipVersion uint8
	afOnly    bool
	passive   bool
	peer      *ucmID
	local     [16]byte
	remote    [16]byte
	localPort uint16
	peerPort  uint16
	req       proto.UCMConnectReq // active: what it asked for
	answered  bool                // a REP (CONNECT_RESPONSE) or REJ went
	connected bool
	closing   bool
}

type ucmSession struct {
	d        *ucmDouble
	info     proto.DeviceInfo
	channels map[proto.Handle]*ucmChannel
}

// ucmProxy listens at a socket of its own and serves each client with a
// connection to the real daemon at daemon.
type ucmProxy struct {
	d      *ucmDouble
	daemon string
	ln     *net.UnixListener
	wg     sync.WaitGroup
}

func newUCMDouble() *ucmDouble { return &ucmDouble{next: 1 << 24, ids: map[proto.Handle]*ucmID{}} }

func (d *ucmDouble) proxy(t *testing.T, daemon string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ucm.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	p := &ucmProxy{d: d, daemon: daemon, ln: ln}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return sock
}

func (p *ucmProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptUnix()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.session(c)
		}()
	}
}

func (p *ucmProxy) session(c *net.UnixConn) {
	cc := proto.NewConn(c)
	defer cc.Close()
	dc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: p.daemon, Net: "unixpacket"})
	if err != nil {
		return
	}
	dconn := proto.NewConn(dc)
	defer dconn.Close()
	s := &ucmSession{d: p.d, channels: map[proto.Handle]*ucmChannel{}}
	defer s.close()
	for {
		h, body, fds, err := cc.Recv()
		if err != nil {
			return
		}
		if h.Op >= proto.OpUCMCreateChannel && h.Op < proto.OpUCMEvent {
			proto.CloseFDs(fds)
			resp, out, err := s.handle(h.Op, body)
			if err != nil {
				var e unix.Errno
				if !errors.As(err, &e) {
					e = unix.EINVAL
				}
				err = cc.Send(proto.Header{Op: h.Op, Seq: h.Seq, Errno: uint32(e)}, []byte(err.Error()))
			} else {
				err = cc.Send(proto.Header{Op: h.Op, Seq: h.Seq}, resp, out...)
			}
			proto.CloseFDs(out)
			if err != nil {
				return // the client is gone: the session ends, as the daemon's
			}
			continue
		}
		err = dconn.Send(h, body, fds...)
		proto.CloseFDs(fds)
		if err != nil {
			return
		}
		rh, rbody, rfds, err := dconn.Recv()
		if err != nil {
			return
		}
		if h.Op == proto.OpOpen && rh.Errno == 0 {
			var info proto.DeviceInfo
			if proto.DecodeBody(rbody, &info) == nil {
				p.d.mu.Lock()
				s.info = info
				p.d.mu.Unlock()
			}
		}
		err = cc.Send(rh, rbody, rfds...)
		proto.CloseFDs(rfds)
		if err != nil {
			return
		}
	}
}

// close ends the session's IDs (their peers hear of it) and channels.
func (s *ucmSession) close() {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range d.ids {
		if id.s == s {
			d.destroyLocked(id)
		}
	}
	for _, ch := range s.channels {
		unix.Close(ch.fd)
	}
}

func (d *ucmDouble) newHandle() proto.Handle {
	d.next++
	return d.next
}

func (s *ucmSession) hasGID(g [16]byte) bool {
	for i := range min(int(s.info.NumGIDs), len(s.info.GIDs)) {
		if s.info.GIDs[i] == g {
			return true
		}
	}
	return false
}

// mtu is the session's port MTU as the IB enum.
func (s *ucmSession) mtu() uint8 {
	for e, b := uint8(5), uint32(4096); e > 1; e, b = e-1, b/2 {
		if s.info.ActiveMTU >= b {
			return e
		}
	}
	return 1
}

// send writes ev to id's channel; d.mu held.
func (d *ucmDouble) send(id *ucmID, ev proto.UCMEvent) {
	if id.ch == nil {
		return
	}
	id.ch.seq++
	msg, err := proto.Encode(make([]byte, proto.MaxMessage), proto.Header{Op: proto.OpUCMEvent, Version: proto.Version, Seq: id.ch.seq}, &ev)
	if err == nil {
		// A channel whose client has gone takes nothing: as the daemon's,
		// the event is dropped.
		_, _ = unix.Write(id.ch.fd, msg)
	}
}

// event is an event for id with the connection's addresses.
func event(id *ucmID, typ proto.UCMEventType, status int32) proto.UCMEvent {
	return proto.UCMEvent{Event: typ, Status: status, ID: id.h, Local: id.local, Peer: id.remote,
		LocalPort: id.localPort, PeerPort: id.peerPort, PKey: 0xffff}
}

// ackTimeout19 is the local ACK timeout a Linux CM derives from rxe's ACK
// delay (15) and the RoCE packet life time (18).
const ackTimeout19 = 19

func (s *ucmSession) handle(op proto.Op, body []byte) (any, []int, error) {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	lookup := func() (*ucmID, error) {
		var m proto.HandleMsg
		if err := proto.DecodeBody(body, &m); err != nil {
			return nil, err
		}
		id := d.ids[m.Handle]
		if id == nil || id.s != s {
			return nil, unix.ENOENT
		}
		return id, nil
	}
	switch op {
	case proto.OpUCMCreateChannel:
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		h := d.newHandle()
		s.channels[h] = &ucmChannel{s: s, fd: fds[0]}
		return &proto.HandleMsg{Handle: h}, []int{fds[1]}, nil
	case proto.OpUCMDestroyChannel:
		var m proto.HandleMsg
		if err := proto.DecodeBody(body, &m); err != nil {
			return nil, nil, err
		}
		ch := s.channels[m.Handle]
		if ch == nil {
			return nil, nil, unix.ENOENT
		}
		for _, id := range d.ids {
			if id.ch == ch {
				d.destroyLocked(id)
			}
		}
		delete(s.channels, m.Handle)
		unix.Close(ch.fd)
		return nil, nil, nil
	case proto.OpUCMListen:
		var req proto.UCMListenReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		ch := s.channels[req.Channel]
		if ch == nil {
			return nil, nil, unix.ENOENT
		}
		for _, o := range d.ids {
			if o.listening && o.s.info.NodeGUID == s.info.NodeGUID && o.space == req.Space && o.port == req.Port {
				return nil, nil, unix.EADDRINUSE
			}
		}
		id := &ucmID{s: s, h: d.newHandle(), ch: ch, space: req.Space, listening: true, port: req.Port, addr: req.Addr,
			ipVersion: req.IPVersion, afOnly: req.AFOnly != 0}
		d.ids[id.h] = id
		return &proto.HandleMsg{Handle: id.h}, nil, nil
	case proto.OpUCMConnect:
		var req proto.UCMConnectReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		ch := s.channels[req.Channel]
		if ch == nil || !s.hasGID(req.Local) {
			return nil, nil, unix.EINVAL
		}
		a := &ucmID{s: s, h: d.newHandle(), ch: ch, space: req.Space, local: req.Local, remote: req.Peer,
			localPort: req.SrcPort, peerPort: req.DstPort, req: req}
		d.ids[a.h] = a
		d.connectLocked(a)
		return &proto.HandleMsg{Handle: a.h}, nil, nil
	case proto.OpUCMAccept:
		var req proto.UCMAcceptReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		p := d.ids[req.ID]
		if p == nil || p.s != s || !p.passive || p.answered || p.peer == nil {
			return nil, nil, unix.EINVAL
		}
		p.answered = true
		a := p.peer
		if p.space == proto.PortSpaceUDP {
			ev := event(a, proto.UCMEventEstablished, 0)
			ev.QKey, ev.Param.QPN = req.QKey, req.Param.QPN
			ev.HopLimit = 64
			ev.Param.PrivateDataLen, ev.Param.PrivateData = req.Param.PrivateDataLen, req.Param.PrivateData
			d.send(a, ev)
			a.peer, p.peer = nil, nil
			return nil, nil, nil
		}
		// The REP: what the active side's QP needs, from its side.
		ev := event(a, proto.UCMEventConnectResponse, 0)
		ev.PathMTU = min(a.req.PathMTU, p.s.mtu())
		ev.ACKTimeout, ev.HopLimit = ackTimeout19, a.req.HopLimit
		ev.Param = req.Param
		ev.Param.ResponderResources = req.Param.InitiatorDepth
		ev.Param.InitiatorDepth = min(req.Param.ResponderResources, a.req.Param.InitiatorDepth)
		ev.Param.RetryCount = 0
		d.send(a, ev)
		return nil, nil, nil
	case proto.OpUCMReject:
		var req proto.UCMRejectReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		x := d.ids[req.ID]
		if x == nil || x.s != s || x.peer == nil || x.connected || (!x.passive && x.answered) {
			return nil, nil, unix.EINVAL
		}
		y := x.peer
		if x.space == proto.PortSpaceUDP {
			d.send(y, event(y, proto.UCMEventUnreachable, 2)) // SIDR status REJECT
		} else {
			ev := event(y, proto.UCMEventRejected, int32(req.Reason))
			ev.Param.PrivateDataLen = req.PrivateDataLen
			copy(ev.Param.PrivateData[:], req.PrivateData[:req.PrivateDataLen])
			d.send(y, ev)
		}
		x.answered = true
		x.peer, y.peer = nil, nil
		return nil, nil, nil
	case proto.OpUCMEstablish:
		a, err := lookup()
		if err != nil {
			return nil, nil, err
		}
		if a.passive || a.peer == nil || a.connected {
			return nil, nil, unix.EINVAL
		}
		a.connected, a.peer.connected = true, true
		d.send(a.peer, event(a.peer, proto.UCMEventEstablished, 0))
		return nil, nil, nil
	case proto.OpUCMNotify:
		p, err := lookup()
		if err != nil {
			return nil, nil, err
		}
		if p.passive && p.answered && !p.connected && p.peer != nil {
			p.connected, p.peer.connected = true, true
			d.send(p, event(p, proto.UCMEventEstablished, 0))
		}
		return nil, nil, nil
	case proto.OpUCMDisconnect:
		x, err := lookup()
		if err != nil {
			return nil, nil, err
		}
		d.disconnectLocked(x)
		return nil, nil, nil
	case proto.OpUCMMigrate:
		var req proto.UCMMigrateReq
		if err := proto.DecodeBody(body, &req); err != nil {
			return nil, nil, err
		}
		id, ch := d.ids[req.ID], s.channels[req.Channel]
		if id == nil || id.s != s || ch == nil {
			return nil, nil, unix.ENOENT
		}
		id.ch = ch
		return nil, nil, nil
	case proto.OpUCMDestroyID:
		id, err := lookup()
		if err != nil {
			return nil, nil, err
		}
		d.destroyLocked(id)
		return nil, nil, nil
	}
	return nil, nil, unix.EOPNOTSUPP
}

// connectLocked delivers a's REQ (or SIDR_REQ) to the listener of the
// daemon that has the peer GID, or refuses it as a CM would: REJ reason 8
// (invalid service ID), or SIDR status 1 (service not supported).
func (d *ucmDouble) connectLocked(a *ucmID) {
	peer := netip.AddrFrom16(a.remote)
	var l *ucmID
	for _, o := range d.ids {
		if !o.listening || o.space != a.space || o.port != a.peerPort || !o.s.hasGID(a.remote) {
			continue
		}
		if o.addr != [16]byte{} && o.addr != a.remote {
			continue
		}
		if peer.Is4In6() && o.ipVersion == 6 && o.afOnly || !peer.Is4In6() && o.ipVersion == 4 {
			continue
		}
		l = o
	}
	if l == nil {
		if a.space == proto.PortSpaceUDP {
			d.send(a, event(a, proto.UCMEventUnreachable, 1))
		} else {
			d.send(a, event(a, proto.UCMEventRejected, 8))
		}
		return
	}
	p := &ucmID{s: l.s, h: d.newHandle(), ch: l.ch, space: a.space, passive: true, peer: a,
		local: a.remote, remote: a.local, localPort: a.peerPort, peerPort: a.localPort}
	a.peer = p
	d.ids[p.h] = p
	ev := event(p, proto.UCMEventConnectRequest, 0)
	ev.Listener = l.h
	ev.PathMTU = min(a.req.PathMTU, l.s.mtu())
	ev.ACKTimeout, ev.HopLimit, ev.TrafficClass = ackTimeout19, a.req.HopLimit, a.req.TrafficClass
	ev.Param = a.req.Param
	ev.Param.ResponderResources = a.req.Param.InitiatorDepth
	ev.Param.InitiatorDepth = a.req.Param.ResponderResources
	d.send(p, ev)
}

// disconnectLocked: the DREQ reaches the peer (DISCONNECTED), its DREP
// reaches x (DISCONNECTED), and both leave time wait.
func (d *ucmDouble) disconnectLocked(x *ucmID) {
	y := x.peer
	if y == nil || x.closing {
		return
	}
	x.closing, y.closing = true, true
	for _, z := range []*ucmID{y, x} {
		d.send(z, event(z, proto.UCMEventDisconnected, 0))
	}
	for _, z := range []*ucmID{y, x} {
		d.send(z, event(z, proto.UCMEventTimewaitExit, 0))
		z.peer = nil
	}
}

// destroyLocked ends what id holds, as the daemon's DESTROY_ID: an
// established connection is disconnected, one being set up rejected.
func (d *ucmDouble) destroyLocked(id *ucmID) {
	if y := id.peer; y != nil {
		switch {
		case id.connected:
			d.disconnectLocked(id)
		case !y.answered || id.passive:
			d.send(y, event(y, proto.UCMEventRejected, 28))
			y.peer = nil
		}
	}
	delete(d.ids, id.h)
	id.peer = nil
}
