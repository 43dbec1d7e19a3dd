package daemon

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// Every counter of the table has a unique name of the Linux style, and
// names reported elsewhere as "not counted" are not also in the table.
func TestCounterNames(t *testing.T) {
	re := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for i, d := range proto.DeviceCounters {
		if !re.MatchString(d.Name) || d.Help == "" {
			t.Errorf("device counter %d: bad name %q or no help", i, d.Name)
		}
		if seen[d.Name] {
			t.Errorf("device counter %q twice", d.Name)
		}
		seen[d.Name] = true
	}
	for _, d := range proto.NotCounted {
		if seen[d.Name] {
			t.Errorf("%q is both counted and listed as not counted", d.Name)
		}
	}
	// The names Linux RDMA tools read, as rxe and mlx5 spell them.
	for _, n := range []string{"rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "duplicate_request", "out_of_sequence",
		"rnr_nak_retry_err", "local_ack_timeout_err", "rx_icrc_encapsulated", "out_of_buffer", "np_cnp_sent", "rp_cnp_handled"} {
		if !seen[n] {
			t.Errorf("no device counter %q", n)
		}
	}
	// The daemon's own share the device's metric names' space.
	for i, d := range proto.DaemonCounters {
		if !re.MatchString(d.Name) || d.Help == "" || seen[d.Name] {
			t.Errorf("daemon counter %d: bad or repeated name %q", i, d.Name)
		}
		seen[d.Name] = true
	}
	qseen := map[string]bool{}
	for i, d := range proto.QPCounters {
		if !re.MatchString(d.Name) || d.Help == "" || qseen[d.Name] {
			t.Errorf("QP counter %d: bad or repeated name %q", i, d.Name)
		}
		qseen[d.Name] = true
	}
}

