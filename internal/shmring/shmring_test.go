package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The cross-process tests re-exec this test binary as the peer: TestMain
// runs the child role when SHMRING_CHILD is set.
func TestMain(m *testing.M) {
	if role := os.Getenv("SHMRING_CHILD"); role != "" {
		os.Exit(child(role))
	}
	os.Exit(m.Run())
}

var testGeom = Geometry{SlotSize: 64, Slots: 256}

func mustRing(t testing.TB, g Geometry) *Ring {
	t.Helper()
	r, err := Create("shmring-test", g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func mustDoorbell(t testing.TB) *Doorbell {
	t.Helper()
	d, err := NewDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// fill writes a pattern derived from seq into a slot; check verifies it.
func fill(s []byte, seq uint64) {
	binary.LittleEndian.PutUint64(s, seq)
	for i := 8; i < len(s); i++ {
		s[i] = byte(seq*31 + uint64(i))
	}
}

func check(s []byte, seq uint64) error {
	if got := binary.LittleEndian.Uint64(s); got != seq {
		return fmt.Errorf("slot has seq %d, want %d", got, seq)
	}
	for i := 8; i < len(s); i++ {
		if s[i] != byte(seq*31+uint64(i)) {
			return fmt.Errorf("seq %d: byte %d corrupted", seq, i)
		}
	}
	return nil
}

func TestGeometryValidate(t *testing.T) {
	for _, g := range []Geometry{{0, 8}, {64, 0}, {64, 3}, {12, 8}, {64, MaxSlots * 2}, {MaxSlotSize + 8, 8}, {-8, 8}} {
		if err := g.Validate(); !errors.Is(err, ErrGeometry) {
			t.Errorf("%+v: got %v, want ErrGeometry", g, err)
		}
		if _, err := Create("bad", g); err == nil {
			t.Errorf("%+v: Create accepted it", g)
		}
	}
	if err := (Geometry{SlotSize: 8, Slots: 1}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestFullEmptyAndWrap(t *testing.T) {
	g := Geometry{SlotSize: 16, Slots: 4}
	r := mustRing(t, g)
	p, c := r.Producer(nil), r.Consumer()
	if c.Peek() != nil {
		t.Fatal("empty ring returned a slot")
	}
	// A reservation given back is neither published nor lost.
	p.Reserve()
	p.Unreserve()
	if p.Pending() != 0 || p.Free() != g.Slots {
		t.Fatalf("after Unreserve: pending %d, free %d", p.Pending(), p.Free())
	}
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if c.Peek() != nil {
		t.Fatal("an unreserved slot was published")
	}
	var seq, want uint64
	for round := 0; round < 10; round++ {
		for i := 0; i < g.Slots; i++ {
			s := p.Reserve()
			if s == nil {
				t.Fatalf("round %d: ring full after %d", round, i)
			}
			fill(s, seq)
			seq++
		}
		if p.Reserve() != nil {
			t.Fatal("Reserve beyond capacity")
		}
		if c.Peek() != nil {
			t.Fatal("consumer saw uncommitted slots")
		}
		if _, err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		if c.Len() != g.Slots {
			t.Fatalf("Len = %d", c.Len())
		}
		for i := 0; i < g.Slots; i++ {
			s := c.Peek()
			if s == nil {
				t.Fatal("missing slot")
			}
			if err := check(s, want); err != nil {
				t.Fatal(err)
			}
			want++
		}
		if c.Peek() != nil {
			t.Fatal("extra slot")
		}
		if p.Reserve() != nil {
			t.Fatal("producer reused slots before Release")
		}
		c.Release()
		if p.Free() != g.Slots {
			t.Fatalf("Free = %d after release", p.Free())
		}
	}
}

// Pending counts what was published and not released, and stays within
// the ring when the peer's index is impossible.
func TestPending(t *testing.T) {
	r := mustRing(t, testGeom)
	p, c := r.Producer(nil), r.Consumer()
	for range 3 {
		fill(p.Reserve(), 0)
	}
	if r.Pending() != 0 {
		t.Fatal("reserved entries counted before the commit")
	}
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	c.Peek()
	if r.Pending() != 3 {
		t.Fatalf("pending %d, want 3 (a peeked entry is not released)", r.Pending())
	}
	c.Release()
	if r.Pending() != 2 {
		t.Fatalf("pending %d after a release, want 2", r.Pending())
	}
	r.prod.Store(1 << 40) // a lying producer
	if n := r.Pending(); n != 0 {
		t.Fatalf("pending %d with an impossible index", n)
	}
}

// A consumer armed for solicited entries only is rung by the first commit
// marked solicited, once; one armed for any entry by the next commit.
func TestWakeSolicited(t *testing.T) {
	r := mustRing(t, testGeom)
	db := mustDoorbell(t)
	p, c := r.Producer(db), r.Consumer()
	post := func(solicited bool) bool {
		fill(p.Reserve(), 0)
		rang, err := p.CommitSolicited(solicited)
		if err != nil {
			t.Fatal(err)
		}
		for c.Peek() != nil {
		}
		c.Release()
		return rang
	}
	if !c.ArmFor(WakeSolicited) {
		t.Fatal("ArmFor reported entries in an empty ring")
	}
	for i := range 2 {
		if post(false) {
			t.Fatalf("rang a solicited-only consumer for unsolicited entries (batch %d)", i)
		}
	}
	if !post(true) {
		t.Fatal("did not ring a solicited-only consumer for a solicited entry")
	}
	if post(true) {
		t.Fatal("rang twice for one arming")
	}
	c.ArmFor(WakeAny)
	if !post(false) {
		t.Fatal("did not ring a consumer armed for any entry")
	}
	c.ArmFor(WakeSolicited)
	c.ArmFor(WakeAny) // re-armed wider before anything came
	if !post(false) {
		t.Fatal("a consumer re-armed for any entry was not rung")
	}
	if rung, err := db.Wait(0); !rung || err != nil {
		t.Fatalf("doorbell not rung: %v %v", rung, err)
	}
}

func TestWakeupOnlyWhenArmed(t *testing.T) {
	r := mustRing(t, testGeom)
	db := mustDoorbell(t)
	p, c := r.Producer(db), r.Consumer()
	post := func() bool {
		fill(p.Reserve(), 0)
		rang, err := p.Commit()
		if err != nil {
			t.Fatal(err)
		}
		return rang
	}
	if post() {
		t.Fatal("rang while the consumer was not sleeping")
	}
	if c.Arm() {
		t.Fatal("Arm reported an empty ring with an entry in it")
	}
	c.Disarm()
	for c.Peek() != nil {
	}
	c.Release()
	if !c.Arm() {
		t.Fatal("Arm reported entries in an empty ring")
	}
	if !post() {
		t.Fatal("did not ring an armed consumer")
	}
	if post() {
		t.Fatal("rang twice for one sleep")
	}
	if rung, err := db.Wait(0); !rung || err != nil {
		t.Fatalf("doorbell not rung: %v %v", rung, err)
	}
	if rung, _ := db.Wait(0); rung {
		t.Fatal("doorbell still set after Wait")
	}
	if p.Doorbells != 1 {
		t.Fatalf("Doorbells = %d, want 1", p.Doorbells)
	}
}

func TestHostileIndexes(t *testing.T) {
	r := mustRing(t, Geometry{SlotSize: 8, Slots: 8})
	c := r.Consumer()
	r.prod.Store(9) // producer claims more entries than slots
	if c.Peek() != nil || !errors.Is(c.Err(), ErrCorrupt) {
		t.Fatalf("consumer accepted prod=9: %v", c.Err())
	}

	r2 := mustRing(t, Geometry{SlotSize: 8, Slots: 8})
	p := r2.Producer(nil)
	for i := 0; i < 8; i++ {
		p.Reserve()
	}
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	r2.cons.Store(100) // consumer claims to have read what was never written
	if p.Reserve() != nil || !errors.Is(p.Err(), ErrCorrupt) {
		t.Fatalf("producer accepted cons=100: %v", p.Err())
	}

	r3 := mustRing(t, Geometry{SlotSize: 8, Slots: 8})
	p3, c3 := r3.Producer(nil), r3.Consumer()
	for i := 0; i < 4; i++ {
		p3.Reserve()
	}
	if _, err := p3.Commit(); err != nil {
		t.Fatal(err)
	}
	for c3.Peek() != nil {
	}
	r3.prod.Store(2) // producer index moving backwards
	if c3.Peek() != nil || !errors.Is(c3.Err(), ErrCorrupt) {
		t.Fatalf("consumer accepted a backwards prod: %v", c3.Err())
	}
}

func TestMapChecks(t *testing.T) {
	r := mustRing(t, testGeom)
	dup := func() int {
		fd, err := unix.Dup(r.FD())
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	m, err := Map(dup(), testGeom)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := Map(dup(), Geometry{SlotSize: 64, Slots: 128}); err == nil {
		t.Fatal("Map accepted a geometry that differs from the header")
	}
	if _, err := Map(dup(), Geometry{SlotSize: 128, Slots: 256}); err == nil {
		t.Fatal("Map accepted a geometry larger than the file")
	}
	// An unsealed memfd could be truncated under the mapping: refused.
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(testGeom.Size())); err != nil {
		t.Fatal(err)
	}
	if _, err := Map(fd, testGeom); err == nil {
		t.Fatal("Map accepted an unsealed memfd")
	}
	// Data written through one mapping is seen through the other.
	p, c := r.Producer(nil), m.Consumer()
	fill(p.Reserve(), 42)
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := c.Peek(); s == nil || check(s, 42) != nil {
		t.Fatal("second mapping does not see the slot")
	}
}

// TestConcurrent runs producer and consumer goroutines on one mapping; under
// -race it checks that slot contents are ordered by the index atomics.
func TestConcurrent(t *testing.T) {
	r := mustRing(t, Geometry{SlotSize: 32, Slots: 16})
	db := mustDoorbell(t)
	const n = 20000
	p, c := r.Producer(db), r.Consumer()
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var want uint64
		idle := 0
		for want < n {
			s := c.Peek()
			if s == nil {
				c.Release()
				if idle++; idle > 64 {
					if err := c.Sleep(db, 100*time.Millisecond); err != nil {
						errc <- err
						return
					}
					idle = 0
				}
				continue
			}
			idle = 0
			if err := check(s, want); err != nil {
				errc <- err
				return
			}
			want++
		}
		c.Release()
		errc <- nil
	}()
	deadline := time.Now().Add(time.Minute)
	for seq := uint64(0); seq < n; {
		s := p.Reserve()
		if s == nil {
			if _, err := p.Commit(); err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("producer stuck")
			}
			continue
		}
		fill(s, seq)
		seq++
		if seq%7 == 0 {
			if _, err := p.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestZeroAllocs(t *testing.T) {
	r := mustRing(t, testGeom)
	db := mustDoorbell(t)
	p, c := r.Producer(db), r.Consumer()
	allocs := testing.AllocsPerRun(1000, func() {
		for i := 0; i < 8; i++ {
			fill(p.Reserve(), uint64(i))
		}
		if _, err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		for s := c.Peek(); s != nil; s = c.Peek() {
		}
		c.Release()
		// one armed round: the producer rings, the consumer drains
		c.Arm()
		p.Reserve()
		if _, err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Drain(); err != nil {
			t.Fatal(err)
		}
		c.Disarm()
		c.Peek()
		c.Release()
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per post/poll round", allocs)
	}
}

// childFiles are the fds a child gets: fd 3 ring to child, fd 4 ring to
// parent, fd 5 the child's doorbell, fd 6 the parent's doorbell.
type pair struct {
	toChild, toParent *Ring
	childDB, parentDB *Doorbell
	cmd               *exec.Cmd
}

func startChild(t testing.TB, role string, g Geometry, spin int) *pair {
	t.Helper()
	pr := &pair{toChild: mustRing(t, g), toParent: mustRing(t, g), childDB: mustDoorbell(t), parentDB: mustDoorbell(t)}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHMRING_CHILD="+role,
		"SHMRING_SLOTSIZE="+strconv.Itoa(g.SlotSize), "SHMRING_SLOTS="+strconv.Itoa(g.Slots),
		"SHMRING_SPIN="+strconv.Itoa(spin))
	for _, fd := range []int{pr.toChild.FD(), pr.toParent.FD(), pr.childDB.FD(), pr.parentDB.FD()} {
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(fd), "inherited"))
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.cmd = cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return pr
}

// stop sends the terminator (seq = ^0) and waits for the child to exit 0.
func (pr *pair) stop(t testing.TB) {
	p := pr.toChild.Producer(pr.childDB)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s := p.Reserve(); s != nil {
			binary.LittleEndian.PutUint64(s, ^uint64(0))
			if _, err := p.Commit(); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("could not send the terminator")
		}
		time.Sleep(time.Millisecond)
	}
	if err := pr.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

func child(role string) int {
	slotSize, _ := strconv.Atoi(os.Getenv("SHMRING_SLOTSIZE"))
	slots, _ := strconv.Atoi(os.Getenv("SHMRING_SLOTS"))
	spin, _ := strconv.Atoi(os.Getenv("SHMRING_SPIN"))
	g := Geometry{SlotSize: slotSize, Slots: slots}
	in, err := Map(3, g)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	out, err := Map(4, g)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	myDB, parentDB := DoorbellFD(5), DoorbellFD(6)
	c, p := in.Consumer(), out.Producer(parentDB)
	deadline := time.Now().Add(2 * time.Minute) // bound: a lost parent never leaves a child behind for long
	var count uint64
	idle := 0
	for time.Now().Before(deadline) {
		s := c.Peek()
		if s == nil {
			c.Release()
			if role == "sink" && count > 0 {
				// report progress: one slot carrying the running count
				if o := p.Reserve(); o != nil {
					binary.LittleEndian.PutUint64(o, count)
					if _, err := p.Commit(); err != nil {
						fmt.Fprintln(os.Stderr, "child:", err)
						return 1
					}
				}
			}
			if idle++; idle > spin {
				if err := c.Sleep(myDB, 100*time.Millisecond); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					return 1
				}
				idle = 0
			}
			continue
		}
		idle = 0
		if binary.LittleEndian.Uint64(s) == ^uint64(0) {
			c.Release()
			return 0
		}
		switch role {
		case "echo":
			var o []byte
			for o = p.Reserve(); o == nil; o = p.Reserve() {
				if p.Err() != nil || time.Now().After(deadline) {
					fmt.Fprintln(os.Stderr, "child: cannot echo:", p.Err())
					return 1
				}
				if _, err := p.Commit(); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					return 1
				}
			}
			copy(o, s)
			if c.Len() == 0 { // end of the batch: publish the echoes together
				if _, err := p.Commit(); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					return 1
				}
			}
		case "sink":
			if err := check(s, count); err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
				return 1
			}
			count++
		}
	}
	fmt.Fprintln(os.Stderr, "child: deadline")
	return 1
}

// exchange streams n messages to an echoing child with at most window in
// flight and verifies every echo.
func exchange(t testing.TB, pr *pair, n, window, batch int, sleep bool) {
	p := pr.toChild.Producer(pr.childDB)
	c := pr.toParent.Consumer()
	var sent, recv uint64
	deadline := time.Now().Add(time.Minute)
	idle := 0
	for recv < uint64(n) {
		progressed := false
		for sent < uint64(n) && sent-recv < uint64(window) {
			s := p.Reserve()
			if s == nil {
				break
			}
			fill(s, sent)
			sent++
			progressed = true
			if sent%uint64(batch) == 0 {
				if _, err := p.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		for s := c.Peek(); s != nil; s = c.Peek() {
			if err := check(s, recv); err != nil {
				t.Fatal(err)
			}
			recv++
			progressed = true
		}
		c.Release()
		if c.Err() != nil {
			t.Fatal(c.Err())
		}
		if progressed {
			idle = 0
			continue
		}
		if idle++; sleep || idle > 1000 {
			if err := c.Sleep(pr.parentDB, 50*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			idle = 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("stuck: sent %d, received %d", sent, recv)
		}
	}
}

func TestCrossProcessEcho(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spin  int
		sleep bool
	}{{"sleeping", 0, true}, {"polling", 1 << 12, false}} {
		t.Run(tc.name, func(t *testing.T) {
			pr := startChild(t, "echo", testGeom, tc.spin)
			exchange(t, pr, 50000, 200, 16, tc.sleep)
			exchange(t, pr, 200, 1, 1, tc.sleep) // strict ping-pong: every post needs a wakeup when sleeping
			pr.stop(t)
		})
	}
}

// BenchmarkPingPong measures one post→poll hop between two processes: the
// parent posts one slot, the child polls it and posts it back. ns/op is the
// round trip; hop-ns is half of it.
func BenchmarkPingPong(b *testing.B) {
	for _, spin := range []int{1 << 16, 0} {
		name := "polling"
		if spin == 0 {
			name = "sleeping"
		}
		b.Run(name, func(b *testing.B) {
			pr := startChild(b, "echo", testGeom, spin)
			exchange(b, pr, 1000, 1, 1, spin == 0) // warm up
			b.ResetTimer()
			start := time.Now()
			exchange(b, pr, b.N+1000, 1, 1, spin == 0)
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(el.Nanoseconds())/float64(b.N)/2, "hop-ns")
			pr.stop(b)
		})
	}
}

// BenchmarkStream measures the one-way rate: the parent posts 64-byte slots
// in batches of 32 as fast as the ring takes them; the child polls and
// verifies each one.
func BenchmarkStream(b *testing.B) {
	pr := startChild(b, "sink", Geometry{SlotSize: 64, Slots: 1024}, 1<<16)
	p := pr.toChild.Producer(pr.childDB)
	c := pr.toParent.Consumer()
	b.ResetTimer()
	start := time.Now()
	var seq, acked uint64
	deadline := time.Now().Add(5 * time.Minute)
	for acked < uint64(b.N) {
		for i := 0; i < 32 && seq < uint64(b.N); i++ {
			s := p.Reserve()
			if s == nil {
				break
			}
			fill(s, seq)
			seq++
		}
		if _, err := p.Commit(); err != nil {
			b.Fatal(err)
		}
		for s := c.Peek(); s != nil; s = c.Peek() {
			acked = binary.LittleEndian.Uint64(s)
		}
		c.Release()
		if time.Now().After(deadline) {
			b.Fatalf("stuck at %d/%d", acked, b.N)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(p.Doorbells), "doorbells")
	pr.stop(b)
}
