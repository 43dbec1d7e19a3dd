package cm

import (
	"bytes"
	"net/netip"
	"testing"
	"time"
)

// reencode decodes the CM message of m into its struct and encodes it into a
// fresh MAD with the decoded header: the result must equal m byte for byte.
func reencode(t *testing.T, m MAD) MAD {
	t.Helper()
	out := make(MAD, MADSize)
	h := m.Header()
	out.SetHeader(&h)
	d, o := m.Data(), out.Data()
	switch m.AttrID() {
	case AttrREQ:
		var r REQ
		r.Decode(d)
		r.Encode(o)
	case AttrREP:
		var r REP
		r.Decode(d)
		r.Encode(o)
	case AttrRTU:
		var r RTU
		r.Decode(d)
		r.Encode(o)
	case AttrREJ:
		var r REJ
		r.Decode(d)
		r.Encode(o)
	case AttrMRA:
		var r MRA
		r.Decode(d)
		r.Encode(o)
	case AttrDREQ:
		var r DREQ
		r.Decode(d)
		r.Encode(o)
	case AttrDREP:
		var r DREP
		r.Decode(d)
		r.Encode(o)
	case AttrSIDRREQ:
		var r SIDRREQ
		r.Decode(d)
		r.Encode(o)
	case AttrSIDRREP:
		var r SIDRREP
		r.Decode(d)
		r.Encode(o)
	default:
		t.Fatalf("unexpected attribute %v", m.AttrID())
	}
	return out
}

// captureExpect is what a capture's CM exchange must decode to; the values
// were read off the capture with Wireshark's CM dissector.
type captureExpect struct {
	file                 string
	src, dst             netip.Addr // active (client) and passive (server)
	attrs                []AttrID
	serviceID            uint64
	reqQPN, repQPN       uint32
	reqPSN, repPSN       uint32
	reqCommID, repCommID uint32
	respRes              uint8
	cmaSrcPort           uint16
}

var captures = []captureExpect{
	{
		file: "rping.pcap", src: netip.MustParseAddr("10.77.0.10"), dst: netip.MustParseAddr("10.77.0.11"),
		attrs:     []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP},
		serviceID: 0x0000000001061c06, reqQPN: 0x1e, repQPN: 0x1e, reqPSN: 0xd7d339, repPSN: 0x73ee52,
		reqCommID: 0xb3c9e2c5, repCommID: 0xf976c67c, respRes: 1, cmaSrcPort: 0xc6d4,
	},
	{
		file: "v6_rping.pcap", src: netip.MustParseAddr("fd77::10"), dst: netip.MustParseAddr("fd77::11"),
		attrs:     []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP},
		serviceID: 0x0000000001061c06, reqQPN: 0x18, repQPN: 0x18, reqPSN: 0x71d5c0, repPSN: 0x150fc3,
		reqCommID: 0x1502e32d, repCommID: 0xbc965dcd, respRes: 1, cmaSrcPort: 0xc545,
	},
	{
		// perftest -R: first connection is the control QP, the second the
		// test QP; the server tears the control one down last.
		file: "write_bw_rdmacm.pcap", src: netip.MustParseAddr("10.77.0.10"), dst: netip.MustParseAddr("10.77.0.11"),
		attrs:     []AttrID{AttrREQ, AttrREP, AttrRTU, AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrDREQ, AttrDREP},
		serviceID: 0x000000000106485b, reqQPN: 0x1a, repQPN: 0x1a, reqPSN: 0x36686b, repPSN: 0x7d9ee7,
		reqCommID: 0xb1c9e2c5, repCommID: 0xfd76c67c, respRes: 0, cmaSrcPort: 0xce49,
	},
}

