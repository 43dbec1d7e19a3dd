package perftest

import "bytes"

// StockSecondConnectRace reports whether the output of a stock perftest
// client run with -R shows perftest's own race rather than a fault of
// either end. After the control connection, the client connects the
// test's QPs while the server only then creates its second listener
// (create_rdma_cm_connection in perftest 4.5-0.17, Debian's, and upstream
// since), so the request may arrive first and be refused as a kernel CM
// refuses it: REJ reason 8, or SIDR status 1 (UNREACHABLE) for UD. perftest
// then retries from state it has just freed (rdma_cm_client_connection
// after rdma_cm_destroy_cma) and usually dies of it. Only a new run of both
// sides can pass. The signature is the refusal followed by the failed
// connection of the test's QPs.
func StockSecondConnectRace(out []byte) bool {
	refused := bytes.Contains(out, []byte("Event: RDMA_CM_EVENT_REJECTED; error: 8.")) ||
		bytes.Contains(out, []byte("Event: RDMA_CM_EVENT_UNREACHABLE; error: 1."))
	return refused && bytes.Contains(out, []byte("Failed to connect RDMA CM events."))
}
