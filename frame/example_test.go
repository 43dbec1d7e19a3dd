package frame_test

import (
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
)

// The engine's way of sending: headers first, payload gathered straight
// from memory regions, then Finish for pad, lengths, checksum and ICRC.
func ExampleBuilder() {
	spec := frame.Spec{
		Src: netip.MustParseAddr("10.77.0.10"), Dst: netip.MustParseAddr("10.77.0.11"),
		SrcPort: 0xC123,
		BTH:     bth.BTHFields{Opcode: bth.RCRDMAWriteOnly, PKey: bth.DefaultPKey, DestQP: 0x11, AckReq: true, PSN: 42},
		RETH:    frame.RETHFields{VA: 0x7f0000001000, RKey: 0x1234, DMALen: 10},
	}
	mr1, mr2 := []byte("hello "), []byte("rdma") // two scatter/gather pieces
	buf := make([]byte, 2048)

	var b frame.Builder
	off, err := b.Headers(buf, &spec)
	if err != nil {
		panic(err)
	}
	n := copy(buf[off:], mr1)
	n += copy(buf[off+n:], mr2)
	size, err := b.Finish(buf, n)
	if err != nil {
		panic(err)
	}

	var f frame.Frame
	if err := frame.Parse(buf[:size], &f); err != nil {
		panic(err)
	}
	fmt.Println(size, f.Opcode(), f.Src(), "->", f.Dst(), "psn", f.BTH().PSN(), "pad", len(f.Pad()))
	fmt.Printf("%q icrc ok: %v\n", f.Payload(), f.VerifyICRC())
	// Output:
	// 86 RC_RDMA_WRITE_ONLY 10.77.0.10 -> 10.77.0.11 psn 42 pad 2
	// "hello rdma" icrc ok: true
}

// Parse tells frames that are not RoCEv2 from malformed RoCEv2.
func ExampleParse() {
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	var f frame.Frame
	err := frame.Parse(arp, &f)
	fmt.Println(err, frame.IsNotRoCE(err))
	// Output:
	// frame: not IPv4 or IPv6 true
}
