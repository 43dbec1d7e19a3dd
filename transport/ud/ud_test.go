package ud

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
)

type rq struct{ q []ib.RecvWQE }

func (r *rq) Take(dst *ib.RecvWQE) bool {
	if len(r.q) == 0 {
		return false
	}
	sg := append(dst.SG[:0], r.q[0].SG...)
	*dst = r.q[0]
	dst.SG = sg
	r.q = r.q[1:]
	return true
}

func newQP(qkey uint32, r *rq) *QP {
	q := New(0x20, 8, 2, r)
	q.Receiver(Config{QKey: qkey, MTU: 256})
	q.Sender(77)
	return q
}

func TestUDSendQKeyRule(t *testing.T) {
	q := newQP(0x11111111, &rq{})
	buf := make([]byte, q.MaxPacket())
	data := []byte("hello, datagram")
	ah := &ib.AH{}
	q.Post(&ib.SendWQE{ID: 1, Opcode: ib.SendWithImm, Flags: ib.Signaled, SG: segs(data[:5], data[5:]), Length: uint32(len(data)),
		Imm: 9, RemoteQPN: 0x33, RemoteQKey: 0x80000000, AH: ah})
	q.Post(&ib.SendWQE{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(data), Length: uint32(len(data)), RemoteQPN: 0x33, RemoteQKey: 0x1234, AH: ah})
	q.Post(&ib.SendWQE{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 257)), Length: 257, RemoteQPN: 0x33, AH: ah})
	q.Post(&ib.SendWQE{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(data), Length: uint32(len(data)), RemoteQPN: 0x33})
	n := q.Build(0, buf)
	h := bth.BTH(buf)
	d := bth.DETH(buf[bth.BTHLen:])
	if h.Opcode() != bth.UDSendOnlyImm || h.DestQP() != 0x33 || h.PSN() != 77 || d.QKey() != 0x11111111 || d.SrcQP() != 0x20 ||
		bth.ImmDt(buf[20:]).Imm() != 9 || !bytes.Equal(buf[24:24+len(data)], data) || n != 24+len(data)+h.PadCount() || h.PadCount() != 1 {
		t.Fatalf("% x", buf[:n])
	}
	n = q.Build(0, buf)
	if bth.DETH(buf[bth.BTHLen:]).QKey() != 0x1234 || bth.BTH(buf).PSN() != 78 || n == 0 {
		t.Fatal("explicit Q_Key")
	}
	for range 2 {
		if q.Build(0, buf) != 0 {
			t.Fatal("a datagram above the MTU was sent")
		}
	}
	q.Resume()
	if q.Build(0, buf) != 0 {
		t.Fatal("a datagram without an address handle was sent")
	}
	w := q.TakeCompletions()
	if len(w) != 4 || w[0].Status != ib.Success || w[2].Status != ib.LocLenErr || w[3].Status != ib.LocQPOpErr {
		t.Fatalf("%+v", w)
	}
}

func TestUDReceiveGRHAndChecks(t *testing.T) {
	buf := make([]byte, 100)
	r := &rq{q: []ib.RecvWQE{{ID: 5, SG: segs(buf[:30], buf[30:]), Length: 100}, {ID: 6, SG: segs(make([]byte, 41)), Length: 41}}}
	q := newQP(0x11111111, r)
	mk := func(qkey uint32, n int) []byte {
		p := make([]byte, bth.BTHLen+bth.DETHLen+n)
		bth.BTH(p).Encode(&bth.BTHFields{Opcode: bth.UDSendOnly, PKey: 0xFFFF, DestQP: 0x20, PSN: 1})
		bth.DETH(p[bth.BTHLen:]).Encode(qkey, 0x44)
		for i := 0; i < n; i++ {
			p[20+i] = byte(i + 1)
		}
		return p
	}
	var grh [transport.GRHLen]byte
	for i := range grh {
		grh[i] = 0xEE
	}
	src := netip.MustParseAddr("10.0.0.1")
	q.Receive(0, mk(0x22222222, 8), &transport.Meta{Src: src, GRH: &grh}) // wrong Q_Key: dropped, no receive used
	q.Receive(0, mk(0x11111111, 8), &transport.Meta{Src: src, GRH: &grh})
	q.Receive(0, mk(0x11111111, 8), &transport.Meta{Src: src, GRH: &grh}) // 40+8 > 41: LOC_LEN_ERR
	q.Receive(0, mk(0x11111111, 8), &transport.Meta{Src: src, GRH: &grh}) // no receive posted: dropped
	w := q.TakeCompletions()
	if q.RxBadQKey != 1 || q.RxNoRecv != 1 || len(w) != 2 {
		t.Fatalf("%+v %+v", q.Counters, w)
	}
	if w[0].ID != 5 || w[0].ByteLen != 48 || w[0].SrcQP != 0x44 || w[0].SrcIP != src || w[0].Flags&ib.WCGRH == 0 {
		t.Fatalf("%+v", w[0])
	}
	if !bytes.Equal(buf[:40], grh[:]) || !bytes.Equal(buf[40:48], []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("% x", buf[:48])
	}
	if w[1].Status != ib.LocLenErr {
		t.Fatalf("%+v", w[1])
	}
	// Hostile input never panics.
	for n := 0; n < 24; n++ {
		q.Receive(0, mk(0x11111111, 4)[:n], &transport.Meta{Src: src, GRH: &grh})
	}
}

// segs is a scatter/gather list over local buffers.
func segs(bufs ...[]byte) []ib.Seg {
	sg := make([]ib.Seg, len(bufs))
	for i, b := range bufs {
		sg[i] = ib.LocalSeg(b)
	}
	return sg
}

// Build writes the whole datagram BuildHeader describes into buf (headers,
// payload gathered from memory, pad) and returns its length, 0 for none.
func (q *QP) Build(now clock.Time, buf []byte) int {
	var p transport.Payload
	n := q.BuildHeader(now, buf, &p)
	if n == 0 {
		return 0
	}
	sg, off := p.Memory()
	m := ib.CopyIn(buf[n:n+p.Len()], sg, off)
	pad := -m & 3
	clear(buf[n+m : n+m+pad])
	return n + m + pad
}
