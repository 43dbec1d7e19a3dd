package proto

// The C declarations of this protocol (and of the shared-memory rings and
// the work request vocabulary it carries), for the C libraries.
//go:generate go run ../../internal/cgen -o ../../c/include/softrnic_proto.h . ../../internal/shmring=RING ../../ib=IB
