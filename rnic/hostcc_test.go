package rnic

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/internal/checker"
)

// hostCCRun hands s unmarked WRITEs every 10 µs for 300 µs, telling the
// device before each that its receive rings are nearly exhausted for the
// first 90 µs (a FILL ring with 2 of 100 buffers, an RX ring with 90)
// and calm afterwards, and returns the times of the CNPs it sent. tos is
// the WRITEs' TOS byte.
func hostCCRun(t *testing.T, s *ccSolo, tos uint8) []time.Duration {
	t.Helper()
	s.dev.hostCC.Init(dcqcn.HostCCConfig{Hold: 15 * time.Microsecond})
	var sent []time.Duration
	collect := func(now clock.Time) {
		for _, fb := range s.transmit(now) {
			if f := checker.Frame(t, fb); f.Opcode() == bth.CNP {
				sent = append(sent, time.Duration(now))
			}
		}
	}
	for i := 0; i < 30; i++ {
		now := clock.Time(time.Duration(i) * 10 * time.Microsecond)
		for dl := s.dev.NextDeadline(); dl <= now; dl = s.dev.NextDeadline() {
			s.dev.Expire(dl)
			collect(dl)
		}
		if i < 9 {
			s.dev.SetRxLevel(now, 2, 90, 100)
		} else {
			s.dev.SetRxLevel(now, 98, 0, 100)
		}
		s.write(now, tos)
		collect(now)
	}
	return sent
}

// A DCQCN device whose receive rings run low answers its QP's unmarked
// packets as CE-marked, at most once per CNP interval (the paper's 50 µs),
// only while they run low: CNPs at 0 and 50 µs, counted as host marks.
func TestHostCongestionSendsCNPs(t *testing.T) {
	s := newCCSolo(t, mustCC(t, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	got := hostCCRun(t, s, 0x02)
	us := time.Microsecond
	if want := []time.Duration{0, 50 * us}; !equalDurations(got, want) {
		t.Fatalf("CNPs at %v, want %v", got, want)
	}
	st := s.dev.Stats
	if st.NPHostCCMarks != 2 || st.NPCNPSent != 2 || st.NPECNMarkedRoCEPackets != 2 {
		t.Fatalf("host marks %d, CNPs %d, CE-marked %d; want 2, 2, 2", st.NPHostCCMarks, st.NPCNPSent, st.NPECNMarkedRoCEPackets)
	}
	if c := s.dev.HostCCCounters(); c.Episodes != 1 || c.Readings != 9 || c.Marks != 2 {
		t.Fatalf("detector counters %+v, want 1 episode, 9 readings, 2 marks", c)
	}
	s.dev.EachQPCounters(func(c *QPCounters) {
		if c.HostCCMarks != 2 {
			t.Errorf("QP %#x: %d host marks, want 2", c.QPN, c.HostCCMarks)
		}
	})
}

// Packets the network marked already are the NP's as ever: the host adds
// no mark of its own to them, and their CNPs follow the NP's spacing.
func TestHostCongestionLeavesNetworkMarks(t *testing.T) {
	s := newCCSolo(t, mustCC(t, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	got := hostCCRun(t, s, 0x03)
	us := time.Microsecond
	want := []time.Duration{0, 50 * us, 100 * us, 150 * us, 200 * us, 250 * us}
	if !equalDurations(got, want) {
		t.Fatalf("CNPs at %v, want %v", got, want)
	}
	if st := s.dev.Stats; st.NPHostCCMarks != 0 || st.NPECNMarkedRoCEPackets != 30 {
		t.Fatalf("host marks %d, CE-marked %d; want 0 and 30", st.NPHostCCMarks, st.NPECNMarkedRoCEPackets)
	}
}

// Without DCQCN there is no notification point to ask, and with HostCC
// off no signal: no mark, no CNP.
func TestHostCongestionNeedsDCQCN(t *testing.T) {
	s := newCCSolo(t, Congestion{}, macA, addrA, macB, addrB, 0x40, 0)
	if got := hostCCRun(t, s, 0x02); len(got) != 0 || s.dev.Stats.NPHostCCMarks != 0 {
		t.Fatalf("congestion control off: CNPs at %v, %d host marks", got, s.dev.Stats.NPHostCCMarks)
	}
	s = newCCSolo(t, mustCC(t, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	s.dev.hostMarks = false
	if got := hostCCRun(t, s, 0x02); len(got) != 0 || s.dev.Stats.NPHostCCMarks != 0 {
		t.Fatalf("HostCC off: CNPs at %v, %d host marks", got, s.dev.Stats.NPHostCCMarks)
	}
}
