// Package pa is a protocol fragment for cgen's tests.
package pa

// Inner is embedded by another package's struct; encoding/binary packs it
// in 5 bytes, C would pad it to 8.
type Inner struct {
	A uint8
	B uint32 // at 1
}
