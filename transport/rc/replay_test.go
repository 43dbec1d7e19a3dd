package rc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/ib"
)

// perftestKey is one 108-byte perftest key record,
// lid:out_reads:qpn:psn:rkey:vaddr:gid…:srqn:.
type perftestKey struct {
	outReads, qpn, psn, rkey uint32
	vaddr                    uint64
}

var keyRe = regexp.MustCompile(`^[0-9a-f]{4}:([0-9a-f]{4}):([0-9a-f]{6}):([0-9a-f]{6}):([0-9a-f]{8}):([0-9a-f]{16}):`)

// capture is a pcap's RoCE frames (transport packets) and the perftest key
// records of its TCP side channel.
type capture struct {
	frames []capFrame
	keys   []perftestKey
}

type capFrame struct {
	src string
	pkt []byte     // BTH through pad
	at  clock.Time // capture timestamp, from the first frame
}

func loadCapture(t *testing.T, name string) *capture {
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{}
	streams := map[string][]byte{}
	var t0 int64
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if t0 == 0 {
			t0 = ci.Timestamp.UnixNano()
		}
		var fr frame.Frame
		if frame.Parse(data, &fr) == nil {
			if !fr.VerifyICRC() {
				t.Fatalf("bad ICRC in %s", name)
			}
			p := fr.Packet()
			ipLen := 20
			if fr.IsIPv6() {
				ipLen = 40
			}
			c.frames = append(c.frames, capFrame{src: fr.Src().String(), pkt: append([]byte(nil), p[ipLen+8:len(p)-4]...), at: clock.Time(ci.Timestamp.UnixNano() - t0)})
			continue
		}
		pk := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		if tcp, ok := pk.Layer(layers.LayerTypeTCP).(*layers.TCP); ok && len(tcp.Payload) > 0 {
			k := strconv.Itoa(int(tcp.SrcPort))
			streams[k] = append(streams[k], tcp.Payload...)
		}
	}
	// The side channel is fixed-size records; the first key record of each
	// direction describes that side's QP.
	for _, s := range streams {
		for i := 0; i+108 <= len(s); i++ {
			m := keyRe.FindSubmatch(s[i:])
			if m == nil {
				continue
			}
			h := func(b []byte) uint64 { v, _ := strconv.ParseUint(string(b), 16, 64); return v }
			c.keys = append(c.keys, perftestKey{outReads: uint32(h(m[1])), qpn: uint32(h(m[2])), psn: uint32(h(m[3])), rkey: uint32(h(m[4])), vaddr: h(m[5])})
			break
		}
	}
	if len(c.keys) != 2 || len(c.frames) == 0 {
		t.Fatalf("%s: %d key records, %d RoCE frames", name, len(c.keys), len(c.frames))
	}
	return c
}

// sides returns the requester's and the responder's key records: the
// requester is the side whose PSN starts the first request; when both
// sides drew the same PSN (v6_write_bw_rc.pcap), the responder is the
// side whose rkey the requests carry.
func (c *capture) sides(t *testing.T) (req, resp perftestKey, reqSrc string) {
	first := bth.BTH(c.frames[0].pkt).PSN()
	reqSrc = c.frames[0].src
	var match []int
	for i, k := range c.keys {
		if bth.PSN(k.psn) == first {
			match = append(match, i)
		}
	}
	if len(match) == 1 {
		return c.keys[match[0]], c.keys[1-match[0]], reqSrc
	}
	for _, f := range c.frames {
		op := bth.BTH(f.pkt).Opcode()
		var rkey uint32
		switch {
		case f.src != reqSrc:
			continue
		case op.Offset(bth.ExtRETH) >= 0:
			rkey = bth.RETH(f.pkt[op.Offset(bth.ExtRETH):]).RKey()
		case op.Offset(bth.ExtAtomicETH) >= 0:
			rkey = bth.AtomicETH(f.pkt[op.Offset(bth.ExtAtomicETH):]).RKey()
		default:
			continue
		}
		for i, k := range c.keys {
			if k.rkey == rkey {
				return c.keys[1-i], k, reqSrc
			}
		}
	}
	t.Fatalf("cannot tell requester from responder (first PSN %d)", first)
	return
}

func describe(p []byte) string {
	h := bth.BTH(p)
	s := fmt.Sprintf("%v psn=%d", h.Opcode(), h.PSN())
	if o := h.Opcode().Offset(bth.ExtAETH); o >= 0 {
		a := bth.AETH(p[o:])
		s += fmt.Sprintf(" syn=%#x msn=%d", a.Syndrome(), a.MSN())
	}
	return s
}