func TestCaptureMADsDecodeAndReencode(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			mads := readCMMADs(t, c.file)
			if len(mads) != len(c.attrs) {
				t.Fatalf("%d CM MADs, want %d", len(mads), len(c.attrs))
			}
			for i, cm := range mads {
				m := cm.MAD
				if m.AttrID() != c.attrs[i] {
					t.Fatalf("MAD %d is %v, want %v", i, m.AttrID(), c.attrs[i])
				}
				if cm.QKey != GSIQKey || cm.SrcQP != GSIQPN {
					t.Errorf("frame %d: Q_Key %#x src QP %d", cm.Frame, cm.QKey, cm.SrcQP)
				}
				if m.Status() != 0 || m.AttrMod() != 0 {
					t.Errorf("frame %d: status %#x attrmod %#x", cm.Frame, m.Status(), m.AttrMod())
				}
				if out := reencode(t, m); !bytes.Equal(out, m) {
					t.Fatalf("frame %d (%v): re-encoding differs:\n got %x\nwant %x", cm.Frame, m.AttrID(), out, m)
				}
			}
			// The first REQ/REP/RTU triple: one TID, matching comm IDs.
			req, rep, rtu := mads[0].MAD, mads[1].MAD, mads[2].MAD
			if req.TID() != rep.TID() || rep.TID() != rtu.TID() {
				t.Errorf("TIDs differ: %x %x %x", req.TID(), rep.TID(), rtu.TID())
			}
			if mads[0].Src != c.src || mads[0].Dst != c.dst || mads[1].Src != c.dst {
				t.Errorf("addresses %v→%v, %v→%v", mads[0].Src, mads[0].Dst, mads[1].Src, mads[1].Dst)
			}
			var q REQ
			q.Decode(req.Data())
			var p REP
			p.Decode(rep.Data())
			var u RTU
			u.Decode(rtu.Data())
			if q.ServiceID != c.serviceID || q.LocalQPN != c.reqQPN || q.StartingPSN != c.reqPSN || q.LocalCommID != c.reqCommID {
				t.Errorf("REQ service %#x QPN %#x PSN %#x comm %#x", q.ServiceID, q.LocalQPN, q.StartingPSN, q.LocalCommID)
			}
			if ps, port, ok := ServicePort(q.ServiceID); !ok || ps != PortSpaceTCP || ServiceIDTCP(port) != c.serviceID {
				t.Errorf("service ID %#x: ps %#x port %d ok %v", q.ServiceID, ps, port, ok)
			}
			// The kernel CM's REQ on RoCE, as seen from rxe.
			if q.TransportServiceType != TransportRC || q.PathMTU != 3 || q.PKey != 0xFFFF ||
				q.RemoteCMResponseTimeout != 20 || q.LocalCMResponseTimeout != 20 || q.RetryCount != 7 ||
				q.RNRRetryCount != 7 || q.MaxCMRetries != 15 || q.Primary.LocalLID != 0xFFFF ||
				q.Primary.RemoteLID != 0xFFFF || q.Primary.HopLimit != 64 || q.Primary.LocalACKTimeout != 19 ||
				q.ResponderResources != c.respRes || q.InitiatorDepth != c.respRes {
				t.Errorf("REQ fields: %+v", q)
			}
			if q.Primary.LocalGID.Addr() != c.src || q.Primary.RemoteGID.Addr() != c.dst {
				t.Errorf("REQ GIDs %v %v", q.Primary.LocalGID.Addr(), q.Primary.RemoteGID.Addr())
			}
			h, err := DecodeCMAHeader(q.PrivateData[:])
			if err != nil || h.Src != c.src || h.Dst != c.dst || h.SrcPort != c.cmaSrcPort {
				t.Errorf("cma_hdr %+v, %v", h, err)
			}
			var enc [CMAHeaderSize]byte
			if err := EncodeCMAHeader(enc[:], &h); err != nil || !bytes.Equal(enc[:], q.PrivateData[:CMAHeaderSize]) {
				t.Errorf("cma_hdr re-encoding %x, %v", enc, err)
			}
			if p.RemoteCommID != q.LocalCommID || p.LocalCommID != c.repCommID || p.LocalQPN != c.repQPN ||
				p.StartingPSN != c.repPSN || p.TargetACKDelay != 15 || p.RNRRetryCount != 7 ||
				p.ResponderResources != c.respRes || p.InitiatorDepth != c.respRes {
				t.Errorf("REP fields: %+v", p)
			}
			if p.LocalCAGUID == q.LocalCAGUID {
				t.Error("both sides have the same CA GUID")
			}
			if u.LocalCommID != q.LocalCommID || u.RemoteCommID != p.LocalCommID {
				t.Errorf("RTU comm IDs %#x %#x", u.LocalCommID, u.RemoteCommID)
			}
		})
	}
}

