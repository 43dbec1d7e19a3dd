package daemon_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/rdmacm"
)

// TestDaemonCMRejectsBeforeAnyClient: the daemon's rdma_cm agent runs from
// the moment the daemon serves, so a peer's REQ for a port no client
// listens on gets REJ "invalid service ID" (reason 8), as from the kernel
// CM, though no client ever made a CM call. Before, the agent started on a
// client's first CM call and such a REQ went unanswered: the peer waited
// out its REQ retries (about a minute) instead of being refused. The
// 15-second bound is far below those retries and far above a REQ/REJ
// exchange on a loaded machine.
func TestDaemonCMRejectsBeforeAnyClient(t *testing.T) {
	_, devB, _ := twoDevices(t)
	peer, err := rdmacm.New(rdmacm.Config{Device: devB, Resolve: func(context.Context, netip.Addr) ([6]byte, error) { return macA, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	pd := devB.AllocPD()
	cq := devB.CreateCQ(16)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err = peer.Dial(ctx, addrA, 4242, &rdmacm.ConnParams{PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSGE: 1})
	var rej *rdmacm.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("REQ to the daemon's device, no listener: got %v, want REJ reason 8", err)
	}
	if rej.Reason != cm.RejInvalidServiceID || uint16(rej.Reason) != 8 {
		t.Fatalf("REJ reason %d, want 8 (invalid service ID)", uint16(rej.Reason))
	}
}
