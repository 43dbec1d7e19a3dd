package rnic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// AH is an address handle for UD sends (ibv_ah), with its frame header
// prepared once.
type AH struct {
	pd  *PD
	ah  ib.AH
	hdr frame.Template
}

var _ verbs.AH = (*AH)(nil)

// AV is the address vector the AH was made from, its DMAC resolved.
func (a *AH) AV() ib.AddressVector { return a.ah.AV }

// Destroy releases the AH (ibv_destroy_ah). A UD WR posted with it before
// is sent as it was framed.
func (a *AH) Destroy() error { return nil }

// CreateAH creates an address handle (ibv_create_ah). Without a DMAC in
// av, the device's resolver finds the next hop.
func (pd *PD) CreateAH(attr *ib.AddressVector) (verbs.AH, error) {
	av := *attr
	if err := pd.dev.checkAV(&av); err != nil {
		return nil, fmt.Errorf("rnic: address handle: %w: %w", err, verbs.ErrInvalid)
	}
	mac, err := pd.dev.destMAC(&av)
	if err != nil {
		return nil, fmt.Errorf("rnic: address handle: %w: %w", err, verbs.ErrInvalid)
	}
	av.DMAC = mac
	a := &AH{pd: pd, hdr: pd.dev.makeHdr(&av, mac, 0, 0)}
	a.ah = ib.AH{AV: av, Header: a.hdr.Bytes()}
	return a, nil
}

// destMAC returns the next hop's MAC for av: its DMAC, or else what the
// device's resolver finds for its DGID.
func (d *Device) destMAC(av *ib.AddressVector) ([6]byte, error) {
	if av.DMAC != ([6]byte{}) {
		return av.DMAC, nil
	}
	dst := av.DGID.Addr()
	if !dst.IsValid() {
		return [6]byte{}, errors.New("no destination GID")
	}
	if d.isLocal(dst) {
		return d.cfg.MAC, nil // loopback (loop.go)
	}
	if d.cfg.Resolve == nil {
		return [6]byte{}, fmt.Errorf("no MAC for %v and no neighbour resolution", dst)
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	mac, err := d.cfg.Resolve(ctx, dst)
	if err != nil {
		return mac, fmt.Errorf("no route to %v: %w", dst, err)
	}
	return mac, nil
}

// checkAV checks an address vector against the GID table.
func (d *Device) checkAV(av *ib.AddressVector) error {
	if int(av.SGIDIndex) >= len(d.cfg.Addrs) {
		return fmt.Errorf("source GID index %d, the table has %d", av.SGIDIndex, len(d.cfg.Addrs))
	}
	src, dst := d.cfg.Addrs[av.SGIDIndex], av.DGID.Addr()
	if !dst.IsValid() || dst.IsUnspecified() {
		return errors.New("no destination GID")
	}
	if src.Is4() != dst.Is4() {
		return fmt.Errorf("destination %v and source GID %v differ in IP version", dst, src)
	}
	return nil
}

// resolveTimeout bounds the neighbour resolution of a Modify or CreateAH.
const resolveTimeout = 3 * time.Second