// sameResponse compares what an rxe and our responder sent: opcode, PSN,
// AETH syndrome and MSN, payload and the atomic original value.
func sameResponse(ours, theirs []byte) bool {
	if len(ours) < bth.BTHLen || len(theirs) < bth.BTHLen {
		return false
	}
	a, b := bth.BTH(ours), bth.BTH(theirs)
	if a.Opcode() != b.Opcode() || a.PSN() != b.PSN() || a.DestQP() != b.DestQP() {
		return false
	}
	return bytes.Equal(ours[bth.BTHLen:], theirs[bth.BTHLen:])
}

// replayMemory is the responder's MR, rebuilt from what the capture shows
// of it: READ response payloads at their addresses.
func replayMemory(c *capture, reqSrc string, resp perftestKey, mtu int) (*testMem, *testMR) {
	size := 1 << 20
	mr := &testMR{va: resp.vaddr, buf: make([]byte, size), access: ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic, valid: true}
	// Map READ request PSNs to addresses, then place the responses.
	type rd struct {
		psn bth.PSN
		va  uint64
	}
	var reads []rd
	for _, f := range c.frames {
		h := bth.BTH(f.pkt)
		if f.src == reqSrc && h.Opcode() == bth.RCRDMAReadRequest {
			reads = append(reads, rd{h.PSN(), bth.RETH(f.pkt[bth.BTHLen:]).VA()})
		}
		if f.src != reqSrc && h.Opcode().IsReadResponse() {
			for _, r := range reads {
				if d := h.PSN().Diff(r.psn); d >= 0 && d < 1<<16 {
					off := r.va - resp.vaddr + uint64(d)*uint64(mtu)
					op := h.Opcode()
					hl := op.HeaderLen()
					copy(mr.buf[off:], f.pkt[hl:len(f.pkt)-h.PadCount()])
				}
			}
		}
	}
	return &testMem{mrs: map[uint32]*testMR{resp.rkey: mr}}, mr
}

// oracleRQ always has a receive posted, except when the capture shows that
// rxe answered this very request with an RNR NAK: the replay then sees the
// same receive availability as the captured responder did.
type oracleRQ struct {
	next func() []byte // rxe's next unmatched response
	psn  bth.PSN       // PSN of the request being processed
	buf  []byte
}

func (o *oracleRQ) Take(dst *ib.RecvWQE) bool {
	if n := o.next(); n != nil && bth.BTH(n).Opcode() == bth.RCAcknowledge &&
		bth.AETH(n[bth.BTHLen:]).Syndrome()&0xE0 == SynRNRNAK && bth.BTH(n).PSN() == o.psn {
		return false
	}
	dst.ID, dst.Err, dst.Length = 0, ib.Success, 1<<20
	if o.buf == nil {
		o.buf = make([]byte, 1<<20)
	}
	dst.SG = append(dst.SG[:0], ib.LocalSeg(o.buf))
	return true
}

