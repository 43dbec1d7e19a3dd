package perftest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// ResultLine is perftest's table rule (RESULT_LINE).
const ResultLine = "---------------------------------------------------------------------------------------\n"

// Units of a bandwidth report: perftest's default MiB/s, or Gb/s with
// --report_gbits (format_factor 0x100000 or 125000000 bytes per unit).
func bwUnit(gbits bool) float64 {
	if gbits {
		return 125000000
	}
	return 0x100000
}

// ComputeBW turns per-message post and completion times (ns, index i is
// message i, across all QPs) into a bandwidth report as perftest's
// print_report_bw does: the average over the whole run, and the peak as the
// best time per message over any span from a post to a CQ-moderation
// boundary. The peak search starts spans only at moderation boundaries,
// which keeps it O((n/cqMod)²) where perftest's is O(n²/cqMod).
func ComputeBW(size uint64, posted, completed []int64, cqMod int, gbits bool) BWReport {
	n := min(len(posted), len(completed))
	r := BWReport{Size: size, Iters: uint64(n)}
	if n == 0 {
		return r
	}
	cqMod = max(cqMod, 1)
	total := float64(completed[n-1] - posted[0])
	if total <= 0 {
		return r
	}
	unit := bwUnit(gbits)
	r.AvgBW = float64(size) * float64(n) * 1e9 / total / unit
	r.MsgRate = float64(n) * 1e9 / total / 1e6
	best := total / float64(n)
	for i := 0; i < n; i += cqMod {
		for j := ((i+1+cqMod-1)/cqMod)*cqMod - 1; j < n; j += cqMod {
			if t := float64(completed[j]-posted[i]) / float64(j-i+1); t > 0 && t < best {
				best = t
			}
		}
		if n%cqMod != 0 {
			j := n - 1
			if t := float64(completed[j]-posted[i]) / float64(j-i+1); t > 0 && t < best {
				best = t
			}
		}
	}
	r.PeakBW = float64(size) * 1e9 / best / unit
	return r
}

// BWHeader returns the column header of a bandwidth table (RESULT_FMT).
func BWHeader(gbits bool) string {
	if gbits {
		return " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
	}
	return " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
}

// FormatBW formats one row of a bandwidth table (REPORT_FMT, or
// REPORT_FMT_EXT with six decimals when a Gb/s average is below 0.1).
func FormatBW(r BWReport, gbits bool) string {
	if gbits && r.AvgBW < 0.1 {
		return fmt.Sprintf(" %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n", r.Size, r.Iters, r.PeakBW, r.AvgBW, r.MsgRate)
	}
	return fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f\n", r.Size, r.Iters, r.PeakBW, r.AvgBW, r.MsgRate)
}

// LatReport is one row of a latency table, in microseconds.
type LatReport struct {
	Size    uint64  `json:"MsgSize"`
	Iters   uint64  `json:"n_iterations"`
	Min     float64 `json:"t_min"`
	Max     float64 `json:"t_max"`
	Typical float64 `json:"t_typical"`
	Avg     float64 `json:"t_avg"`
	Stdev   float64 `json:"t_stdev"`
	P99     float64 `json:"99percentile"`
	P999    float64 `json:"99.9percentile"`
	HalfRTT bool    `json:"-"`
}

// latTail is how many of the largest samples perftest leaves out
// (LAT_MEASURE_TAIL): the first iterations' cache and page faults.
const latTail = 2

// ComputeLat summarises per-iteration times as perftest's print_report_lat:
// the iteration times are halved for ping-pong tests (SEND, WRITE: one
// iteration is a round trip) and taken whole for READ and atomics; the two
// largest are dropped; typical is the median; the 99th and 99.9th
// percentiles index the sorted samples at ceil(n·p).
func ComputeLat(size uint64, iterTimes []time.Duration, halfRTT bool) LatReport {
	r := LatReport{Size: size, Iters: uint64(len(iterTimes)) + 1, HalfRTT: halfRTT}
	d := slices.Clone(iterTimes)
	slices.Sort(d)
	div := 1000.0 // ns → µs
	if halfRTT {
		div *= 2
	}
	cnt := len(d) - latTail
	if cnt <= 0 {
		return r
	}
	us := func(i int) float64 { return float64(d[min(i, len(d)-1)]) / div }
	var sum float64
	for i := 0; i < cnt; i++ {
		sum += us(i)
	}
	r.Avg = sum / float64(cnt)
	var v float64
	for i := 0; i < cnt; i++ {
		v += (r.Avg - us(i)) * (r.Avg - us(i))
	}
	r.Stdev = math.Sqrt(v / float64(cnt))
	if (cnt-1)%2 != 0 {
		r.Typical = (us(cnt/2) + us(cnt/2-1)) / 2
	} else {
		r.Typical = us(cnt / 2)
	}
	r.Min = us(0)
	r.Max = us(cnt)
	r.P99 = us(int(math.Ceil(float64(cnt) * 0.99)))
	r.P999 = us(int(math.Ceil(float64(cnt) * 0.999)))
	return r
}

// LatHeader is the column header of a latency table (RESULT_FMT_LAT).
const LatHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"

