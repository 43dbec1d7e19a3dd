package client

import "unsafe"

// uintptrOf is the address of b's first byte. The memory is an mmap, never
// moved by the Go runtime, so the address is stable for the mapping's life.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
