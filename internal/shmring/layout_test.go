package shmring

import (
	"encoding/binary"
	"reflect"
	"testing"
)

func TestHeaderDeclaration(t *testing.T) {
	if n := binary.Size(Header{}); n != HeaderSize {
		t.Fatalf("Header is %d bytes, want %d", n, HeaderSize)
	}
	want := map[string]uintptr{"Magic": offMagic, "Version": offVersion, "SlotSize": offSlotSize, "Slots": offSlots,
		"Prod": offProd, "Cons": offCons, "Wakeup": offWakeup}
	typ := reflect.TypeOf(Header{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if off, ok := want[f.Name]; ok && f.Offset != off {
			t.Errorf("%s at %d, the ring has it at %d", f.Name, f.Offset, off)
		}
		delete(want, f.Name)
	}
	if len(want) != 0 {
		t.Errorf("Header lacks %v", want)
	}
}
