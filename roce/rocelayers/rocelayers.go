package rocelayers

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/icrc"
)

// LayerTypeBTH is the RoCEv2 transport layer. The number is outside the
// range gopacket uses for its own layers.
var LayerTypeBTH = gopacket.RegisterLayerType(4791, gopacket.LayerTypeMetadata{
	Name:    "BTH",
	Decoder: gopacket.DecodeFunc(decodeBTH),
})

func init() {
	layers.RegisterUDPPortLayerType(4791, LayerTypeBTH)
}

// RETH is the RDMA extended transport header.
type RETH struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// AETH is the ACK extended transport header.
type AETH struct {
	Syndrome uint8
	MSN      uint32
}

// Kind is the syndrome type (ACK, RNR NAK, NAK).
func (a *AETH) Kind() bth.AckKind { return bth.AckKind(a.Syndrome >> 5) }

// Code is the syndrome's low five bits (credit, RNR timer or NAK code).
func (a *AETH) Code() uint8 { return a.Syndrome & 0x1F }

// DETH is the datagram extended transport header.
type DETH struct {
	QKey  uint32
	SrcQP uint32
}

// AtomicETH is the atomic extended transport header.
type AtomicETH struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// FETH is the flush extended transport header.
type FETH struct {
	PlacementType uint8
	Selectivity   uint8
}

// BTH is the decoded RoCEv2 transport layer: the BTH fields and the
// extended headers the opcode carries (nil when absent). Contents is BTH and
// extended headers; Payload is the payload without pad and ICRC.
type BTH struct {
	layers.BaseLayer
	bth.BTHFields

	RETH      *RETH
	AETH      *AETH
	DETH      *DETH
	ImmDt     *uint32
	IETH      *uint32 // R_Key to invalidate
	Atomic    *AtomicETH
	AtomicAck *uint64 // original remote data
	FETH      *FETH

	Pad  []byte
	ICRC uint32 // as stored (little-endian on the wire)
}

// LayerType implements gopacket.Layer.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode implements gopacket.DecodingLayer.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType implements gopacket.DecodingLayer: the payload is opaque.
func (b *BTH) NextLayerType() gopacket.LayerType {
	if len(b.Payload) == 0 {
		return gopacket.LayerTypeZero
	}
	return gopacket.LayerTypePayload
}

// Decoding errors.
var (
	ErrShort   = errors.New("rocelayers: UDP payload shorter than BTH and ICRC")
	ErrOpcode  = errors.New("rocelayers: unknown opcode")
	ErrTVer    = errors.New("rocelayers: TVer is not 0")
	ErrHeaders = errors.New("rocelayers: UDP payload shorter than the opcode's headers and ICRC")
	ErrPad     = errors.New("rocelayers: PadCnt beyond payload")
)

// DecodeFromBytes decodes a UDP payload: BTH, extended headers, payload,
// pad and ICRC.
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	*b = BTH{}
	if len(data) < bth.BTHLen+icrc.Len {
		df.SetTruncated()
		return ErrShort
	}
	h := bth.BTH(data[:bth.BTHLen])
	b.BTHFields = h.Fields()
	op := h.Opcode()
	if b.TVer != 0 {
		return ErrTVer
	}
	if !op.Valid() {
		return fmt.Errorf("%w 0x%02x", ErrOpcode, uint8(op))
	}
	hl := op.HeaderLen()
	if len(data) < hl+icrc.Len {
		df.SetTruncated()
		return ErrHeaders
	}
	at := func(e bth.Ext) []byte {
		if o := op.Offset(e); o >= 0 {
			return data[o:]
		}
		return nil
	}
	if v := at(bth.ExtRETH); v != nil {
		r := bth.RETH(v)
		b.RETH = &RETH{VA: r.VA(), RKey: r.RKey(), DMALen: r.DMALen()}
	}
	if v := at(bth.ExtAETH); v != nil {
		a := bth.AETH(v)
		b.AETH = &AETH{Syndrome: a.Syndrome(), MSN: a.MSN()}
	}
	if v := at(bth.ExtDETH); v != nil {
		d := bth.DETH(v)
		b.DETH = &DETH{QKey: d.QKey(), SrcQP: d.SrcQP()}
	}
	if v := at(bth.ExtImmDt); v != nil {
		x := bth.ImmDt(v).Imm()
		b.ImmDt = &x
	}
	if v := at(bth.ExtIETH); v != nil {
		x := bth.IETH(v).RKey()
		b.IETH = &x
	}
	if v := at(bth.ExtAtomicETH); v != nil {
		a := bth.AtomicETH(v)
		b.Atomic = &AtomicETH{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
	}
	if v := at(bth.ExtAtomicAckETH); v != nil {
		x := bth.AtomicAckETH(v).Orig()
		b.AtomicAck = &x
	}
	if v := at(bth.ExtFETH); v != nil {
		f := bth.FETH(v)
		b.FETH = &FETH{PlacementType: f.PlacementType(), Selectivity: f.Selectivity()}
	}
	end := len(data) - icrc.Len
	rest := end - hl
	if b.PadCount > rest {
		return ErrPad
	}
	b.Contents = data[:hl]
	b.Payload = data[hl : end-b.PadCount]
	b.Pad = data[end-b.PadCount : end]
	b.ICRC = binary.LittleEndian.Uint32(data[end:])
	return nil
}

func decodeBTH(data []byte, p gopacket.PacketBuilder) error {
	b := &BTH{}
	if err := b.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(b)
	if len(b.Payload) == 0 {
		return nil
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}

// VerifyICRC checks the ICRC of a decoded RoCEv2 packet. It needs the IP
// header, which the BTH layer alone does not see, so it takes the whole
// packet. ok is false for a packet without IP, UDP or BTH layers.
func VerifyICRC(p gopacket.Packet) (ok bool, err error) {
	var ip []byte
	switch l := p.NetworkLayer().(type) {
	case *layers.IPv4:
		ip = l.Contents
	case *layers.IPv6:
		ip = l.Contents
	default:
		return false, errors.New("rocelayers: no IPv4 or IPv6 layer")
	}
	u, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if u == nil || p.Layer(LayerTypeBTH) == nil {
		return false, errors.New("rocelayers: no UDP or BTH layer")
	}
	// The IP header, UDP header and UDP payload, contiguous again.
	dgram := make([]byte, 0, len(ip)+len(u.Contents)+len(u.Payload))
	dgram = append(append(append(dgram, ip...), u.Contents...), u.Payload...)
	return icrc.Verify(dgram), nil
}
