package perftest

import "fmt"

// Verb is the operation a test measures.
type Verb uint8

const (
	Send Verb = iota
	Write
	Read
	Atomic
)

// String returns perftest's name for the verb (testsStr).
func (v Verb) String() string {
	switch v {
	case Send:
		return "Send"
	case Write:
		return "RDMA_Write"
	case Read:
		return "RDMA_Read"
	case Atomic:
		return "Atomic"
	}
	return fmt.Sprintf("Verb(%d)", uint8(v))
}

// Measure is what a test measures: bandwidth or latency.
type Measure uint8

const (
	BW Measure = iota
	Latency
)

// Transport is the QP type under test (perftest's -c).
type Transport uint8

const (
	RC Transport = iota
	UC
	UD
)

// String returns perftest's name (connStr).
func (t Transport) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// Test names one perftest program and the parameters that change what goes
// over the side channel.
type Test struct {
	Verb      Verb
	Measure   Measure
	Transport Transport
	QPs       int    // -q; key records per key exchange
	Size      uint64 // -s
	SizeGiven bool   // -s was given: UD refuses rather than clamps an over-MTU size
	AllSizes  bool   // -a: every power of two from 2 B up
}

// Name returns the perftest program name, e.g. "write_bw".
func (t Test) Name() string {
	v := map[Verb]string{Send: "send", Write: "write", Read: "read", Atomic: "atomic"}[t.Verb]
	if t.Measure == BW {
		return v + "_bw"
	}
	return v + "_lat"
}

// Sizes returns the message sizes the test runs once the path MTU is known,
// as perftest decides them: atomics are always 8 bytes; -a runs 2 B … 8 MiB
// (UD: up to the MTU); a UD message must fit one MTU, so an over-MTU default
// is clamped and an over-MTU -s refused (check_mtu).
func (t Test) Sizes(mtu MTU) ([]uint64, error) {
	if t.Verb == Atomic {
		return []uint64{8}, nil
	}
	if t.AllSizes {
		maxPow := 23
		if t.Transport == UD && t.Verb == Send {
			maxPow = 0
			for 1<<(maxPow+1) <= mtu.Bytes() {
				maxPow++
			}
		}
		sizes := make([]uint64, 0, maxPow)
		for i := 1; i <= maxPow; i++ {
			sizes = append(sizes, 1<<i)
		}
		return sizes, nil
	}
	if t.Transport == UD && t.Size > uint64(mtu.Bytes()) {
		if t.SizeGiven {
			return nil, fmt.Errorf("perftest: a UD message (%d B) cannot be larger than the MTU (%d B)", t.Size, mtu.Bytes())
		}
		return []uint64{uint64(mtu.Bytes())}, nil
	}
	return []uint64{t.Size}, nil
}

// StepKind is one phase of a test as seen on the side channel.
type StepKind uint8

const (
	// StepKeys exchanges one key record per QP, in QP order.
	StepKeys StepKind = iota
	// StepConnect moves the local QPs to RTR (and RTS) toward the peer's
	// records; nothing goes over the channel.
	StepConnect
	// StepBarrier is one handshake with QP 0's record: perftest's way of
	// waiting for the peer to reach the same point.
	StepBarrier
	// StepPostRecv posts receive buffers for messages of Size bytes
	// (SEND tests, on the side that receives).
	StepPostRecv
	// StepRun runs the measurement at Size bytes.
	StepRun
	// StepReports exchanges the five bandwidth report values.
	StepReports
	// StepClose is the closing handshake followed by "done".
	StepClose
)

func (k StepKind) String() string {
	return [...]string{"keys", "connect", "barrier", "post-recv", "run", "reports", "close"}[k]
}

// Step is one phase; Size is set for StepPostRecv and StepRun.
type Step struct {
	Kind StepKind
	Size uint64
}

// Plan returns the phases of test t for the client (client true) or the
// server, after the version, system-data and MTU exchanges, for the given
// message sizes. The order is that of perftest's own programs
// ({write,read,atomic,send}_{bw,lat}.c, non-duplex), which the peer follows
// step for step: a missing or extra barrier deadlocks both ends.
func (t Test) Plan(client bool, sizes []uint64) []Step {
	var p []Step
	add := func(k StepKind, size uint64) { p = append(p, Step{Kind: k, Size: size}) }
	switch {
	case t.Measure == BW && t.Verb != Send:
		// keys → connect → keys again → "after moving QP to RTR" barrier;
		// the passive server then waits in a barrier until the client is done.
		add(StepKeys, 0)
		add(StepConnect, 0)
		add(StepKeys, 0)
		add(StepBarrier, 0)
		if client {
			for _, s := range sizes {
				add(StepRun, s)
			}
		}
		add(StepBarrier, 0)
		add(StepReports, 0)
		add(StepClose, 0)
	case t.Measure == BW && t.Verb == Send:
		add(StepKeys, 0)
		add(StepConnect, 0)
		add(StepBarrier, 0)
		add(StepKeys, 0)
		for _, s := range sizes {
			if !client {
				add(StepPostRecv, s)
			}
			add(StepBarrier, 0)
			add(StepRun, s)
			if t.AllSizes { // send_bw -a: one more barrier after each size
				add(StepBarrier, 0)
			}
		}
		add(StepClose, 0)
	case t.Verb == Send: // send_lat: both sides receive
		add(StepKeys, 0)
		add(StepConnect, 0)
		add(StepBarrier, 0)
		add(StepKeys, 0)
		for _, s := range sizes {
			add(StepPostRecv, s)
			add(StepBarrier, 0)
			add(StepRun, s)
		}
		add(StepClose, 0)
	case t.Verb == Write: // write_lat: both sides ping-pong; perftest never closes the channel explicitly
		add(StepBarrier, 0)
		add(StepKeys, 0)
		add(StepConnect, 0)
		add(StepKeys, 0)
		add(StepBarrier, 0)
		for _, s := range sizes {
			add(StepRun, s)
		}
	default: // read_lat, atomic_lat: the server is passive and closes at once
		add(StepBarrier, 0)
		add(StepKeys, 0)
		add(StepConnect, 0)
		add(StepKeys, 0)
		add(StepBarrier, 0)
		if client {
			for _, s := range sizes {
				add(StepRun, s)
			}
		}
		add(StepClose, 0)
	}
	return p
}
