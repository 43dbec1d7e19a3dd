package rocelayers

import (
	"testing"

	"github.com/gopacket/gopacket"

	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

// FuzzParseBTHLayer decodes arbitrary UDP payloads as the gopacket BTH
// layer, seeded with the UDP payloads of the captures: it must never panic,
// and what it accepts must tile the input exactly.
func FuzzParseBTHLayer(f *testing.F) {
	n := 0
	for _, c := range frametest.Seeds() {
		for _, b := range c.Frames {
			var fr frame.Frame
			if frame.Parse(b, &fr) == nil && n < 200 && len(b) < 1500 {
				f.Add(fr.Packet()[len(fr.Packet())-int(fr.UDP().Length())+8:])
				n++
			}
		}
	}
	f.Add([]byte{0x81, 0, 0xff, 0xff, 0x40, 0, 1, 0x18, 0, 0, 0, 0, 15: 0, 31: 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var l BTH
		if err := l.DecodeFromBytes(data, gopacket.NilDecodeFeedback); err != nil {
			return
		}
		if got := len(l.Contents) + len(l.Payload) + len(l.Pad) + 4; got != len(data) {
			t.Fatalf("layer covers %d of %d bytes", got, len(data))
		}
		if l.Opcode.HeaderLen() != len(l.Contents) || len(l.Pad) != l.PadCount {
			t.Fatalf("%v: headers %d, pad %d", l.Opcode, len(l.Contents), len(l.Pad))
		}
	})
}
