package cm

import "encoding/binary"

// Every CM message below is decoded into and encoded from a plain struct of
// its fields (value types only, so neither direction allocates). Offsets are
// relative to the start of the CM data, i.e. MAD byte 24, as in IBA ch. 12
// and the kernel's ibta_vol1_c12.h. Reserved bits are written as zero.

// Private-data sizes of each message.
const (
	REQPrivateSize     = 92
	REPPrivateSize     = 196
	RTUPrivateSize     = 224
	REJPrivateSize     = 148
	REJARISize         = 72
	MRAPrivateSize     = 222
	DREQPrivateSize    = 220
	DREPPrivateSize    = 224
	SIDRREQPrivateSize = 216
	SIDRREPPrivateSize = 136
	SIDRREPInfoSize    = 72
)

// Transport service types of a REQ.
const (
	TransportRC = 0
	TransportUC = 1
	TransportRD = 2
)

// Path is one path (primary or alternate) of a REQ.
type Path struct {
	LocalLID, RemoteLID uint16 // 0xFFFF (permissive) on RoCE
	LocalGID, RemoteGID GID
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 µs × 2^t
}

func decodePath(d []byte, off int, p *Path) {
	p.LocalLID = binary.BigEndian.Uint16(d[off:])
	p.RemoteLID = binary.BigEndian.Uint16(d[off+2:])
	copy(p.LocalGID[:], d[off+4:])
	copy(p.RemoteGID[:], d[off+20:])
	p.FlowLabel = binary.BigEndian.Uint32(d[off+36:]) >> 12
	p.PacketRate = getBits(d, off+39, 0, 6)
	p.TrafficClass = d[off+40]
	p.HopLimit = d[off+41]
	p.SL = getBits(d, off+42, 4, 4)
	p.SubnetLocal = getBits(d, off+42, 3, 1) != 0
	p.LocalACKTimeout = getBits(d, off+43, 3, 5)
}

func encodePath(d []byte, off int, p *Path) {
	binary.BigEndian.PutUint16(d[off:], p.LocalLID)
	binary.BigEndian.PutUint16(d[off+2:], p.RemoteLID)
	copy(d[off+4:], p.LocalGID[:])
	copy(d[off+20:], p.RemoteGID[:])
	binary.BigEndian.PutUint32(d[off+36:], (p.FlowLabel&0xFFFFF)<<12)
	putBits(d, off+39, 0, 6, p.PacketRate)
	d[off+40] = p.TrafficClass
	d[off+41] = p.HopLimit
	putBits(d, off+42, 4, 4, p.SL)
	putBits(d, off+42, 3, 1, b2u(p.SubnetLocal))
	putBits(d, off+43, 3, 5, p.LocalACKTimeout)
}

// REQ is the ConnectRequest (IBA table 106): the active side's offer of a
// connection between its QP and a QP of the passive side's service.
type REQ struct {
	LocalCommID             uint32
	VendorID                uint32 // 24 bits, ECE
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8  // RDMA READ/atomics the sender accepts as responder
	LocalEECN               uint32
	InitiatorDepth          uint8 // RDMA READ/atomics the sender will have outstanding
	RemoteEECN              uint32
	RemoteCMResponseTimeout uint8 // 5 bits: how long the passive side may take to answer
	TransportServiceType    uint8 // 2 bits: TransportRC…
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits: the first PSN the sender will send
	LocalCMResponseTimeout  uint8  // 5 bits: how long the sender takes to answer
	RetryCount              uint8  // 3 bits: transport retries
	PKey                    uint16
	PathMTU                 uint8 // 4 bits: IB MTU enum (1=256 … 5=4096)
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary, Alternate      Path
	SAPSupported            bool
	PrivateData             [REQPrivateSize]byte
}