// TestReplayResponder feeds each capture's requester packets to our
// responder, set up from the capture's perftest key records, and checks
// that it answers with exactly rxe's responses: opcodes, PSNs, AETH
// syndromes and MSNs, payloads.
func TestReplayResponder(t *testing.T) {
	for _, name := range []string{"write_bw_rc.pcap", "read_bw_rc.pcap", "send_bw_rc.pcap", "atomic_bw_rc.pcap", "rnr_nak.pcap",
		"v6_write_bw_rc.pcap", "v6_atomic_bw_rc.pcap", "mtu4096_write_bw_rc.pcap", "mtu4096_send_bw_rc.pcap"} {
		t.Run(name, func(t *testing.T) {
			c := loadCapture(t, name)
			req, resp, reqSrc := c.sides(t)
			mtu := 1024
			if bytes.Contains([]byte(name), []byte("mtu4096")) {
				mtu = 4096
			}
			mem, mr := replayMemory(c, reqSrc, resp, mtu)
			var theirs [][]byte
			for _, f := range c.frames {
				if f.src != reqSrc {
					theirs = append(theirs, f.pkt)
				}
			}
			// Atomic memory starts with the value rxe returned first.
			for _, p := range theirs {
				if bth.BTH(p).Opcode() == bth.RCAtomicAcknowledge {
					for _, f := range c.frames {
						if f.src == reqSrc && bth.BTH(f.pkt).PSN() == bth.BTH(p).PSN() {
							a := bth.AtomicETH(f.pkt[bth.BTHLen:])
							orig := bth.AtomicAckETH(p[bth.BTHLen+bth.AETHLen:]).Orig()
							le := mr.buf[a.VA()-mr.va:]
							if le64(le) == 0 {
								putLE64(le, orig)
							}
						}
					}
				}
			}
			k := 0
			rq := &oracleRQ{next: func() []byte {
				if k < len(theirs) {
					return theirs[k]
				}
				return nil
			}}
			cfg := Config{QPN: resp.qpn, DestQPN: req.qpn, MTU: mtu, RQPSN: bth.PSN(req.psn), SQPSN: bth.PSN(resp.psn),
				Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: int(max(resp.outReads, 1)),
				MaxDestRdAtomic: int(max(req.outReads, 1)), Access: ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic | ib.LocalWrite}
			q := New(resp.qpn, 128, 1, mem, rq)
			q.Receiver(cfg)
			buf := make([]byte, q.MaxPacket())
			requests := 0
			for _, f := range c.frames {
				if f.src != reqSrc {
					continue
				}
				requests++
				rq.psn = bth.BTH(f.pkt).PSN()
				q.Receive(0, f.pkt, nil)
				for {
					n := q.Build(0, buf)
					if n == 0 {
						break
					}
					if k >= len(theirs) {
						t.Fatalf("after request %d we sent %s, rxe sent nothing more", requests, describe(buf[:n]))
					}
					if !sameResponse(buf[:n], theirs[k]) {
						t.Fatalf("response %d: ours %s\n% x\nrxe  %s\n% x", k, describe(buf[:n]), buf[:min(n, 48)], describe(theirs[k]), theirs[k][:min(len(theirs[k]), 48)])
					}
					k++
				}
			}
			if k != len(theirs) {
				t.Fatalf("we sent %d responses, rxe %d (next rxe: %s)", k, len(theirs), describe(theirs[k]))
			}
			if q.Failed() {
				t.Fatal("QP failed")
			}
			t.Logf("%d requests, %d responses identical to rxe's", requests, k)
		})
	}
}

func putLE64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