// fillDevice maps each input to its own name: every input set to a
// distinct value shows up under exactly the expected counter.
func TestFillDeviceTable(t *testing.T) {
	var in counterInputs
	in.dev = rnic.Stats{RxFrames: 1, RxParseErr: 2, RxNotLocal: 3, RxBadHeader: 4, RxNoQP: 5, RxBadICRC: 6,
		RxBadType: 7, RxBadSrc: 8, RxBadState: 9, TxFrames: 10}
	in.dev.NPECNMarkedRoCEPackets, in.dev.NPCNPSent, in.dev.RPCNPHandled, in.dev.RPCNPIgnored = 11, 12, 13, 14
	in.dev.CCCounters.Counters = congestion.Counters{RTTSamples: 31, Decreases: 32, LossEvents: 33, WindowFull: 34}
	in.loop.TxBackPress = 15
	in.rxBytes, in.txBytes, in.haveBytes = 16, 17, true
	in.xdp.Program.Steered, in.xdp.Program.Passed, in.xdp.Program.Malformed, in.xdp.Program.Unbound, in.xdp.Program.Foreign = 18, 19, 20, 21, 22
	s := &in.xdp.Socket
	s.RxDropped, s.RxInvalidDescs, s.TxInvalidDescs, s.RxRingFull, s.RxFillRingEmpty, s.TxRingEmptyDescs = 23, 24, 25, 26, 27, 28
	in.xdp.Oversize = 29
	in.haveXDP = true
	in.eventsLost = 4010
	rcq := rnic.QPCounters{QPN: 17, Type: ib.RC}
	rcq.RC.RxDuplicate, rcq.RC.RxOutOfSeq, rcq.RC.RNRWaits, rcq.RC.Timeouts, rcq.RC.TxRNRNAKs = 100, 200, 300, 400, 500
	rcq.RC.RxDropped, rcq.RC.TxNAKs, rcq.RC.Retransmits = 600, 700, 800
	rcq.RC.RxNAKSeqErr, rcq.RC.ImpliedNAKs, rcq.RC.RxWriteReqs, rcq.RC.RxReadReqs, rcq.RC.RxAtomicReqs = 4001, 4002, 4003, 4004, 4005
	rcq.RC.RxNAKRemAccess, rcq.RC.RxNAKInvReq, rcq.RC.RemAccessErrs, rcq.RC.LocalLengthErrs = 4006, 4007, 4008, 4009
	rcq.CQE = rnic.CQECounters{ReqErr: 10, ReqFlushErr: 20, RespErr: 30, RespFlushErr: 40}
	rcq.RC.AdpRetrans, rcq.RC.AdpRetransTO, rcq.RC.TLPProbes, rcq.RC.FastRetrans, rcq.RC.RxSACKs = 5001, 5002, 5003, 5004, 5005
	rcq.RC.TxSACKs, rcq.RC.SelRetrans, rcq.RC.SRHeld, rcq.RC.SRDropped, rcq.RC.RetransPkts = 5006, 5007, 5008, 5009, 5010
	udq := rnic.QPCounters{QPN: 18, Type: ib.UD}
	udq.UD.RxNoRecv, udq.UD.RxDropped, udq.UD.RxBadQKey = 1000, 2000, 3000
	udq.CQE = rnic.CQECounters{ReqErr: 1, ReqFlushErr: 2, RespErr: 3, RespFlushErr: 4}
	in.add(&rcq)
	in.add(&udq)
	var d [proto.NumDeviceCounters]uint64
	valid := fillDevice(&d, &in)
	if valid != proto.ValidAll {
		t.Errorf("valid %#x, want all %#x", valid, proto.ValidAll)
	}
	want := map[string]uint64{
		"rx_packets": 1, "rx_malformed": 2, "rx_not_local": 3, "rx_bad_header": 4, "rx_unknown_qp": 5, "rx_icrc_encapsulated": 6,
		"rx_bad_opcode": 7, "rx_bad_source": 8, "rx_bad_qp_state": 9, "tx_packets": 10,
		"np_ecn_marked_roce_packets": 11, "np_cnp_sent": 12, "rp_cnp_handled": 13, "rp_cnp_ignored": 14,
		"tx_backpressure": 15, "rx_bytes": 16, "tx_bytes": 17,
		"xdp_steered": 18, "xdp_passed": 19, "xdp_malformed": 20, "xdp_unbound": 21, "xdp_foreign": 22,
		"xsk_rx_dropped": 23, "xsk_rx_invalid_descs": 24, "xsk_tx_invalid_descs": 25, "xsk_rx_ring_full": 26,
		"xsk_rx_fill_ring_empty_descs": 27, "xsk_tx_ring_empty_descs": 28, "xsk_rx_oversize": 29,
		"duplicate_request": 100, "out_of_sequence": 200, "rnr_nak_retry_err": 300, "local_ack_timeout_err": 400,
		"out_of_buffer": 500 + 1000, "rx_qp_dropped": 600 + 2000, "nak_sent": 700, "retransmits": 800, "rx_bad_qkey": 3000,
		"packet_seq_err": 4001, "implied_nak_seq_err": 4002, "rx_write_requests": 4003, "rx_read_requests": 4004,
		"rx_atomic_requests": 4005, "req_remote_access_errors": 4006, "req_remote_invalid_request": 4007,
		"resp_remote_access_errors": 4008, "resp_local_length_error": 4009, "async_events_lost": 4010,
		"req_cqe_error": 11, "req_cqe_flush_error": 22, "resp_cqe_error": 33, "resp_cqe_flush_error": 44,
		"cc_rtt_samples": 31, "cc_decreases": 32, "cc_loss_events": 33, "cc_window_full": 34,
		"roce_adp_retrans": 5001, "roce_adp_retrans_to": 5002, "rx_sacks": 5005,
		"tx_sacks": 5006, "sel_retrans": 5007, "sr_held": 5008, "sr_dropped": 5009, "retrans_packets": 5010,
	}
	if len(want) != int(proto.NumDeviceCounters) {
		t.Fatalf("test lists %d counters, table has %d", len(want), proto.NumDeviceCounters)
	}
	for i, def := range proto.DeviceCounters {
		if w, ok := want[def.Name]; !ok || d[i] != w {
			t.Errorf("%s = %d, want %d", def.Name, d[i], w)
		}
	}

	// Without an AF_XDP port and byte counts, those counters are not
	// reported at all, rather than as zeros.
	in.haveXDP, in.haveBytes = false, false
	valid = fillDevice(&d, &in)
	for i, def := range proto.DeviceCounters {
		xdp := strings.HasPrefix(def.Name, "xdp_") || strings.HasPrefix(def.Name, "xsk_") || strings.HasSuffix(def.Name, "_bytes")
		if got := valid&(1<<i) != 0; got == xdp {
			t.Errorf("%s valid=%v without AF_XDP", def.Name, got)
		}
	}

	// Per QP: RC counters for RC, UD ones for UD, and only those valid.
	r := qpStats(&rcq)
	if r.Type != ib.RC || r.Values[proto.QCtrDuplicateRequest] != 100 || r.Values[proto.QCtrRetransmits] != 800 ||
		r.Valid&(1<<proto.QCtrRxBadQKey) != 0 || r.Valid&(1<<proto.QCtrLocalAckTimeoutErr) == 0 {
		t.Errorf("RC QP stats %+v", r)
	}
	u := qpStats(&udq)
	if u.Type != ib.UD || u.Values[proto.QCtrRxBadQKey] != 3000 || u.Values[proto.QCtrOutOfBuffer] != 1000 ||
		u.Valid&(1<<proto.QCtrDuplicateRequest) != 0 || u.Valid&(1<<proto.QCtrRxPackets) == 0 {
		t.Errorf("UD QP stats %+v", u)
	}
	// Each new per-QP counter under its own name: RC ones for RC only,
	// error completions for every type.
	for _, c := range []struct {
		idx    int
		rc, ud uint64 // want; 0 for ud: not valid on UD
	}{
		{proto.QCtrPacketSeqErr, 4001, 0}, {proto.QCtrImpliedNakSeqErr, 4002, 0}, {proto.QCtrRxWriteRequests, 4003, 0},
		{proto.QCtrRxReadRequests, 4004, 0}, {proto.QCtrRxAtomicRequests, 4005, 0}, {proto.QCtrReqRemoteAccessErrors, 4006, 0},
		{proto.QCtrReqRemoteInvalidRequest, 4007, 0}, {proto.QCtrRespRemoteAccessErrors, 4008, 0},
		{proto.QCtrRespLocalLengthError, 4009, 0},
		{proto.QCtrRoCEAdpRetrans, 5001, 0}, {proto.QCtrRoCEAdpRetransTO, 5002, 0}, {proto.QCtrTLPProbes, 5003, 0},
		{proto.QCtrFastRetrans, 5004, 0}, {proto.QCtrRxSACKs, 5005, 0}, {proto.QCtrTxSACKs, 5006, 0},
		{proto.QCtrSelRetrans, 5007, 0}, {proto.QCtrSRHeld, 5008, 0}, {proto.QCtrSRDropped, 5009, 0},
		{proto.QCtrRetransPackets, 5010, 0},
		{proto.QCtrReqCQEError, 10, 1}, {proto.QCtrReqCQEFlushError, 20, 2}, {proto.QCtrRespCQEError, 30, 3}, {proto.QCtrRespCQEFlushError, 40, 4},
	} {
		name := proto.QPCounters[c.idx].Name
		if r.Values[c.idx] != c.rc || r.Valid&(1<<c.idx) == 0 {
			t.Errorf("RC QP %s = %d (valid %v), want %d", name, r.Values[c.idx], r.Valid&(1<<c.idx) != 0, c.rc)
		}
		if uv := u.Valid&(1<<c.idx) != 0; uv != (c.ud != 0) || u.Values[c.idx] != c.ud {
			t.Errorf("UD QP %s = %d (valid %v), want %d", name, u.Values[c.idx], uv, c.ud)
		}
	}
}

