package daemon

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/softrnic/softrnic/daemon/proto"
)

// gather returns the value of each counter the collector exports, by
// metric name.
func gather(t *testing.T, c *Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				out[mf.GetName()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// The rdma_cm counters reach softrnic stats (STATS' CM group) and
// /metrics (softrnic_cm_*_total) when the daemon runs a CM, and neither
// without one.
func TestCMCountersExported(t *testing.T) {
	var c Counters
	c.Name = "cm-test"
	c.HasCM = true
	c.CM[proto.CMRxMalformed] = 3
	c.CM[proto.CMReqDropped] = 7
	r := statsPage(&c, &proto.StatsReq{}, nil)
	if r.HasCM != 1 || r.CM[proto.CMRxMalformed] != 3 || r.CM[proto.CMReqDropped] != 7 {
		t.Fatalf("STATS: has %d, %v", r.HasCM, r.CM)
	}
	m := gather(t, NewCollector(func() Counters { return c }))
	if m["softrnic_cm_rx_malformed_total"] != 3 || m["softrnic_cm_req_dropped_total"] != 7 {
		t.Fatalf("metrics: %v", m)
	}
	if _, ok := m["softrnic_cm_timeouts_total"]; !ok {
		t.Fatal("cm_timeouts not exported")
	}
	c.HasCM = false
	m = gather(t, NewCollector(func() Counters { return c }))
	if _, ok := m["softrnic_cm_rx_malformed_total"]; ok {
		t.Fatal("CM counters exported without a CM")
	}
}
