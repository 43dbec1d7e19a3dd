package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// builder assembles a topology.
type builder struct {
	n     *net
	o     *Options
	hosts []int32 // host nodes in order: host ordinal → node
}

func (b *builder) node(name string, k nodeKind) int32 {
	b.n.nodes = append(b.n.nodes, node{name: name, kind: k, wakeAt: clock.Never, host: -1})
	id := int32(len(b.n.nodes) - 1)
	if k == hostNode {
		b.n.nodes[id].host = int32(len(b.hosts))
		b.hosts = append(b.hosts, id)
	} else {
		b.n.nodes[id].bufLimit = b.o.SwitchBuffer
	}
	return id
}

// link joins a and b with a cable of the default rate: one port in each
// direction.
func (b *builder) link(a, c int32) (ac, ca int32) { return b.linkAt(a, c, b.o.LinkRate) }

func (b *builder) linkAt(a, c int32, rate congestion.Rate) (ac, ca int32) {
	n := b.n
	mk := func(from, to int32) int32 {
		n.ports = append(n.ports, port{
			name: n.nodes[from].name + "->" + n.nodes[to].name, node: from, peer: to,
			rate: rate, delay: clock.Time(b.o.LinkDelay),
			data: fifo{-1, -1}, hi: fifo{-1, -1}, limit: b.o.Buffer,
			markAt: MarkOff, red: b.o.RED,
		})
		id := int32(len(n.ports) - 1)
		if n.nodes[from].kind == switchNode {
			p := &n.ports[id]
			p.markAt = b.o.Marking
			if b.o.ScaleRED {
				// The ramp is given at the host rate; a faster port marks
				// at proportionally larger queues (HPCC's KMIN/KMAX maps).
				f := float64(rate) / float64(b.o.LinkRate)
				p.red.Kmin = int64(float64(p.red.Kmin) * f)
				p.red.Kmax = int64(float64(p.red.Kmax) * f)
			}
			// One PCG stream per port, keyed by the port's index, so
			// adding a port elsewhere leaves the others' draws alone.
			p.rng = rand.New(rand.NewPCG(b.o.Seed, 0x5eed0000+uint64(id)))
		}
		n.nodes[from].ports = append(n.nodes[from].ports, id)
		return id
	}
	ac, ca = mk(a, c), mk(c, a)
	n.ports[ac].reverse, n.ports[ca].reverse = ca, ac
	return
}

// flow adds a flow; its controller is attached now (scenarios whose flows
// all exist from the start) or when it starts (the workload).
func (b *builder) flow(src, dst int32, start time.Duration, size int64) *flow {
	n := b.n
	id := len(n.flows)
	n.flows = append(n.flows, flow{id: id, src: src, dst: dst, start: clock.Time(start), size: size,
		finish: -1, done: -1, ccAt: clock.Never, npAt: clock.Never, hash: flowHash(b.o.Seed, id)})
	return &n.flows[id]
}

// flowHash is a flow's ECMP hash: a function of the seed and the flow, so
// the same seed routes every flow the same way.
func flowHash(seed uint64, id int) uint32 {
	x := seed ^ uint64(id)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return uint32(x)
}

// routes gives every switch its equal-cost next hops towards every host:
// a breadth-first search back from each destination (hosts do not
// forward), keeping, per switch, every port whose peer is one hop nearer,
// in port creation order. Scenarios with a single path get exactly the
// path the search finds first.
func (b *builder) routes() {
	n := b.n
	for i := range n.nodes {
		if n.nodes[i].kind == switchNode {
			n.nodes[i].route = make([]nhop, len(n.nodes))
		}
	}
	dist := make([]int32, len(n.nodes))
	queue := make([]int32, 0, len(n.nodes))
	for _, d := range b.hosts {
		for i := range dist {
			dist[i] = -1
		}
		dist[d] = 0
		queue = append(queue[:0], d)
		for k := 0; k < len(queue); k++ {
			u := queue[k]
			if u != d && n.nodes[u].kind == hostNode {
				continue
			}
			for _, pi := range n.nodes[u].ports {
				if v := n.ports[pi].peer; dist[v] < 0 {
					dist[v] = dist[u] + 1
					queue = append(queue, v)
				}
			}
		}
		for s := range n.nodes {
			if n.nodes[s].kind != switchNode || dist[s] < 0 {
				continue
			}
			r := nhop{off: int32(len(n.nh))}
			for _, pi := range n.nodes[s].ports {
				v := n.ports[pi].peer
				if dist[v] == dist[s]-1 && (n.nodes[v].kind == switchNode || v == d) {
					n.nh = append(n.nh, pi)
					r.cnt++
				}
			}
			n.nodes[s].route[d] = r
		}
	}
}

// pathInfo is what the base RTT between two hosts is made of, along one
// shortest path: the one-way propagation, the one-way serialisation of one
// payload-sized packet per link (HPCC's ns-3 pairTxDelay), the slowest
// link and the number of switches.
type pathInfo struct {
	prop, tx clock.Time
	bw       congestion.Rate
	switches int
}

// baseRTT is HPCC's ns-3 pairRtt: two one-way propagations plus one
// packet's serialisation over every link (the ACK's is neglected).
func (p pathInfo) baseRTT() clock.Time { return 2*p.prop + p.tx }