// Decode fills r from the CM data d (MAD.Data()).
func (r *REQ) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.VendorID = get24(d, 5)
	r.ServiceID = binary.BigEndian.Uint64(d[8:])
	r.LocalCAGUID = binary.BigEndian.Uint64(d[16:])
	r.LocalQKey = binary.BigEndian.Uint32(d[28:])
	r.LocalQPN = get24(d, 32)
	r.ResponderResources = d[35]
	r.LocalEECN = get24(d, 36)
	r.InitiatorDepth = d[39]
	r.RemoteEECN = get24(d, 40)
	r.RemoteCMResponseTimeout = getBits(d, 43, 3, 5)
	r.TransportServiceType = getBits(d, 43, 1, 2)
	r.EndToEndFlowControl = getBits(d, 43, 0, 1) != 0
	r.StartingPSN = get24(d, 44)
	r.LocalCMResponseTimeout = getBits(d, 47, 3, 5)
	r.RetryCount = getBits(d, 47, 0, 3)
	r.PKey = binary.BigEndian.Uint16(d[48:])
	r.PathMTU = getBits(d, 50, 4, 4)
	r.RDCExists = getBits(d, 50, 3, 1) != 0
	r.RNRRetryCount = getBits(d, 50, 0, 3)
	r.MaxCMRetries = getBits(d, 51, 4, 4)
	r.SRQ = getBits(d, 51, 3, 1) != 0
	r.ExtendedTransportType = getBits(d, 51, 0, 3)
	decodePath(d, 52, &r.Primary)
	decodePath(d, 96, &r.Alternate)
	r.SAPSupported = getBits(d, 139, 2, 1) != 0
	copy(r.PrivateData[:], d[140:])
}

// Encode writes r into the CM data d, clearing reserved bits.
func (r *REQ) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	put24(d, 5, r.VendorID)
	binary.BigEndian.PutUint64(d[8:], r.ServiceID)
	binary.BigEndian.PutUint64(d[16:], r.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], r.LocalQKey)
	put24(d, 32, r.LocalQPN)
	d[35] = r.ResponderResources
	put24(d, 36, r.LocalEECN)
	d[39] = r.InitiatorDepth
	put24(d, 40, r.RemoteEECN)
	putBits(d, 43, 3, 5, r.RemoteCMResponseTimeout)
	putBits(d, 43, 1, 2, r.TransportServiceType)
	putBits(d, 43, 0, 1, b2u(r.EndToEndFlowControl))
	put24(d, 44, r.StartingPSN)
	putBits(d, 47, 3, 5, r.LocalCMResponseTimeout)
	putBits(d, 47, 0, 3, r.RetryCount)
	binary.BigEndian.PutUint16(d[48:], r.PKey)
	putBits(d, 50, 4, 4, r.PathMTU)
	putBits(d, 50, 3, 1, b2u(r.RDCExists))
	putBits(d, 50, 0, 3, r.RNRRetryCount)
	putBits(d, 51, 4, 4, r.MaxCMRetries)
	putBits(d, 51, 3, 1, b2u(r.SRQ))
	putBits(d, 51, 0, 3, r.ExtendedTransportType)
	encodePath(d, 52, &r.Primary)
	encodePath(d, 96, &r.Alternate)
	putBits(d, 139, 2, 1, b2u(r.SAPSupported))
	copy(d[140:], r.PrivateData[:])
}

// REP is the ConnectReply (IBA table 110): the passive side accepts and
// names its QP and starting PSN.
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	LocalEECN                 uint32 // 24 bits
	StartingPSN               uint32 // 24 bits
	VendorID                  uint32 // 24 bits, ECE, spread over bytes 15, 19, 23
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [REPPrivateSize]byte
}

// Decode fills r from the CM data d.
func (r *REP) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	r.LocalQKey = binary.BigEndian.Uint32(d[8:])
	r.LocalQPN = get24(d, 12)
	r.LocalEECN = get24(d, 16)
	r.StartingPSN = get24(d, 20)
	r.VendorID = uint32(d[15])<<16 | uint32(d[19])<<8 | uint32(d[23])
	r.ResponderResources = d[24]
	r.InitiatorDepth = d[25]
	r.TargetACKDelay = getBits(d, 26, 3, 5)
	r.FailoverAccepted = getBits(d, 26, 1, 2)
	r.EndToEndFlowControl = getBits(d, 26, 0, 1) != 0
	r.RNRRetryCount = getBits(d, 27, 5, 3)
	r.SRQ = getBits(d, 27, 4, 1) != 0
	r.LocalCAGUID = binary.BigEndian.Uint64(d[28:])
	copy(r.PrivateData[:], d[36:])
}

