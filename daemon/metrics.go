package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Metric names: softrnic_<counter>_total for a device counter and an
// rdma_cm counter (cm_*; labels: device), softrnic_qp_<counter>_total for
// a QP's (labels: device, qpn, type; a figure, proto.QPGauges, is a gauge
// without _total), the counter names being those of proto.DeviceCounters and
// proto.QPCounters, i.e. the names rdma statistic prints; and
// softrnic_queue_{rx_packets,xsk_rx_ring_full}_total per receive queue of
// an AF_XDP port (labels: device, queue). In a daemon, its own counters
// as softrnic_<counter>_total (proto.DaemonCounters; labels: device), and
// its clients' usage against its limits: softrnic_client_usage (labels:
// device, resource), softrnic_client_limit and
// softrnic_client_limit_refusals_total (labels: device, resource, scope).
const metricPrefix = "softrnic_"

// Collector is a prometheus.Collector that takes one snapshot of the
// counters per scrape, so that every metric of a scrape is from the same
// instant, and exports only the counters this port counts.
type Collector struct {
	snap   func() Counters
	device [proto.NumDeviceCounters]*prometheus.Desc
	qp     [proto.NumQPCounters]*prometheus.Desc
	cm     [proto.NumCMCounters]*prometheus.Desc
	qps    *prometheus.Desc
	qRx    *prometheus.Desc
	qFull  *prometheus.Desc
	daemon [proto.NumDaemonCounters]*prometheus.Desc
	use    *prometheus.Desc
	limit  *prometheus.Desc
	refuse *prometheus.Desc
}

// NewCollector makes a collector over snap (e.g. CounterSource.Snapshot).
func NewCollector(snap func() Counters) *Collector {
	c := &Collector{snap: snap}
	for i, d := range proto.DeviceCounters {
		c.device[i] = prometheus.NewDesc(metricPrefix+d.Name+"_total", d.Help, []string{"device"}, nil)
	}
	for i, d := range proto.CMCounters {
		c.cm[i] = prometheus.NewDesc(metricPrefix+d.Name+"_total", d.Help, []string{"device"}, nil)
	}
	for i, d := range proto.QPCounters {
		name := metricPrefix + "qp_" + d.Name + "_total"
		if proto.QPGauges&(1<<i) != 0 {
			name = metricPrefix + "qp_" + d.Name
		}
		c.qp[i] = prometheus.NewDesc(name, d.Help+" (per QP)", []string{"device", "qpn", "type"}, nil)
	}
	c.qps = prometheus.NewDesc(metricPrefix+"qps", "QPs that exist, by state", []string{"device", "state"}, nil)
	c.qRx = prometheus.NewDesc(metricPrefix+"queue_rx_packets_total", "frames the port took from this receive queue's AF_XDP socket", []string{"device", "queue"}, nil)
	c.qFull = prometheus.NewDesc(metricPrefix+"queue_xsk_rx_ring_full_total", "frames dropped because this receive queue's RX ring was full", []string{"device", "queue"}, nil)
	for i, d := range proto.DaemonCounters {
		c.daemon[i] = prometheus.NewDesc(metricPrefix+d.Name+"_total", d.Help, []string{"device"}, nil)
	}
	c.use = prometheus.NewDesc(metricPrefix+"client_usage", "what the daemon's clients hold together, of a limited resource", []string{"device", "resource"}, nil)
	c.limit = prometheus.NewDesc(metricPrefix+"client_limit", "the limit of a resource per client connection, uid or host (absent: unlimited)", []string{"device", "resource", "scope"}, nil)
	c.refuse = prometheus.NewDesc(metricPrefix+"client_limit_refusals_total", "client requests refused by a limit", []string{"device", "resource", "scope"}, nil)
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
	for _, d := range c.cm {
		ch <- d
	}
	ch <- c.qps
	ch <- c.qRx
	ch <- c.qFull
	for _, d := range c.daemon {
		ch <- d
	}
	ch <- c.use
	ch <- c.limit
	ch <- c.refuse
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	for i, v := range s.Device {
		if s.Valid&(1<<i) != 0 {
			ch <- prometheus.MustNewConstMetric(c.device[i], prometheus.CounterValue, float64(v), s.Name)
		}
	}
	if s.HasCM {
		for i, v := range s.CM {
			ch <- prometheus.MustNewConstMetric(c.cm[i], prometheus.CounterValue, float64(v), s.Name)
		}
	}
	var byState [7]int
	for i := range s.QPs {
		q := &s.QPs[i]
		byState[q.State%7]++
		qpn, typ := strconv.FormatUint(uint64(q.QPN), 10), qpTypeName(q.Type)
		for j, v := range q.Values {
			if q.Valid&(1<<j) != 0 {
				t := prometheus.CounterValue
				if proto.QPGauges&(1<<j) != 0 {
					t = prometheus.GaugeValue
				}
				ch <- prometheus.MustNewConstMetric(c.qp[j], t, float64(v), s.Name, qpn, typ)
			}
		}
	}
	for st, n := range byState {
		ch <- prometheus.MustNewConstMetric(c.qps, prometheus.GaugeValue, float64(n), s.Name, ib.QPState(st).String())
	}
	for i, q := range s.Queues {
		qs := strconv.Itoa(i)
		ch <- prometheus.MustNewConstMetric(c.qRx, prometheus.CounterValue, float64(q.RxPackets), s.Name, qs)
		ch <- prometheus.MustNewConstMetric(c.qFull, prometheus.CounterValue, float64(q.RxRingFull), s.Name, qs)
	}
	if !s.HaveDaemon {
		return
	}
	for i, v := range s.Daemon {
		ch <- prometheus.MustNewConstMetric(c.daemon[i], prometheus.CounterValue, float64(v), s.Name)
	}
	u := &s.Usage
	for r := Resource(0); r < NumResources; r++ {
		if r == Objects {
			continue // counted per connection only
		}
		ch <- prometheus.MustNewConstMetric(c.use, prometheus.GaugeValue, float64(u.Host[r]), s.Name, r.String())
		for sc := Scope(0); sc < NumScopes; sc++ {
			if r == Connections && sc == PerConn {
				continue
			}
			if lim := u.Limits[r][sc]; lim >= 0 {
				ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(lim), s.Name, r.String(), sc.String())
			}
			ch <- prometheus.MustNewConstMetric(c.refuse, prometheus.CounterValue, float64(u.Refusals[r][sc]), s.Name, r.String(), sc.String())
		}
	}
}