// A QP's congestion-control counters and figures are valid as its
// algorithm has them: every algorithm's counts, rate and smoothed RTT; the
// window's with a window; DCQCN's NP/RP counts under DCQCN only; Swift's
// cwnd and target under Swift only.
func TestQPCongestionStats(t *testing.T) {
	base := congestion.State{Rate: 12.5 * congestion.Mbps, Window: congestion.NoWindow, SRTT: 1500,
		Counters: congestion.Counters{RTTSamples: 7, Decreases: 3, LossEvents: 2, WindowFull: 1}}
	sw, tm, dc := base, base, base
	sw.Algorithm, sw.Window, sw.Cwnd, sw.Target = "swift", 5400, 4.25, 6400
	tm.Algorithm = "timely"
	dc.Algorithm, dc.ECNMarked, dc.CNPSent, dc.CNPHandled, dc.CNPIgnored, dc.Cuts = "dcqcn", 41, 42, 43, 44, 45
	valid := func(s proto.QPStats, i int) bool { return s.Valid&(1<<i) != 0 }
	for _, c := range []struct {
		st                congestion.State
		window, swift, dq bool
	}{{sw, true, true, false}, {tm, false, false, false}, {dc, false, false, true}} {
		q := rnic.QPCounters{QPN: 9, Type: ib.RC, CC: c.st, CCOn: true, HostCCMarks: 46}
		s := qpStats(&q)
		v := &s.Values
		if v[proto.QCtrCCRTTSamples] != 7 || v[proto.QCtrCCDecreases] != 3 || v[proto.QCtrCCLossEvents] != 2 ||
			v[proto.QCtrCCRateKbps] != 12500 || v[proto.QCtrCCSRTTNs] != 1500 || !valid(s, proto.QCtrCCRateKbps) {
			t.Errorf("%s: %v", c.st.Algorithm, v)
		}
		if valid(s, proto.QCtrCCWindowBytes) != c.window || valid(s, proto.QCtrCCWindowFull) != c.window ||
			c.window && (v[proto.QCtrCCWindowBytes] != 5400 || v[proto.QCtrCCWindowFull] != 1) {
			t.Errorf("%s: window %v", c.st.Algorithm, v)
		}
		if valid(s, proto.QCtrCCCwndMilli) != c.swift || c.swift && (v[proto.QCtrCCCwndMilli] != 4250 || v[proto.QCtrCCTargetNs] != 6400) {
			t.Errorf("%s: swift %v", c.st.Algorithm, v)
		}
		if valid(s, proto.QCtrDCQCNCNPSent) != c.dq || c.dq && (v[proto.QCtrDCQCNECNMarked] != 41 || v[proto.QCtrDCQCNRateCuts] != 45 ||
			v[proto.QCtrNpHostCCMarks] != 46 || !valid(s, proto.QCtrNpHostCCMarks)) {
			t.Errorf("%s: dcqcn %v", c.st.Algorithm, v)
		}
	}
	if s := qpStats(&rnic.QPCounters{QPN: 9, Type: ib.RC}); s.Valid&(1<<proto.QCtrCCRTTSamples|proto.QPGauges) != 0 {
		t.Errorf("a QP without congestion control has cc values: %#x", s.Valid)
	}
}

