// Package sim is softrnic's deterministic discrete-event simulator for
// congestion-control research. Hosts run softrnic's own DCQCN reaction and
// notification points (congestion/dcqcn) and its per-QP pacer
// (congestion.Pacer); links have a rate and a propagation delay; switches
// have output-queued ports (FIFO, RED/ECN marking at enqueue or dequeue,
// tail drop, optional PFC) and a strict-priority queue for CNPs.
//
// Time is integer nanoseconds (clock.Time); events fire in (time, sequence)
// order; randomness (RED marking) comes from math/rand/v2 PCG streams
// seeded per port from the run's seed. Nothing depends on map order, wall
// time or GOMAXPROCS, so the same Options give byte-identical traces.
//
// Simplifications, all deliberate: flows are long-lived or fixed-size
// transfers with no transport (no ACKs, no retransmission — a dropped
// packet is counted and lost); PFC PAUSE/RESUME take effect one propagation
// delay after the threshold crossing and occupy no link time; the switch
// buffer is a per-port tail-drop limit, not a shared pool.
package sim