func qpTypeName(t ib.QPType) string {
	switch t {
	case ib.RC:
		return "RC"
	case ib.UC:
		return "UC"
	case ib.UD:
		return "UD"
	default:
		return "?"
	}
}

// MetricsHandler serves the collector's metrics (and the Go client's
// process and runtime metrics) in the Prometheus exposition format.
func MetricsHandler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// MetricsServer serves /metrics on a TCP address until Close.
type MetricsServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// The endpoint names every QP and its counters: enough to map a host's
// connections and watch its traffic. So it is loopback-only unless the
// operator either requires a bearer token (metrics-token-file) or says the
// network may read it (metrics-allow-public).
type metricsAccess struct {
	tokenSum    [sha256.Size]byte // SHA-256 of the bearer token
	token       bool
	allowPublic bool
}

// A MetricsOption sets who may scrape a MetricsServer.
type MetricsOption func(*metricsAccess)

// WithBearerToken requires every request to carry "Authorization: Bearer
// TOKEN" (RFC 6750), on loopback too; others get 401. It also allows a
// non-loopback address.
func WithBearerToken(token []byte) MetricsOption {
	sum := sha256.Sum256(token)
	return func(a *metricsAccess) { a.tokenSum, a.token = sum, true }
}

// AllowPublic allows a non-loopback address without a token: anyone who
// reaches the address reads the counters.
func AllowPublic() MetricsOption { return func(a *metricsAccess) { a.allowPublic = true } }

// ErrMetricsPublic refuses a non-loopback metrics address that has no
// access control.
var ErrMetricsPublic = errors.New("not a loopback address, and the endpoint shows every QP number and counter to whoever connects: " +
	"set metrics-token-file (a bearer token scrapers must send) or metrics-allow-public = true")

// check refuses to serve on ip (the address bound, or to be bound) when it
// is not loopback and nothing controls access.
func (a *metricsAccess) check(ip netip.Addr) error {
	if ip.Unmap().IsLoopback() || a.token || a.allowPublic {
		return nil
	}
	return fmt.Errorf("metrics: %v: %w", ip, ErrMetricsPublic)
}

// ServeMetrics listens on addr (host:port) and serves /metrics there. A
// non-loopback address (":9464" and "0.0.0.0:9464" included) is refused
// unless an option controls access; a host name is resolved and the bound
// address checked.
func ServeMetrics(addr string, c *Collector, opts ...MetricsOption) (*MetricsServer, error) {
	var acc metricsAccess
	for _, o := range opts {
		o(&acc)
	}
	// Refuse a literal address before binding it at all.
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := acc.check(ip); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		if err := acc.check(ip); err != nil {
			ln.Close()
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", MetricsHandler(c))
	var h http.Handler = mux
	if acc.token {
		h = requireBearer(acc.tokenSum, mux)
	}
	m := &MetricsServer{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln: ln, done: make(chan error, 1)}
	go func() { m.done <- m.srv.Serve(ln) }()
	return m, nil
}

// requireBearer answers 401 to a request without the bearer token whose
// SHA-256 is sum. Digests of equal length are compared in constant time,
// so that neither the token's bytes nor its length leak through timing.
func requireBearer(sum [sha256.Size]byte, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		ok := subtle.ConstantTimeCompare(got[:], sum[:]) == 1
		if !strings.EqualFold(scheme, "Bearer") || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="softrnic metrics"`)
			http.Error(w, "401 unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Bounds of a metrics token: long enough not to be guessed (openssl rand
// -hex 16 gives 32 characters), short enough to be a token.
const (
	minMetricsToken = 16
	maxMetricsToken = 4096
)

// ReadMetricsToken reads the bearer token from path: the file's content
// without surrounding white space, printable ASCII without spaces (what an
// HTTP header and Prometheus' bearer_token_file carry), at least 16
// characters. A file that others may read or write is refused: the token
// would be no secret.
func ReadMetricsToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("%s is accessible by others (mode %#o): chmod o= it", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxMetricsToken+1))
	if err != nil {
		return nil, err
	}
	tok := bytes.TrimSpace(b)
	if len(b) > maxMetricsToken {
		return nil, fmt.Errorf("%s holds more than %d bytes: not a token", path, maxMetricsToken)
	}
	if len(tok) < minMetricsToken {
		return nil, fmt.Errorf("%s: the token has %d characters, fewer than %d (make one with: openssl rand -hex 16)", path, len(tok), minMetricsToken)
	}
	for _, c := range tok {
		if c <= ' ' || c > '~' {
			return nil, fmt.Errorf("%s: the token may hold only printable ASCII without spaces", path)
		}
	}
	return tok, nil
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