// TestReplayRequester rebuilds each capture's work requests, lets our
// requester send them and checks every packet against rxe's requester
// (opcode, PSN, AckReq, headers, payload); rxe's responses from the capture
// are fed to our completer, and every work request must complete
// successfully with the data rxe's responder returned.
func TestReplayRequester(t *testing.T) {
	for _, name := range []string{"write_bw_rc.pcap", "read_bw_rc.pcap", "send_bw_rc.pcap", "atomic_bw_rc.pcap", "rnr_nak.pcap",
		"v6_write_bw_rc.pcap", "v6_atomic_bw_rc.pcap", "mtu4096_write_bw_rc.pcap", "mtu4096_send_bw_rc.pcap"} {
		t.Run(name, func(t *testing.T) {
			c := loadCapture(t, name)
			req, resp, reqSrc := c.sides(t)
			mtu := 1024
			if bytes.Contains([]byte(name), []byte("mtu4096")) {
				mtu = 4096
			}
			// Rebuild the work requests from the first transmission of
			// each message.
			type msg struct {
				w    ib.SendWQE
				data []byte
				psn  bth.PSN
			}
			var msgs []*msg
			var cur *msg
			seen := map[bth.PSN]bool{}
			for _, f := range c.frames {
				h := bth.BTH(f.pkt)
				op := h.Opcode()
				if f.src != reqSrc || seen[h.PSN()] {
					continue
				}
				seen[h.PSN()] = true
				pay := f.pkt[op.HeaderLen() : len(f.pkt)-h.PadCount()]
				if op.StartsMessage() {
					cur = &msg{w: ib.SendWQE{ID: uint64(len(msgs)), Flags: ib.Signaled}, psn: h.PSN()}
					msgs = append(msgs, cur)
					switch {
					case op.IsWrite():
						r := bth.RETH(f.pkt[bth.BTHLen:])
						cur.w.Opcode, cur.w.RemoteAddr, cur.w.RKey = ib.RDMAWrite, r.VA(), r.RKey()
					case op.IsSend():
						cur.w.Opcode = ib.Send
					case op.IsReadRequest():
						r := bth.RETH(f.pkt[bth.BTHLen:])
						cur.w.Opcode, cur.w.RemoteAddr, cur.w.RKey, cur.w.Length = ib.RDMARead, r.VA(), r.RKey(), r.DMALen()
						cur.data = make([]byte, r.DMALen())
					case op == bth.RCFetchAdd:
						a := bth.AtomicETH(f.pkt[bth.BTHLen:])
						cur.w.Opcode, cur.w.RemoteAddr, cur.w.RKey, cur.w.SwapAdd, cur.w.Length = ib.AtomicFetchAndAdd, a.VA(), a.RKey(), a.SwapAdd(), 8
						cur.data = make([]byte, 8)
					default:
						t.Fatalf("unexpected %v", op)
					}
				}
				if op.IsWrite() || op.IsSend() {
					cur.data = append(cur.data, pay...)
					cur.w.Length = uint32(len(cur.data))
				}
			}
			// rxe retransmits only on its local ACK timer and NAKs; the
			// capture's timing is rxe's, so our requester replays it in the
			// mode that has rxe's timing (adaptive retransmission probes
			// sooner by design; TestRequestsByteIdenticalWithoutAgreement
			// covers its bytes).
			cfg := Config{QPN: req.qpn, DestQPN: resp.qpn, MTU: mtu, SQPSN: bth.PSN(req.psn), RQPSN: bth.PSN(resp.psn),
				Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: int(max(req.outReads, 1)), MaxDestRdAtomic: 1,
				Recovery: ib.RecoveryTimeout}
			q := New(req.qpn, len(msgs)+1, 1, &testMem{}, &testRQ{})
			q.Receiver(cfg)
			q.Sender(cfg)
			for _, m := range msgs {
				m.w.SG = segs(m.data)
				if !q.Post(&m.w) {
					t.Fatal("SQ full")
				}
			}
			buf := make([]byte, q.MaxPacket())
			sent := 0
			// Time is the capture's: RNR waits (640 µs here) run out
			// before rxe, whose timers tick in jiffies, resends.
			for i, f := range c.frames {
				if f.src != reqSrc {
					q.Receive(f.at, f.pkt, nil)
					continue
				}
				q.Expire(f.at)
				n := q.Build(f.at, buf)
				if n == 0 {
					t.Fatalf("frame %d: rxe sent %s, our requester had nothing to send", i, describe(f.pkt))
				}
				if !bytes.Equal(buf[:n], f.pkt) {
					t.Fatalf("request %d: ours %s A=%v, rxe %s A=%v\n% x\n% x", sent, describe(buf[:n]), bth.BTH(buf).AckReq(),
						describe(f.pkt), bth.BTH(f.pkt).AckReq(), buf[:min(n, 60)], f.pkt[:min(len(f.pkt), 60)])
				}
				sent++
			}
			if n := q.Build(0, buf); n != 0 {
				t.Fatalf("we have more to send: %s", describe(buf[:n]))
			}
			wcs := q.TakeCompletions()
			if len(wcs) != len(msgs) {
				t.Fatalf("%d completions for %d work requests", len(wcs), len(msgs))
			}
			for i, w := range wcs {
				if w.Status != ib.Success || w.ID != uint64(i) {
					t.Fatalf("completion %d: %+v", i, w)
				}
			}
			// READ data and atomic results are what rxe's responder sent.
			respPay := map[bth.PSN][]byte{}
			for _, f := range c.frames {
				h := bth.BTH(f.pkt)
				if f.src == reqSrc || !(h.Opcode().IsReadResponse() || h.Opcode().IsAtomicAck()) {
					continue
				}
				if h.Opcode().IsReadResponse() {
					if _, dup := respPay[h.PSN()]; !dup {
						respPay[h.PSN()] = f.pkt[h.Opcode().HeaderLen() : len(f.pkt)-h.PadCount()]
					}
				}
				if h.Opcode().IsAtomicAck() {
					orig := bth.AtomicAckETH(f.pkt[bth.BTHLen+bth.AETHLen:]).Orig()
					found := false
					for _, m := range msgs {
						if m.w.Opcode == ib.AtomicFetchAndAdd && le64(m.data) == orig {
							found = true
						}
					}
					if !found {
						t.Fatalf("atomic result %d not delivered", orig)
					}
				}
			}
			for _, m := range msgs {
				if m.w.Opcode != ib.RDMARead {
					continue
				}
				var want []byte
				for i := uint32(0); i < pktsFor(m.w.Length, mtu); i++ {
					want = append(want, respPay[m.psn.Add(i)]...)
				}
				if !bytes.Equal(m.data, want) {
					t.Fatalf("READ %d data differs from rxe's responses", m.w.ID)
				}
			}
			if q.Failed() || (q.Retransmits != 0) != (name == "rnr_nak.pcap") {
				t.Fatalf("failed %v retransmits %d", q.Failed(), q.Retransmits)
			}
			t.Logf("%d work requests, %d packets identical to rxe's, all completed", len(msgs), sent)
		})
	}
}
