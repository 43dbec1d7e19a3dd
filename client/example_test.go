package client_test

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// Register a buffer, connect an RC QP to a peer whose QPN, address and rkey
// came out of band (as perftest exchanges them over TCP), RDMA WRITE into
// the peer and wait for the completion. A Client is a verbs.Device: the
// same code runs on an in-process device.
func Example() {
	c, err := client.Dial("") // client.DefaultControl
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := c.AllocMem(1 << 20)
	defer mem.Free()
	mr, _ := pd.RegMR(mem, 0, 1<<20, 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	cq, _ := c.CreateCQ(128)
	qp, _ := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})

	var peerQPN, peerRKey uint32 // from the peer, out of band
	var peerAddr uint64
	var peerGID ib.GID
	for _, m := range []struct {
		attr ib.QPAttr
		mask ib.QPAttrMask
	}{
		{ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite | ib.RemoteRead},
			ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags},
		{ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: peerQPN, AV: ib.AddressVector{DGID: peerGID}, MaxDestRdAtomic: 1},
			ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer},
		{ib.QPAttr{State: ib.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			ib.AttrState | ib.AttrSQPSN | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(&m.attr, m.mask); err != nil {
			fmt.Println(err)
			return
		}
	}

	copy(mem.Bytes(), "hello")
	wr := []verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mr.IOVA(), Length: 5, LKey: mr.LKey()}}, RemoteAddr: peerAddr, RKey: peerRKey}}
	if _, err := qp.PostSend(wr); err != nil {
		fmt.Println(err)
		return
	}
	var wcs [1]ib.WC
	for cq.Poll(wcs[:]) == 0 { // no syscall while the completion is on its way
		if err := cq.Wait(time.Millisecond); err != nil { // sleep only if it takes long
			fmt.Println(err)
			return
		}
	}
	fmt.Println(wcs[0].Status)
}
