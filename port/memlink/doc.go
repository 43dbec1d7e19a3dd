// Package memlink is an in-memory Ethernet link: a pair of port.Port ends
// joined by two one-way "wires", with impairments (loss, duplication,
// reordering, single-bit corruption, delay and jitter) drawn from a seeded
// random source so that a test failure reproduces from its seed, and an ECN
// marker (CE with a probability, or above a virtual queue) that stands in
// for a congested switch in DCQCN tests.
//
// It serves two kinds of driver:
//
//   - virtual time (Config.Clock set, e.g. to a VirtualClock's Now): a
//     single-goroutine test or the simulator steps two devices and the link,
//     asks NextDelivery when the next frame becomes due, and advances its
//     clock. Recv never blocks in this mode; with the same seed and the same
//     sequence of calls, every run is identical.
//   - real time (Config.Clock nil): each end is owned by its own goroutine,
//     the link reads clock.Now, and Recv with a timeout blocks until a frame is
//     due, the timeout passes, or the port is closed.
//
// Frames live in a preallocated ring of buffers of each wire: Lend lends
// the sender free ones, the frame is built there and Submit queues it in
// place, so neither sending nor Recv copies or allocates in steady state
// (a duplicate is the one copy). A frame returned by Recv stays valid
// until the next Recv on the same Port, as port.Port demands.
//
// Each wire has its own random source (derived from Config.Seed and the
// direction), so which frames a wire impairs depends only on the sequence of
// frames sent on it, not on how the two directions interleave.
package memlink