// Encode writes r into the CM data d.
func (r *REP) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], r.LocalQKey)
	put24(d, 12, r.LocalQPN)
	put24(d, 16, r.LocalEECN)
	put24(d, 20, r.StartingPSN)
	d[15], d[19], d[23] = byte(r.VendorID>>16), byte(r.VendorID>>8), byte(r.VendorID)
	d[24] = r.ResponderResources
	d[25] = r.InitiatorDepth
	putBits(d, 26, 3, 5, r.TargetACKDelay)
	putBits(d, 26, 1, 2, r.FailoverAccepted)
	putBits(d, 26, 0, 1, b2u(r.EndToEndFlowControl))
	putBits(d, 27, 5, 3, r.RNRRetryCount)
	putBits(d, 27, 4, 1, b2u(r.SRQ))
	binary.BigEndian.PutUint64(d[28:], r.LocalCAGUID)
	copy(d[36:], r.PrivateData[:])
}

// RTU is ReadyToUse (IBA table 111): the active side's QP is ready.
type RTU struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [RTUPrivateSize]byte
}

func (r *RTU) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	copy(r.PrivateData[:], d[8:])
}

func (r *RTU) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	copy(d[8:], r.PrivateData[:])
}

// DREQ is DisconnectRequest (IBA table 112).
type DREQ struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32 // 24 bits: the receiver's QP
	PrivateData               [DREQPrivateSize]byte
}

func (r *DREQ) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	r.RemoteQPN = get24(d, 8)
	copy(r.PrivateData[:], d[12:])
}

func (r *DREQ) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	put24(d, 8, r.RemoteQPN)
	copy(d[12:], r.PrivateData[:])
}

// DREP is DisconnectReply (IBA table 113).
type DREP struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [DREPPrivateSize]byte
}

func (r *DREP) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	copy(r.PrivateData[:], d[8:])
}

func (r *DREP) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	copy(d[8:], r.PrivateData[:])
}

// Which message an MRA or REJ refers to.
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2 // LAP for MRA; "other" for REJ
)

// MRA is MessageReceiptAcknowledgement (IBA table 107): "I got your message
// and need ServiceTimeout more to answer; stop retransmitting".
type MRA struct {
	LocalCommID, RemoteCommID uint32
	MessageMRAed              uint8 // 2 bits: MsgREQ, MsgREP, MsgOther (LAP)
	ServiceTimeout            uint8 // 5 bits
	PrivateData               [MRAPrivateSize]byte
}

func (r *MRA) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	r.MessageMRAed = getBits(d, 8, 6, 2)
	r.ServiceTimeout = getBits(d, 9, 3, 5)
	copy(r.PrivateData[:], d[10:])
}

func (r *MRA) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	putBits(d, 8, 6, 2, r.MessageMRAed)
	putBits(d, 9, 3, 5, r.ServiceTimeout)
	copy(d[10:], r.PrivateData[:])
}

// RejectReason is the Reason field of a REJ (IBA table 109).
type RejectReason uint16

// Reject reasons used or met by this package.
const (
	RejNoQP                      RejectReason = 1
	RejNoEEC                     RejectReason = 2
	RejNoResources               RejectReason = 3
	RejTimeout                   RejectReason = 4
	RejUnsupported               RejectReason = 5
	RejInvalidCommID             RejectReason = 6
	RejInvalidCommInstance       RejectReason = 7
	RejInvalidServiceID          RejectReason = 8
	RejInvalidTransportType      RejectReason = 9
	RejStaleConn                 RejectReason = 10
	RejInvalidGID                RejectReason = 12
	RejInvalidMTU                RejectReason = 26
	RejInsufficientRespResources RejectReason = 27
	RejConsumerDefined           RejectReason = 28
	RejInvalidRNRRetry           RejectReason = 29
	RejDuplicateLocalCommID      RejectReason = 30
	RejInvalidClassVersion       RejectReason = 31
	RejVendorOptionNotSupported  RejectReason = 35
)

var rejNames = map[RejectReason]string{
	RejNoQP: "no QP", RejNoEEC: "no EEC", RejNoResources: "no resources", RejTimeout: "timeout",
	RejUnsupported: "unsupported", RejInvalidCommID: "invalid comm ID",
	RejInvalidCommInstance: "invalid comm instance", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport type", RejStaleConn: "stale connection",
	RejInvalidGID: "invalid GID", RejInvalidMTU: "invalid MTU",
	RejInsufficientRespResources: "insufficient responder resources",
	RejConsumerDefined:           "consumer defined", RejInvalidRNRRetry: "invalid RNR retry",
	RejDuplicateLocalCommID: "duplicate local comm ID", RejInvalidClassVersion: "invalid class version",
	RejVendorOptionNotSupported: "vendor option not supported",
}