// path follows the first next hop from host src to host dst.
func (n *net) path(src, dst int32, payload int) pathInfo {
	var p pathInfo
	pi := n.nodes[src].ports[0]
	for hop := 0; hop < len(n.nodes); hop++ {
		pt := &n.ports[pi]
		p.prop += pt.delay
		p.tx += clock.Time(int64(payload) * 8e9 / int64(pt.rate))
		if p.bw == 0 || pt.rate < p.bw {
			p.bw = pt.rate
		}
		v := pt.peer
		if v == dst {
			return p
		}
		if n.nodes[v].kind != switchNode || n.nodes[v].route[dst].cnt == 0 {
			break
		}
		p.switches++
		pi = n.nh[n.nodes[v].route[dst].off]
	}
	panic(fmt.Sprintf("sim: no path from %s to %s", n.nodes[src].name, n.nodes[dst].name))
}

// fabricOf measures the topology for the algorithms: the largest base RTT
// and switch count over host pairs (by the shortest paths the routes
// use) and one hop's share of an RTT.
func (b *builder) fabricOf(pktSize, payload int) (fabric, int) {
	n := b.n
	var worst clock.Time
	most := 0
	// Every pair in small topologies; in large ones the pairs from the
	// first and last host (a Clos's paths are symmetric per tier).
	srcs := b.hosts
	if len(srcs) > 64 {
		srcs = []int32{b.hosts[0], b.hosts[len(b.hosts)-1]}
	}
	for _, s := range srcs {
		for _, d := range b.hosts {
			if s == d {
				continue
			}
			p := n.path(s, d, payload)
			worst = max(worst, p.baseRTT())
			most = max(most, p.switches)
		}
	}
	hop := 2*b.o.LinkDelay + b.o.LinkRate.TxTime(pktSize)
	return fabric{hostRate: b.o.LinkRate, baseRTT: time.Duration(worst), hopRTT: hop, pktSize: pktSize, linkDelay: b.o.LinkDelay}, most
}

// Topology names for the workload scenario.
const (
	LeafSpine = "leaf-spine"
	FatTree   = "fat-tree"
	HPCCTopo  = "hpcc" // the HPCC paper's 320-server fat-tree
)

// clos builds a three-tier Clos: pods of torsPerPod ToRs and aggsPerPod
// aggregation switches, every ToR wired to every aggregation switch of its
// pod, aggregation switch j of every pod wired to cores j·coresPerAgg …
// (j+1)·coresPerAgg−1, hostsPerToR hosts per ToR. Hosts come first in node
// order, so host i is node i.
func (b *builder) clos(pods, torsPerPod, aggsPerPod, coresPerAgg, hostsPerToR int, fabricRate congestion.Rate) {
	nHosts := pods * torsPerPod * hostsPerToR
	for i := 0; i < nHosts; i++ {
		b.node(fmt.Sprintf("h%d", i), hostNode)
	}
	tors := make([]int32, pods*torsPerPod)
	for i := range tors {
		tors[i] = b.node(fmt.Sprintf("tor%d", i), switchNode)
	}
	aggs := make([]int32, pods*aggsPerPod)
	for i := range aggs {
		aggs[i] = b.node(fmt.Sprintf("agg%d", i), switchNode)
	}
	cores := make([]int32, aggsPerPod*coresPerAgg)
	for i := range cores {
		cores[i] = b.node(fmt.Sprintf("core%d", i), switchNode)
	}
	for i := 0; i < nHosts; i++ {
		b.link(int32(i), tors[i/hostsPerToR])
	}
	for p := 0; p < pods; p++ {
		for t := 0; t < torsPerPod; t++ {
			for a := 0; a < aggsPerPod; a++ {
				b.linkAt(tors[p*torsPerPod+t], aggs[p*aggsPerPod+a], fabricRate)
			}
		}
	}
	for p := 0; p < pods; p++ {
		for a := 0; a < aggsPerPod; a++ {
			for c := 0; c < coresPerAgg; c++ {
				b.linkAt(aggs[p*aggsPerPod+a], cores[a*coresPerAgg+c], fabricRate)
			}
		}
	}
}

// leafSpine builds leaves ToRs of hostsPerLeaf hosts, each wired to every
// spine. Hosts come first in node order.
func (b *builder) leafSpine(leaves, spines, hostsPerLeaf int, upRate congestion.Rate) {
	for i := 0; i < leaves*hostsPerLeaf; i++ {
		b.node(fmt.Sprintf("h%d", i), hostNode)
	}
	ls := make([]int32, leaves)
	for i := range ls {
		ls[i] = b.node(fmt.Sprintf("leaf%d", i), switchNode)
	}
	ss := make([]int32, spines)
	for i := range ss {
		ss[i] = b.node(fmt.Sprintf("spine%d", i), switchNode)
	}
	for i := 0; i < leaves*hostsPerLeaf; i++ {
		b.link(int32(i), ls[i/hostsPerLeaf])
	}
	for _, l := range ls {
		for _, s := range ss {
			b.linkAt(l, s, upRate)
		}
	}
}

// buildWorkloadTopology builds o.Topology.
func (b *builder) buildWorkloadTopology() {
	o := b.o
	switch o.Topology {
	case LeafSpine:
		b.leafSpine(o.Leaves, o.Spines, o.HostsPerLeaf, o.UplinkRate)
	case FatTree:
		half := o.K / 2
		b.clos(o.K, half, half, half, o.HostsPerToR, o.UplinkRate)
	case HPCCTopo:
		// 5 pods × (4 ToR + 4 Agg), 16 cores, 16 servers per ToR: 320
		// servers at 100 Gb/s, 56 switches, 160 switch links at 400 Gb/s.
		b.clos(5, 4, 4, 4, 16, o.UplinkRate)
	}
}