// FormatLat formats one row of a latency table (REPORT_FMT_LAT).
func FormatLat(r LatReport) string {
	return fmt.Sprintf(" %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		r.Size, r.Iters, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
}

// Info is what the banner above a result table says about a test.
type Info struct {
	Test        Test
	Device      string
	Client      bool
	MTU         MTU
	TxDepth     int
	RxDepth     int
	CQMod       int
	OutReads    int
	InlineSize  int
	GIDIndex    int // -1: not given
	Duration    time.Duration
	ReportGbits bool
}

func (in Info) title() string {
	s := in.Test.Verb.String() + " "
	if in.Test.Verb == Atomic {
		s += "FETCH_AND_ADD "
	}
	if in.Test.Measure == BW {
		return s + "BW Test"
	}
	return s + "Latency Test"
}

// WriteBanner writes the test description perftest prints before a run
// (ctx_print_test_info), for our device.
func WriteBanner(w io.Writer, in Info) {
	fmt.Fprint(w, ResultLine)
	fmt.Fprintf(w, "                    %s\n", in.title())
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", in.Device)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IB\n", in.Test.QPs)
	fmt.Fprintf(w, " Connection type : %s\t\tUsing SRQ      : OFF\n", in.Test.Transport)
	if in.Client {
		fmt.Fprintf(w, " TX depth        : %d\n", in.TxDepth)
	}
	if in.Test.Verb == Send && !in.Client {
		fmt.Fprintf(w, " RX depth        : %d\n", in.RxDepth)
	}
	if in.Test.Measure == BW {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", in.CQMod)
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", in.MTU.Bytes())
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if in.GIDIndex >= 0 {
		fmt.Fprintf(w, " GID index       : %d\n", in.GIDIndex)
	}
	if in.Test.Verb == Read || in.Test.Verb == Atomic {
		fmt.Fprintf(w, " Outstand reads  : %d\n", in.OutReads)
	} else {
		fmt.Fprintf(w, " Max inline data : %d[B]\n", in.InlineSize)
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
	fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	fmt.Fprint(w, ResultLine)
}

// WriteDest writes one QP's line of the address block perftest prints
// (ctx_print_pingpong_data), side "local" or "remote".
func WriteDest(w io.Writer, side string, d Dest, v Verb) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, altHex(uint64(d.LID), 4), altHex(uint64(d.QPN), 6), altHex(uint64(d.PSN), 6))
	switch v {
	case Read:
		fmt.Fprintf(w, " OUT %s", altHex(uint64(d.OutReads), 4))
		fallthrough
	case Write:
		fmt.Fprintf(w, " RKey %s VAddr %s", altHex(uint64(d.RKey), 8), altHex(d.VAddr, 16))
	default:
		// SEND and ATOMIC: perftest prints neither.
	}
	fmt.Fprint(w, "\n GID: ")
	for i, g := range d.GID {
		if i > 0 {
			fmt.Fprint(w, ":")
		}
		fmt.Fprintf(w, "%02d", g)
	}
	fmt.Fprint(w, "\n")
}

// altHex formats v as C's printf("%#0<width>x"): "0x" and zero padding
// within width, but no prefix at all for zero.
func altHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 0), v)
}

// JSONResult is `softrnic perf --json`: perftest's out_json layout
// ("test_info", "results") with our bandwidth or latency rows.
type JSONResult struct {
	TestInfo struct {
		Test           string `json:"test"`
		Device         string `json:"Device"`
		NumberOfQPs    int    `json:"Number_of_qps"`
		ConnectionType string `json:"Connection_type"`
		MTU            int    `json:"Mtu"`
		LinkType       string `json:"Link_type"`
		Units          string `json:"BW_units,omitempty"`
		Verified       *bool  `json:"verified,omitempty"`
	} `json:"test_info"`
	BW  []JSONBW    `json:"results_bw,omitempty"`
	Lat []LatReport `json:"results_lat,omitempty"`
}

// JSONBW is one bandwidth row in JSON.
type JSONBW struct {
	MsgSize   uint64  `json:"MsgSize"`
	Iters     uint64  `json:"n_iterations"`
	BWPeak    float64 `json:"BW_peak"`
	BWAverage float64 `json:"BW_average"`
	MsgRate   float64 `json:"MsgRate"`
}

// NewJSONResult starts a JSON result for a test.
func NewJSONResult(in Info) *JSONResult {
	j := &JSONResult{}
	j.TestInfo.Test = in.Test.Verb.String() + "_" + map[Measure]string{BW: "BW", Latency: "Latency"}[in.Test.Measure] + "_Test"
	j.TestInfo.Device = in.Device
	j.TestInfo.NumberOfQPs = in.Test.QPs
	j.TestInfo.ConnectionType = in.Test.Transport.String()
	j.TestInfo.MTU = in.MTU.Bytes()
	j.TestInfo.LinkType = "Ethernet"
	if in.Test.Measure == BW {
		j.TestInfo.Units = "MiB/sec"
		if in.ReportGbits {
			j.TestInfo.Units = "Gb/sec"
		}
	}
	return j
}

// AddBW appends a bandwidth row.
func (j *JSONResult) AddBW(r BWReport) {
	j.BW = append(j.BW, JSONBW{r.Size, r.Iters, r.PeakBW, r.AvgBW, r.MsgRate})
}

// Write writes the result as indented JSON.
func (j *JSONResult) Write(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(j)
}
