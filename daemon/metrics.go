package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/softrnic/softrnic/daemon/proto"
)

// Metric names: softrnic_<counter>_total for a device counter (labels:
// device), softrnic_qp_<counter>_total for a QP's (labels: device, qpn,
// type), the counter names being those of proto.DeviceCounters and
// proto.QPCounters, i.e. the names rdma statistic prints; and
// softrnic_queue_{rx_packets,xsk_rx_ring_full}_total per receive queue of
// an AF_XDP port (labels: device, queue).
const metricPrefix = "softrnic_"

// Collector is a prometheus.Collector that takes one snapshot of the
// counters per scrape, so that every metric of a scrape is from the same
// instant, and exports only the counters this port counts.
type Collector struct {
	snap   func() Counters
	device [proto.NumDeviceCounters]*prometheus.Desc
	qp     [proto.NumQPCounters]*prometheus.Desc
	qps    *prometheus.Desc
	qRx    *prometheus.Desc
	qFull  *prometheus.Desc
}

// NewCollector makes a collector over snap (e.g. CounterSource.Snapshot).
func NewCollector(snap func() Counters) *Collector {
	c := &Collector{snap: snap}
	for i, d := range proto.DeviceCounters {
		c.device[i] = prometheus.NewDesc(metricPrefix+d.Name+"_total", d.Help, []string{"device"}, nil)
	}
	for i, d := range proto.QPCounters {
		c.qp[i] = prometheus.NewDesc(metricPrefix+"qp_"+d.Name+"_total", d.Help+" (per QP)", []string{"device", "qpn", "type"}, nil)
	}
	c.qps = prometheus.NewDesc(metricPrefix+"qps", "QPs that exist, by state", []string{"device", "state"}, nil)
	c.qRx = prometheus.NewDesc(metricPrefix+"queue_rx_packets_total", "frames the port took from this receive queue's AF_XDP socket", []string{"device", "queue"}, nil)
	c.qFull = prometheus.NewDesc(metricPrefix+"queue_xsk_rx_ring_full_total", "frames dropped because this receive queue's RX ring was full", []string{"device", "queue"}, nil)
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.device {
		ch <- d
	}
	for _, d := range c.qp {
		ch <- d
	}
	ch <- c.qps
	ch <- c.qRx
	ch <- c.qFull
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	for i, v := range s.Device {
		if s.Valid&(1<<i) != 0 {
			ch <- prometheus.MustNewConstMetric(c.device[i], prometheus.CounterValue, float64(v), s.Name)
		}
	}
	var byState [7]int
	for i := range s.QPs {
		q := &s.QPs[i]
		byState[q.State%7]++
		qpn, typ := strconv.FormatUint(uint64(q.QPN), 10), qpTypeName(q.Type)
		for j, v := range q.Values {
			if q.Valid&(1<<j) != 0 {
				ch <- prometheus.MustNewConstMetric(c.qp[j], prometheus.CounterValue, float64(v), s.Name, qpn, typ)
			}
		}
	}
	for st, n := range byState {
		ch <- prometheus.MustNewConstMetric(c.qps, prometheus.GaugeValue, float64(n), s.Name, proto.QPState(st).String())
	}
	for i, q := range s.Queues {
		qs := strconv.Itoa(i)
		ch <- prometheus.MustNewConstMetric(c.qRx, prometheus.CounterValue, float64(q.RxPackets), s.Name, qs)
		ch <- prometheus.MustNewConstMetric(c.qFull, prometheus.CounterValue, float64(q.RxRingFull), s.Name, qs)
	}
}

func qpTypeName(t proto.QPType) string {
	switch t {
	case proto.RC:
		return "RC"
	case proto.UC:
		return "UC"
	case proto.UD:
		return "UD"
	}
	return "?"
}

// MetricsHandler serves the collector's metrics (and the Go client's
// process and runtime metrics) in the Prometheus exposition format.
func MetricsHandler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// MetricsServer serves /metrics on a TCP address until Close.
type MetricsServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// ServeMetrics listens on addr (host:port) and serves /metrics there.
func ServeMetrics(addr string, c *Collector) (*MetricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", MetricsHandler(c))
	m := &MetricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln, done: make(chan error, 1)}
	go func() { m.done <- m.srv.Serve(ln) }()
	return m, nil
}

// Addr is the address the endpoint listens on.
func (m *MetricsServer) Addr() net.Addr { return m.ln.Addr() }

// Close stops the endpoint, letting scrapes in progress finish (bounded).
func (m *MetricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	if serr := <-m.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
