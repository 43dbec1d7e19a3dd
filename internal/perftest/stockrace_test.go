package perftest

import "testing"

func TestStockSecondConnectRace(t *testing.T) {
	for _, c := range []struct {
		name string
		out  string
		race bool
	}{
		// A CI run's client, ib_send_lat -R (it then died of SIGSEGV).
		{"rejected", "RDMA CM event error:\nEvent: RDMA_CM_EVENT_REJECTED; error: 8.\n\nERRNO: Resource temporarily unavailable.\n" +
			"Failed to handle RDMA CM event.\nERRNO: Resource temporarily unavailable.\nFailed to connect RDMA CM events.\n" +
			"ERRNO: Resource temporarily unavailable.\n", true},
		{"sidr", "RDMA CM event error:\nEvent: RDMA_CM_EVENT_UNREACHABLE; error: 1.\n\nERRNO: Success.\n" +
			"Failed to handle RDMA CM event.\nERRNO: Success.\nFailed to connect RDMA CM events.\n", true},
		// The control connection refused: the server is not listening at
		// all yet, which the client reports and exits; not the race.
		{"control", "Unexpected CM event bl blka 8\n Unable to perform rdma_client function\n Unable to init the socket connection\n", false},
		// A SIDR request nobody answered (ETIMEDOUT) is a fault, not the race.
		{"sidr-timeout", "RDMA CM event error:\nEvent: RDMA_CM_EVENT_UNREACHABLE; error: -110.\n" +
			"Failed to handle RDMA CM event.\nFailed to connect RDMA CM events.\n", false},
		// Another REJ reason (consumer reject) is an answer, not the race.
		{"other-reason", "RDMA CM event error:\nEvent: RDMA_CM_EVENT_REJECTED; error: 28.\nFailed to connect RDMA CM events.\n", false},
		{"clean", " #bytes     #iterations    t_min[usec]\n", false},
	} {
		if got := StockSecondConnectRace([]byte(c.out)); got != c.race {
			t.Errorf("%s: StockSecondConnectRace = %v, want %v", c.name, got, c.race)
		}
	}
}
