package sim

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// recorder wraps a controller and keeps copies of the first ACKs it sees.
type recorder struct {
	congestion.Controller
	acks []congestion.Ack
	ints [][]congestion.INTHop
	at   []clock.Time
	sent int
}

func (r *recorder) OnPacketSent(now clock.Time, n int) {
	r.sent++
	r.Controller.OnPacketSent(now, n)
}

func (r *recorder) OnAck(now clock.Time, a congestion.Ack) {
	if len(r.acks) < 64 {
		r.acks = append(r.acks, a)
		r.ints = append(r.ints, append([]congestion.INTHop(nil), a.INT...))
		r.at = append(r.at, now)
	}
	r.Controller.OnAck(now, a)
}

// What an ACK tells its sender, for one HPCC flow alone on the two-flow
// topology at 40 Gb/s, 1 µs links (h1 → sw → r): data packets are 1010
// bytes (1000 + INT 2 + 8·1 switch), ACKs 76 (66 + INT).
//
//	RTT of the first packet = 1010 B at 40 Gb/s (202 ns) + 1 µs + 202 ns at
//	the switch + 1 µs + the ACK's 76 B at the receiver (15.2 ns → 15, the
//	port carries 0.2 ns) + 1 µs + 15 ns at the switch + 1 µs = 4434 ns;
//	one switch crossed; one INT record: the switch's 40 Gb/s port, pushed
//	as the packet left the switch (t = 1202 ns) with nothing sent before and
//	nothing queued; the next records 202 ns apart, 1010 bytes more each.
func TestAckEchoesINTAndRTT(t *testing.T) {
	o := Options{Scenario: TwoFlow, Algorithm: HPCC, Seed: 1, Duration: 2 * time.Millisecond}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	n, err := build(&o)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Controller: n.flows[0].cc}
	n.flows[0].cc = rec
	n.setWindow(&o)
	n.startSampler(clock.Time(o.TraceInterval))
	n.run()
	if n.pktSize != 1010 || n.ackSize != 76 || n.intStride != 1 {
		t.Fatalf("packet %d B, ACK %d B, INT stride %d", n.pktSize, n.ackSize, n.intStride)
	}
	if len(rec.acks) < 10 {
		t.Fatalf("%d ACKs", len(rec.acks))
	}
	a := rec.acks[0]
	if a.RTT != 4434*time.Nanosecond || a.Hops != 1 || a.Bytes != 1010 || len(rec.ints[0]) != 1 || a.ECNEcho {
		t.Fatalf("first ACK %+v INT %+v", a, rec.ints[0])
	}
	if h := rec.ints[0][0]; h.Rate != 40*congestion.Gbps || h.TS != 1202 || h.TxBytes != 0 || h.QLen != 0 {
		t.Fatalf("first INT record %+v", h)
	}
	for i := 1; i < 10; i++ {
		p, h := rec.ints[i-1][0], rec.ints[i][0]
		if h.TS-p.TS != 202 || h.TxBytes-p.TxBytes != 1010 || h.QLen != 0 {
			t.Fatalf("record %d after %+v: %+v", i, p, h)
		}
	}
	// Back to back at line rate, the flow's window (R·T = 40 Gb/s ·
	// 4.4 µs = 22,000 B) holds 22 packets before the first ACK returns.
	if rec.at[0] != 4434 {
		t.Fatalf("first ACK at %v", rec.at[0])
	}
}

// ACKs every AckInterval packets acknowledge all of them at once; a
// flow's last packet is always acknowledged.
func TestAckInterval(t *testing.T) {
	o := Options{Scenario: Incast, Algorithm: Swift, Flows: 2, IncastSize: 10_500, AckInterval: 4, Seed: 1, Duration: 2 * time.Millisecond}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	n, err := build(&o)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Controller: n.flows[1].cc}
	n.flows[1].cc = rec
	n.setWindow(&o)
	n.startSampler(clock.Time(o.TraceInterval))
	n.run()
	// 10,500 bytes in 1000-byte packets: 11 packets (10 of 1000, 1 of
	// 500); ACKs after packets 4, 8 and 11 (the last).
	if rec.sent != 11 || len(rec.acks) != 3 {
		t.Fatalf("%d packets, %d ACKs", rec.sent, len(rec.acks))
	}
	if rec.acks[0].Bytes != 4000 || rec.acks[2].Bytes != 2500 || n.flows[1].done < 0 {
		t.Fatalf("ACKs acknowledge %d, %d, %d bytes; done %v", rec.acks[0].Bytes, rec.acks[1].Bytes, rec.acks[2].Bytes, n.flows[1].done)
	}
}
