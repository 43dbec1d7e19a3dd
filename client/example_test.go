package client_test

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Register a buffer, connect an RC QP to a peer whose QPN, address and rkey
// came out of band (as perftest exchanges them over TCP), RDMA WRITE into
// the peer and wait for the completion.
func Example() {
	c, err := client.Dial("") // client.DefaultControl
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 20)
	defer mem.Free()
	mr, _ := pd.RegMR(mem, 0, 1<<20, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	cq, _ := c.CreateCQ(128)
	qp, _ := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq,
		Caps: proto.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})

	var peerQPN, peerRKey uint32 // from the peer, out of band
	var peerAddr uint64
	var peerGID [16]byte
	qp.Modify(&proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite | ib.RemoteRead}, proto.AttrState|proto.AttrPKeyIndex|proto.AttrPort|proto.AttrAccessFlags)
	qp.Modify(&proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: peerQPN, DGID: peerGID, MaxDestRdAtomic: 1},
		proto.AttrState|proto.AttrAV|proto.AttrPathMTU|proto.AttrDestQPN|proto.AttrRQPSN|proto.AttrMaxDestRdAtomc)
	qp.Modify(&proto.QPAttr{State: proto.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		proto.AttrState|proto.AttrSQPSN|proto.AttrTimeout|proto.AttrRetryCnt|proto.AttrRNRRetry|proto.AttrMaxQPRdAtomic)

	copy(mem.Bytes(), "hello")
	qp.PostSend(&proto.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []proto.SGE{mr.SGE(0, 5)}, RemoteAddr: peerAddr, RKey: peerRKey})
	var wcs [1]ib.WC
	for cq.Poll(wcs[:]) == 0 { // no syscall while the completion is on its way
		cq.Wait(time.Millisecond) // sleep only if it takes long
	}
	fmt.Println(wcs[0].Status)
}