// statsPage sorts by QPN, pages at MaxStatsQPs, filters by QPN and by
// ownership.
func TestStatsPage(t *testing.T) {
	var c Counters
	for qpn := uint32(100); qpn > 100-proto.MaxStatsQPs-3; qpn-- {
		c.QPs = append(c.QPs, proto.QPStats{QPN: qpn})
	}
	r := statsPage(&c, &proto.StatsReq{}, nil)
	if r.Listed != proto.MaxStatsQPs || r.More != 1 || r.QPs[0].QPN != 100-proto.MaxStatsQPs-2 {
		t.Fatalf("first page: listed %d more %d first %d", r.Listed, r.More, r.QPs[0].QPN)
	}
	r = statsPage(&c, &proto.StatsReq{FromQPN: r.QPs[r.Listed-1].QPN + 1}, nil)
	if r.Listed != 3 || r.More != 0 || r.QPs[2].QPN != 100 {
		t.Fatalf("second page: listed %d more %d", r.Listed, r.More)
	}
	lowest := uint32(100 - proto.MaxStatsQPs - 2)
	r = statsPage(&c, &proto.StatsReq{QPN: lowest, FilterQP: 1}, nil)
	if r.Listed != 1 || r.QPs[0].QPN != lowest {
		t.Fatalf("filtered: %d QPs", r.Listed)
	}
	r = statsPage(&c, &proto.StatsReq{}, map[uint32]bool{95: true, 97: true})
	if r.Listed != 2 || r.QPs[0].QPN != 95 || r.QPs[1].QPN != 97 {
		t.Fatalf("own QPs: %d listed", r.Listed)
	}
	// Receive queues: all of them counted, the first MaxStatsQueues detailed.
	for i := 0; i < proto.MaxStatsQueues+2; i++ {
		c.Queues = append(c.Queues, proto.QueueStats{RxPackets: uint64(i + 1)})
	}
	r = statsPage(&c, &proto.StatsReq{}, nil)
	if r.NumQueues != proto.MaxStatsQueues+2 || r.Queues[0].RxPackets != 1 || r.Queues[proto.MaxStatsQueues-1].RxPackets != proto.MaxStatsQueues {
		t.Fatalf("queues: %d, %+v", r.NumQueues, r.Queues)
	}
}

