package ib

// Access are memory region and QP access flags (ibv_access_flags), valued
// as IBV_ACCESS_*.
type Access uint32

// Access flags.
const (
	LocalWrite   Access = 1 << 0
	RemoteWrite  Access = 1 << 1 // RDMA WRITE into the MR / accepted by the QP
	RemoteRead   Access = 1 << 2 // RDMA READ from the MR / served by the QP
	RemoteAtomic Access = 1 << 3 // atomics on the MR / served by the QP

	// KnownAccess are the flags softrnic implements; others are refused.
	KnownAccess = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic
)

// Valid reports whether a names only flags softrnic implements.
func (a Access) Valid() bool { return a&^KnownAccess == 0 }

// ValidForMR reports whether a is valid for a memory region: known flags,
// and remote write or atomic access only with local write (IBA 10.6.3.1).
func (a Access) ValidForMR() bool {
	return a.Valid() && (a&(RemoteWrite|RemoteAtomic) == 0 || a&LocalWrite != 0)
}
