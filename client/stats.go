package client

import (
	"slices"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/verbs"
)

var _ verbs.RecoveryCounter = (*Client)(nil)

// RecoveryCounters implements verbs.RecoveryCounter: the daemon's counters
// of this client's QPs numbered in qpns (OpStats, every page), summed; zero
// if the daemon cannot be asked.
func (c *Client) RecoveryCounters(qpns []uint32) verbs.RecoveryCounters {
	var r verbs.RecoveryCounters
	req := proto.StatsReq{}
	for page := 0; page < 1<<16; page++ {
		body, _, err := c.call(proto.OpStats, &req, 0)
		if err != nil {
			return r
		}
		var resp proto.StatsResp
		if proto.DecodeBody(body, &resp) != nil {
			return r
		}
		n := min(int(resp.Listed), len(resp.QPs))
		for _, q := range resp.QPs[:n] {
			if slices.Contains(qpns, q.QPN) {
				addRecovery(&r, &q.Values)
			}
		}
		if resp.More == 0 || n == 0 {
			return r
		}
		req.FromQPN = resp.QPs[n-1].QPN + 1
	}
	return r
}

func addRecovery(r *verbs.RecoveryCounters, v *[proto.NumQPCounters]uint64) {
	r.Timeouts += v[proto.QCtrLocalAckTimeoutErr]
	r.Excused += v[proto.QCtrLocalAckTimeoutExcused]
	r.Retransmits += v[proto.QCtrRetransmits]
	r.SeqNAKs += v[proto.QCtrPacketSeqErr]
	r.Duplicates += v[proto.QCtrDuplicateRequest]
	r.AdpRetrans += v[proto.QCtrRoCEAdpRetrans]
	r.AdpRetransTO += v[proto.QCtrRoCEAdpRetransTO]
	r.TLPProbes += v[proto.QCtrTLPProbes]
	r.FastRetrans += v[proto.QCtrFastRetrans]
	r.RxSACKs += v[proto.QCtrRxSACKs]
	r.TxSACKs += v[proto.QCtrTxSACKs]
	r.SelRetrans += v[proto.QCtrSelRetrans]
	r.SRHeld += v[proto.QCtrSRHeld]
	r.SRDropped += v[proto.QCtrSRDropped]
	r.RetransPackets += v[proto.QCtrRetransPackets]
}