func TestDisconnectsInCaptures(t *testing.T) {
	for _, c := range captures {
		mads := readCMMADs(t, c.file)
		// Index comm IDs → QPN from the REQ/REP pairs.
		qpnOf := map[uint32]uint32{}
		for _, cm := range mads {
			switch cm.MAD.AttrID() {
			case AttrREQ:
				var q REQ
				q.Decode(cm.MAD.Data())
				qpnOf[q.LocalCommID] = q.LocalQPN
			case AttrREP:
				var p REP
				p.Decode(cm.MAD.Data())
				qpnOf[p.LocalCommID] = p.LocalQPN
			}
		}
		for i, cm := range mads {
			if cm.MAD.AttrID() != AttrDREQ {
				continue
			}
			var dq DREQ
			dq.Decode(cm.MAD.Data())
			var dp DREP
			next := mads[i+1]
			if next.MAD.AttrID() != AttrDREP {
				t.Fatalf("%s: DREQ not followed by DREP", c.file)
			}
			dp.Decode(next.MAD.Data())
			if next.MAD.TID() != cm.MAD.TID() || dp.LocalCommID != dq.RemoteCommID || dp.RemoteCommID != dq.LocalCommID {
				t.Errorf("%s: DREQ %+v / DREP %+v", c.file, dq, dp)
			}
			if want, ok := qpnOf[dq.RemoteCommID]; !ok || dq.RemoteQPN != want {
				t.Errorf("%s: DREQ names QPN %#x, the receiver's QP is %#x", c.file, dq.RemoteQPN, want)
			}
			if next.Src != cm.Dst {
				t.Errorf("%s: DREP from %v, DREQ went to %v", c.file, next.Src, cm.Dst)
			}
		}
	}
}

func TestEveryMessageRoundTrips(t *testing.T) {
	// Fill every byte that carries a field; reserved bits stay zero. A
	// struct round trip through Encode/Decode must be the identity.
	req := REQ{LocalCommID: 0x01020304, VendorID: 0xABCDEF, ServiceID: ServiceIDTCP(7174), LocalCAGUID: 0x1122334455667788,
		LocalQKey: 0x99, LocalQPN: 0xFFFFFF, ResponderResources: 16, LocalEECN: 0x123456, InitiatorDepth: 8,
		RemoteEECN: 0x654321, RemoteCMResponseTimeout: 31, TransportServiceType: 3, EndToEndFlowControl: true,
		StartingPSN: 0xFEDCBA, LocalCMResponseTimeout: 17, RetryCount: 7, PKey: 0x8001, PathMTU: 5, RDCExists: true,
		RNRRetryCount: 6, MaxCMRetries: 15, SRQ: true, ExtendedTransportType: 5,
		Primary:      Path{LocalLID: 1, RemoteLID: 2, FlowLabel: 0xFFFFF, PacketRate: 63, TrafficClass: 0xE0, HopLimit: 255, SL: 15, SubnetLocal: true, LocalACKTimeout: 31},
		Alternate:    Path{LocalLID: 3, RemoteLID: 4, FlowLabel: 0x12345, PacketRate: 1, TrafficClass: 1, HopLimit: 2, SL: 3, LocalACKTimeout: 4},
		SAPSupported: true}
	req.Primary.LocalGID[0], req.Alternate.RemoteGID[15], req.PrivateData[91] = 0xFE, 0x01, 0x5A
	var d [DataSize]byte
	var got REQ
	req.Encode(d[:])
	got.Decode(d[:])
	if got != req {
		t.Fatalf("REQ round trip:\n got %+v\nwant %+v", got, req)
	}
	rep := REP{LocalCommID: 1, RemoteCommID: 2, LocalQKey: 3, LocalQPN: 0xABCDEF, LocalEECN: 0x111111, StartingPSN: 0xFFFFFF,
		VendorID: 0x123456, ResponderResources: 4, InitiatorDepth: 5, TargetACKDelay: 31, FailoverAccepted: 3,
		EndToEndFlowControl: true, RNRRetryCount: 7, SRQ: true, LocalCAGUID: 9}
	rep.PrivateData[195] = 1
	var gotRep REP
	rep.Encode(d[:])
	gotRep.Decode(d[:])
	if gotRep != rep {
		t.Fatalf("REP round trip:\n got %+v\nwant %+v", gotRep, rep)
	}
	rej := REJ{LocalCommID: 1, RemoteCommID: 2, MessageRejected: MsgREP, RejectedInfoLength: 127, Reason: RejInvalidServiceID}
	rej.ARI[71], rej.PrivateData[147] = 7, 8
	var gotRej REJ
	rej.Encode(d[:])
	gotRej.Decode(d[:])
	if gotRej != rej {
		t.Fatalf("REJ round trip")
	}
	mra := MRA{LocalCommID: 1, RemoteCommID: 2, MessageMRAed: MsgOther, ServiceTimeout: 31}
	mra.PrivateData[221] = 3
	var gotMRA MRA
	mra.Encode(d[:])
	gotMRA.Decode(d[:])
	if gotMRA != mra {
		t.Fatalf("MRA round trip")
	}
	sq := SIDRREQ{RequestID: 5, PKey: 0xFFFF, ServiceID: ServiceIDUDP(4791)}
	sq.PrivateData[215] = 1
	var gotSQ SIDRREQ
	sq.Encode(d[:])
	gotSQ.Decode(d[:])
	if gotSQ != sq {
		t.Fatalf("SIDR_REQ round trip")
	}
	sp := SIDRREP{RequestID: 5, Status: SIDRRedirect, AdditionalInfoLength: 72, VendorID: 0xABCDEF, QPN: 0x123456,
		ServiceID: ServiceIDUDP(1), QKey: RDMAUDPQKey}
	sp.AdditionalInformation[71], sp.PrivateData[135] = 1, 2
	var gotSP SIDRREP
	sp.Encode(d[:])
	gotSP.Decode(d[:])
	if gotSP != sp {
		t.Fatalf("SIDR_REP round trip:\n got %+v\nwant %+v", gotSP, sp)
	}
	dq := DREQ{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0xFFFFFF}
	dq.PrivateData[219] = 9
	var gotDQ DREQ
	dq.Encode(d[:])
	gotDQ.Decode(d[:])
	if gotDQ != dq {
		t.Fatalf("DREQ round trip")
	}
}

