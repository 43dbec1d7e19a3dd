package daemon

import (
	"testing"

	"golang.org/x/sys/unix"
)

// After detach, the daemon's view of a deregistered MR is private memory:
// reads see zeros, writes do not reach the client, nothing faults.
func TestDetachCutsTheClientOff(t *testing.T) {
	fd, err := unix.MemfdCreate("mr", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 8192); err != nil {
		t.Fatal(err)
	}
	client, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(client)
	daemon, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(client, "client data")
	if string(daemon[:11]) != "client data" {
		t.Fatal("mappings not shared")
	}
	if err := detach(daemon); err != nil {
		t.Fatal(err)
	}
	if daemon[0] != 0 || daemon[8191] != 0 {
		t.Fatal("detached mapping still shows client memory")
	}
	copy(daemon, "stale write")
	copy(client[100:], "later")
	if string(client[:11]) != "client data" || daemon[100] != 0 {
		t.Fatal("detached mapping still connected to the client")
	}
	if err := unix.Munmap(daemon); err != nil {
		t.Fatal(err)
	}
}
