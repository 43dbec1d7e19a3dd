package rnic

// PD is a protection domain: MRs and QPs of different PDs cannot touch
// each other.
type PD struct {
	dev *Device
}

// AllocPD creates a protection domain.
func (d *Device) AllocPD() *PD { return &PD{dev: d} }