func TestFieldOffsets(t *testing.T) {
	// Spot checks against IBA table 106/110: a field set alone lands at its
	// documented byte and bits.
	var d [DataSize]byte
	(&REQ{PathMTU: 5}).Encode(d[:])
	if d[50] != 0x50 {
		t.Errorf("REQ PathMTU byte %#x", d[50])
	}
	(&REQ{MaxCMRetries: 15}).Encode(d[:])
	if d[51] != 0xF0 {
		t.Errorf("REQ MaxCMRetries byte %#x", d[51])
	}
	(&REQ{Primary: Path{LocalACKTimeout: 19}}).Encode(d[:])
	if d[95] != 19<<3 {
		t.Errorf("REQ LocalACKTimeout byte %#x", d[95])
	}
	(&REP{RNRRetryCount: 7}).Encode(d[:])
	if d[27] != 0xE0 {
		t.Errorf("REP RNR retry byte %#x", d[27])
	}
	(&REJ{Reason: RejInvalidServiceID, MessageRejected: MsgREQ}).Encode(d[:])
	if d[10] != 0 || d[11] != 8 || d[8] != 0 {
		t.Errorf("REJ reason bytes %x", d[8:12])
	}
	if Timeout(20) != 4294967296*time.Nanosecond || Timeout(0) != 4096*time.Nanosecond || Timeout(40) != Timeout(31) {
		t.Errorf("Timeout(20) = %v", Timeout(20))
	}
}

func TestCMAHeaderErrors(t *testing.T) {
	var p [CMAHeaderSize]byte
	if _, err := DecodeCMAHeader(p[:10]); err == nil {
		t.Error("short header accepted")
	}
	if _, err := DecodeCMAHeader(p[:]); err == nil {
		t.Error("IP version 0 accepted")
	}
	p[0], p[1] = 1, 0x40
	if _, err := DecodeCMAHeader(p[:]); err == nil {
		t.Error("cma version 1 accepted")
	}
	h := CMAHeader{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("fd00::1")}
	if err := EncodeCMAHeader(p[:], &h); err == nil {
		t.Error("mixed families accepted")
	}
	h = CMAHeader{SrcPort: 5, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2")}
	if err := EncodeCMAHeader(p[:], &h); err != nil {
		t.Fatal(err)
	}
	if g, err := DecodeCMAHeader(p[:]); err != nil || g != h {
		t.Errorf("IPv6 round trip %+v %v", g, err)
	}
}

func TestParseMADRejects(t *testing.T) {
	good := make([]byte, MADSize)
	MAD(good).InitCM(AttrREQ, 1)
	if _, err := ParseMAD(good); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off int
		v   byte
	}{{0, 2}, {1, 0x81}, {2, 1}, {3, 0x83}} {
		b := append([]byte(nil), good...)
		b[c.off] = c.v
		if _, err := ParseMAD(b); err == nil {
			t.Errorf("byte %d = %#x accepted", c.off, c.v)
		}
	}
	if _, err := ParseMAD(good[:255]); err == nil {
		t.Error("255-byte MAD accepted")
	}
}

func TestMTUConversions(t *testing.T) {
	for e, b := range map[uint8]int{1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096, 0: 0, 6: 0} {
		if MTUBytes(e) != b {
			t.Errorf("MTUBytes(%d) = %d, want %d", e, MTUBytes(e), b)
		}
	}
	for b, e := range map[int]uint8{4096: 5, 4200: 5, 1500: 3, 1024: 3, 255: 0, 256: 1} {
		if MTUEnum(b) != e {
			t.Errorf("MTUEnum(%d) = %d, want %d", b, MTUEnum(b), e)
		}
	}
}
