// Package sim is softrnic's deterministic discrete-event simulator for
// congestion-control research. Hosts run softrnic's own congestion
// controllers — DCQCN's reaction and notification points
// (congestion/dcqcn), HPCC, TIMELY, Swift — and its per-QP pacer
// (congestion.Pacer); links have a rate and a propagation delay; switches
// have output-queued ports (FIFO, RED/ECN marking at enqueue or dequeue,
// tail drop, optional PFC, INT records for HPCC, ECMP over equal-cost
// paths) and a strict-priority queue for CNPs and ACKs.
//
// Scenarios: two-flow, n-flow and incast on one or two switches (the
// DCQCN paper's experiments), and workload: a leaf-spine or fat-tree
// fabric (or the HPCC paper's 320-server one) loaded with flows drawn from
// a flow-size CDF at Poisson arrivals, reported as HPCC's ns-3 reports it
// (fct.txt, FCT slowdown by flow size).
//
// Time is integer nanoseconds (clock.Time); events fire in (time, sequence)
// order; randomness (RED marking, the workload, ECMP hashes) comes from
// math/rand/v2 PCG streams seeded from the run's seed, one per component.
// Nothing depends on map order, wall time or GOMAXPROCS, so the same
// Options give byte-identical traces and fct.txt.
//
// Simplifications, all deliberate: the transport is ideal — the receiver
// acknowledges every AckInterval packets (ACK-clocked algorithms and the
// workload only), there is no retransmission, and a dropped packet is
// counted and lost (its flow never completes); PFC PAUSE/RESUME take
// effect one propagation delay after the threshold crossing and occupy no
// link time, with a static threshold per ingress port; the switch buffer
// is a per-port tail-drop limit plus, in the workload, a shared limit per
// switch; INT records are exact (not HPCC's 8-byte encoding).
package sim
