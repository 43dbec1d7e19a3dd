// Package rnictest holds the device's verbs with its own types, for tests
// that drive an rnic.Device directly (the engine's, the simulator's, the
// tools'): they panic on what only a wrong test could get wrong (a CQ's
// depth), and return the errors a test may want to see.
package rnictest