func (r RejectReason) String() string {
	if s, ok := rejNames[r]; ok {
		return s
	}
	return "reason " + hex16(uint16(r))
}

// REJ is Reject (IBA table 108).
type REJ struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	RejectedInfoLength        uint8 // 7 bits: bytes of ARI used
	Reason                    RejectReason
	ARI                       [REJARISize]byte // additional rejection information
	PrivateData               [REJPrivateSize]byte
}

func (r *REJ) Decode(d []byte) {
	_ = d[DataSize-1]
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	r.MessageRejected = getBits(d, 8, 6, 2)
	r.RejectedInfoLength = getBits(d, 9, 1, 7)
	r.Reason = RejectReason(binary.BigEndian.Uint16(d[10:]))
	copy(r.ARI[:], d[12:])
	copy(r.PrivateData[:], d[84:])
}

func (r *REJ) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	putBits(d, 8, 6, 2, r.MessageRejected)
	putBits(d, 9, 1, 7, r.RejectedInfoLength)
	binary.BigEndian.PutUint16(d[10:], uint16(r.Reason))
	copy(d[12:84], r.ARI[:])
	copy(d[84:], r.PrivateData[:])
}

// SIDRREQ is ServiceIDResolutionRequest (IBA table 119): "which UD QP and
// Q_Key serve this service ID?".
type SIDRREQ struct {
	RequestID   uint32
	PKey        uint16
	ServiceID   uint64
	PrivateData [SIDRREQPrivateSize]byte
}

func (r *SIDRREQ) Decode(d []byte) {
	_ = d[DataSize-1]
	r.RequestID = binary.BigEndian.Uint32(d[0:])
	r.PKey = binary.BigEndian.Uint16(d[4:])
	r.ServiceID = binary.BigEndian.Uint64(d[8:])
	copy(r.PrivateData[:], d[16:])
}

func (r *SIDRREQ) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.RequestID)
	binary.BigEndian.PutUint16(d[4:], r.PKey)
	binary.BigEndian.PutUint64(d[8:], r.ServiceID)
	copy(d[16:], r.PrivateData[:])
}

// SIDRStatus is the Status of a SIDR_REP (IBA table 121).
type SIDRStatus uint8

const (
	SIDRSuccess          SIDRStatus = 0
	SIDRUnsupported      SIDRStatus = 1 // service ID not supported
	SIDRReject           SIDRStatus = 2
	SIDRNoQP             SIDRStatus = 3
	SIDRRedirect         SIDRStatus = 4
	SIDRUnsupportedClass SIDRStatus = 5
)

// SIDRREP is ServiceIDResolutionResponse (IBA table 120).
type SIDRREP struct {
	RequestID             uint32
	Status                SIDRStatus
	AdditionalInfoLength  uint8
	VendorID              uint32 // 24 bits, ECE, bytes 6-7 and 11
	QPN                   uint32 // 24 bits
	ServiceID             uint64
	QKey                  uint32
	AdditionalInformation [SIDRREPInfoSize]byte // ClassPortInfo on redirect
	PrivateData           [SIDRREPPrivateSize]byte
}

func (r *SIDRREP) Decode(d []byte) {
	_ = d[DataSize-1]
	r.RequestID = binary.BigEndian.Uint32(d[0:])
	r.Status = SIDRStatus(d[4])
	r.AdditionalInfoLength = d[5]
	r.VendorID = uint32(binary.BigEndian.Uint16(d[6:]))<<8 | uint32(d[11])
	r.QPN = get24(d, 8)
	r.ServiceID = binary.BigEndian.Uint64(d[12:])
	r.QKey = binary.BigEndian.Uint32(d[20:])
	copy(r.AdditionalInformation[:], d[24:])
	copy(r.PrivateData[:], d[96:])
}

func (r *SIDRREP) Encode(d []byte) {
	_ = d[DataSize-1]
	clear(d[:DataSize])
	binary.BigEndian.PutUint32(d[0:], r.RequestID)
	d[4] = uint8(r.Status)
	d[5] = r.AdditionalInfoLength
	binary.BigEndian.PutUint16(d[6:], uint16(r.VendorID>>8))
	put24(d, 8, r.QPN)
	d[11] = byte(r.VendorID)
	binary.BigEndian.PutUint64(d[12:], r.ServiceID)
	binary.BigEndian.PutUint32(d[20:], r.QKey)
	copy(d[24:96], r.AdditionalInformation[:])
	copy(d[96:], r.PrivateData[:])
}