// A scrape of /metrics shows the counters under their names with their
// values, per device and per QP, and leaves out what is not counted.
func TestMetricsScrape(t *testing.T) {
	var c Counters
	c.Name = "veth0"
	c.Valid = proto.ValidAll &^ proto.ValidXDP
	c.Device[proto.CtrRxPackets] = 123
	c.Device[proto.CtrNpCNPSent] = 7
	c.Device[proto.CtrXDPSteered] = 99 // not valid: must not appear
	q := proto.QPStats{QPN: 17, Type: ib.RC, State: ib.RTS, Valid: 1<<proto.QCtrDuplicateRequest | 1<<proto.QCtrCCSRTTNs}
	q.Values[proto.QCtrDuplicateRequest] = 5
	q.Values[proto.QCtrCCSRTTNs] = 2500
	c.QPs = append(c.QPs, q)
	c.Queues = []proto.QueueStats{{RxPackets: 40}, {RxPackets: 2, RxRingFull: 3}}
	c.HaveDaemon = true
	c.Daemon[proto.DCtrBadWQEs] = 3
	c.Usage.Host[QPs] = 12
	c.Usage.Limits[QPs] = [NumScopes]int64{PerConn: 4, PerUID: 8, PerHost: -1}
	c.Usage.Refusals[QPs][PerUID] = 2
	scrapes := 0
	srv := httptest.NewServer(MetricsHandler(NewCollector(func() Counters { scrapes++; return c })))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	for _, line := range []string{
		`softrnic_rx_packets_total{device="veth0"} 123`,
		`softrnic_np_cnp_sent_total{device="veth0"} 7`,
		`softrnic_tx_packets_total{device="veth0"} 0`,
		`softrnic_qp_duplicate_request_total{device="veth0",qpn="17",type="RC"} 5`,
		`softrnic_qps{device="veth0",state="RTS"} 1`,
		`softrnic_queue_rx_packets_total{device="veth0",queue="0"} 40`,
		`softrnic_queue_rx_packets_total{device="veth0",queue="1"} 2`,
		`softrnic_queue_xsk_rx_ring_full_total{device="veth0",queue="1"} 3`,
		`# HELP softrnic_rx_icrc_encapsulated_total RoCEv2 frames dropped for a bad ICRC`,
		`# TYPE softrnic_rx_packets_total counter`,
		`softrnic_qp_cc_srtt_ns{device="veth0",qpn="17",type="RC"} 2500`,
		`# TYPE softrnic_qp_cc_srtt_ns gauge`,
		`softrnic_bad_wqes_total{device="veth0"} 3`,
		`softrnic_controlled_qkey_refused_total{device="veth0"} 0`,
		`softrnic_client_usage{device="veth0",resource="qps"} 12`,
		`softrnic_client_limit{device="veth0",resource="qps",scope="uid"} 8`,
		`softrnic_client_limit_refusals_total{device="veth0",resource="qps",scope="uid"} 2`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("scrape lacks %q", line)
		}
	}
	for _, absent := range []string{"softrnic_xdp_steered_total", "softrnic_qp_out_of_sequence_total", `resource="qps",scope="host"} -1`,
		`softrnic_client_limit{device="veth0",resource="qps",scope="host"}`} {
		if strings.Contains(text, absent) {
			t.Errorf("scrape shows %s, which is not counted here", absent)
		}
	}
	if scrapes != 1 {
		t.Errorf("%d snapshots for one scrape", scrapes)
	}
}

// ServeMetrics serves /metrics (and nothing else) on loopback until Close.
func TestServeMetrics(t *testing.T) {
	var c Counters
	c.Name = "lo-test"
	c.Valid = 1 << proto.CtrTxPackets
	c.Device[proto.CtrTxPackets] = 42
	m, err := ServeMetrics("127.0.0.1:0", NewCollector(func() Counters { return c }))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + m.Addr().String()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "softrnic_tx_packets_total{device=\"lo-test\"} 42\n") ||
		strings.Contains(string(b), "softrnic_rx_packets_total") {
		t.Errorf("/metrics: %d\n%.1500s", resp.StatusCode, b)
	}
	if resp, err := http.Get(base + "/"); err != nil || resp.StatusCode != 404 {
		t.Errorf("/: %v %v", err, resp.StatusCode)
	} else {
		resp.Body.Close()
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := http.Get(base + "/metrics"); err == nil {
		t.Error("still serving after Close")
	}
}
