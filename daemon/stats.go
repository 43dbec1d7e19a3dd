package daemon

import (
	"slices"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
)

// stats answers OpStats (softrnic stats): the device counters, and a page
// of per-QP counters. Root sees every QP, others only their own
// connection's: another client's QPNs and traffic are not theirs to see.
func (ss *session) stats(body []byte) (any, []int, error) {
	var req proto.StatsReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, errf(unix.EINVAL, "STATS: %v", err)
	}
	f := ss.s.opt.Counters
	if f == nil {
		return nil, nil, errf(unix.EOPNOTSUPP, "this daemon keeps no counters")
	}
	c := f()
	c.Daemon = ss.s.counters()
	var own map[uint32]bool
	if ss.cred.Uid != 0 {
		own = map[uint32]bool{}
		ss.mu.Lock()
		for _, q := range ss.qps {
			own[q.qp.QPN()] = true
		}
		ss.mu.Unlock()
	}
	return statsPage(&c, &req, own), nil, nil
}

// statsPage builds one StatsResp from a snapshot: the QPs at or after
// req.FromQPN in QPN order (only those in own, unless own is nil).
func statsPage(c *Counters, req *proto.StatsReq, own map[uint32]bool) *proto.StatsResp {
	r := &proto.StatsResp{Valid: c.Valid, Device: c.Device, NumQueues: uint32(len(c.Queues)), CM: c.CM, Daemon: c.Daemon}
	if c.HasCM {
		r.HasCM = 1
	}
	copy(r.Name[:len(r.Name)-1], c.Name)
	copy(r.Queues[:], c.Queues)
	qps := slices.Clone(c.QPs)
	slices.SortFunc(qps, func(a, b proto.QPStats) int { return int(int64(a.QPN) - int64(b.QPN)) })
	for i := range qps {
		q := &qps[i]
		if q.QPN < req.FromQPN || req.FilterQP != 0 && q.QPN != req.QPN || own != nil && !own[q.QPN] {
			continue
		}
		if int(r.Listed) == len(r.QPs) {
			r.More = 1
			break
		}
		r.QPs[r.Listed] = *q
		r.Listed++
	}
	return r
}
