// Package clock defines the one notion of time shared by softrnic's state
// machines (transports, congestion control), its engine and its simulator.
//
// State machines never read a clock: they are handed a Time by their caller.
// The engine passes Now(); the simulator and packet-level tests pass virtual
// time. That is what lets the same code run live and deterministically.
package clock
