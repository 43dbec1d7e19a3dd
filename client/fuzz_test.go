package client

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
)

// FuzzControlMessages sends arbitrary bytes as control messages (after a
// valid OPEN, or without it) and checks that the daemon neither dies nor
// stops serving a well-behaved client.
func FuzzControlMessages(f *testing.F) {
	// Every input makes two connections; nobody waits for their ends. The
	// drain stops after the daemon (cleanups run last first).
	drained := make(chan struct{})
	f.Cleanup(func() { close(drained) })
	td := startDaemon(f, daemon.Options{})
	go func() {
		for {
			select {
			case <-td.gone:
			case <-drained:
				return
			}
		}
	}()
	seed := func(op proto.Op, body any) []byte {
		b, err := proto.Encode(nil, proto.Header{Op: op, Version: proto.Version, Seq: 1}, body)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(seed(proto.OpAllocPD, nil), true)
	f.Add(seed(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 16}), true)
	f.Add(seed(proto.OpCreateQP, &proto.CreateQPReq{PD: 1, SendCQ: 2, RecvCQ: 2, Type: ib.RC, Caps: ib.QPCaps{MaxSendWR: 4}}), true)
	f.Add(seed(proto.OpModifyQP, &proto.ModifyQPReq{QP: 3, Mask: ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort, Attr: ib.QPAttr{State: ib.Init, Port: 1}}), true)
	f.Add(seed(proto.OpDeallocPD, &proto.HandleMsg{Handle: 1}), false)
	f.Add(seed(proto.OpStatus, nil), true)
	f.Add(seed(proto.OpCreateAH, &proto.CreateAHReq{PD: 1, AV: ib.AddressVector{DGID: ib.GIDFrom(testlink.AddrA)}}), true)
	f.Add(seed(proto.OpAttachMem, nil), true) // without its two fds
	f.Add(seed(proto.OpRegMRAddr, &proto.RegMRAddrReq{PD: 1, Access: ib.LocalWrite, Space: 1, Addr: 0x1000, Length: 4096, IOVA: 0x1000}), true)
	f.Add(seed(proto.OpCreateSRQ, &proto.CreateSRQReq{PD: 1, MaxWR: 8, MaxSGE: 1}), true)
	f.Add(seed(proto.OpModifySRQ, &proto.ModifySRQReq{SRQ: 2, Mask: ib.SRQLimit, Attr: ib.SRQAttr{Limit: 4}}), true)
	f.Add(seed(proto.OpQuerySRQ, &proto.HandleMsg{Handle: 2}), true)
	f.Add(seed(proto.OpDestroySRQ, &proto.HandleMsg{Handle: 2}), true)
	f.Add(seed(proto.OpCreateQP, &proto.CreateQPReq{PD: 1, SendCQ: 2, RecvCQ: 2, Type: ib.UD, Caps: ib.QPCaps{MaxSendWR: 4}, SRQ: 3}), true)
	f.Add(seed(proto.OpAsyncEvents, nil), true)
	f.Add(seed(proto.OpQueryDevice, nil), true)
	f.Fuzz(func(t *testing.T, in []byte, open bool) {
		msg := append([]byte(nil), in...) // the input itself must stay as it is
		uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: td.path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		if err := uc.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, proto.MaxMessage+1)
		if open {
			b, _ := proto.Encode(nil, proto.Header{Op: proto.OpOpen, Version: proto.Version, Seq: 1}, &proto.OpenReq{Version: proto.Version})
			if _, err := uc.Write(b); err != nil {
				t.Fatal(err)
			}
			// the doorbell fd is closed with the connection
			if _, err := uc.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
		// Let the fuzzer build a few objects first when it reuses the seeds:
		// the same message three times, with the sequence number bumped.
		for i := 0; i < 3 && len(msg) > 0; i++ {
			if len(msg) >= 8 {
				binary.LittleEndian.PutUint32(msg[4:], uint32(i+2))
			}
			if _, err := uc.Write(msg); err != nil {
				break
			}
			if _, err := uc.Read(buf); err != nil {
				break // the daemon may drop a connection that sends garbage
			}
		}
		// The daemon still serves a well-behaved client.
		c, err := Dial(td.path)
		if err != nil {
			t.Fatalf("daemon stopped answering: %v", err)
		}
		defer c.Close()
		if _, err := c.AllocPD(); err != nil {
			t.Fatalf("daemon stopped serving: %v", err)
		}
	})
}
