// Package engine drives a rnic.Device on a port.Port: it is the one loop
// that moves RoCEv2 frames between the wire and the device's queue pairs.
//
// Everything about a frame — parsing, the checks that drop it (destination
// address, TVer, P_Key, DestQP, QP type and state, source of the connected
// peer, ICRC), the counters of those drops (rnic.Device.Stats), the
// building of Ethernet/IP/UDP headers and the ICRC — belongs to the device.
// The engine owns only the loop: which goroutine calls the device's step
// functions, when it polls the port, when it spins and when it sleeps, and
// what it does when the port takes fewer frames than it is offered. The
// frames are built in buffers the port lends (port.Port's Lend and
// Submit), so they are written once, where the port sends them from.
// Finding the interface and opening its port is package host's.
//
// One goroutine runs Run per device and port (package rnic requires the
// step functions never to run concurrently). Applications post and poll on
// the device from their own goroutines; a post rings the device's doorbell,
// which cuts a nap short. An application that busy-polls may also run the
// loop's step itself (rnic.Device.Poll, which Run wires to TryStep) while
// the engine goroutine naps: a step lock, taken once per batch, decides
// which goroutine runs it. A device may have work queues outside it (the
// daemon's client rings, rnic.Queues): every step fetches from them, and
// the loop arms them before it sleeps, in its port (port.Waker), where a
// frame, a timer deadline or a wake-up ends the sleep.
package engine
