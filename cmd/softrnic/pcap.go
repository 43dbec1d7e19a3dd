package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
)

func init() {
	register("pcap", "decode RoCEv2 frames in pcap/pcapng files and check every ICRC", runPcap)
}

func runPcap(args []string) int { return pcapMain(args, os.Stdout, os.Stderr) }

const pcapUsage = `usage: softrnic pcap [--json] FILE...

Decodes every RoCEv2 frame (UDP port 4791 over IPv4 or IPv6, with or without
an 802.1Q tag) in pcap and pcapng captures (Ethernet, Linux cooked v1/v2 or
raw IP link types) and checks its ICRC, which Wireshark does not.

Text mode prints one line per RoCE frame and a summary per file; --json
prints one JSON object per RoCE frame on stdout and the summaries on stderr.
Other frames are skipped and counted.

Exit status: 0 every RoCE frame has a good ICRC; 1 some ICRC is bad or some
RoCE frame is malformed; 2 a file cannot be read.
`

// pcapStats counts one file's frames.
type pcapStats struct {
	frames    int // records in the file
	roce      int // RoCEv2 frames decoded
	good, bad int // ICRC results of those
	malformed int // UDP 4791 frames that do not parse
	snapped   int // RoCE frames cut short by the capture's snap length
	other     int // not RoCEv2
}

func (s *pcapStats) add(o pcapStats) {
	s.frames += o.frames
	s.roce += o.roce
	s.good += o.good
	s.bad += o.bad
	s.malformed += o.malformed
	s.snapped += o.snapped
	s.other += o.other
}

func (s pcapStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d RoCE frames: icrc ok %d, bad %d", s.roce, s.good, s.bad)
	if s.malformed > 0 {
		fmt.Fprintf(&b, ", malformed %d", s.malformed)
	}
	if s.snapped > 0 {
		fmt.Fprintf(&b, ", cut by snap length (unchecked) %d", s.snapped)
	}
	fmt.Fprintf(&b, "; %d other frames skipped; %d frames in all", s.other, s.frames)
	return b.String()
}

func pcapMain(args []string, stdout, stderr io.Writer) (code int) {
	fs := flag.NewFlagSet("pcap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "one JSON object per RoCE frame")
	fs.Usage = func() { fmt.Fprint(stderr, pcapUsage) }
	// Flags may come before or after the files.
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		files = append(files, rest[0])
		args = rest[1:]
	}
	if len(files) == 0 {
		fs.Usage()
		return 2
	}
	out := bufio.NewWriter(stdout)
	defer func() {
		if err := out.Flush(); err != nil {
			fmt.Fprintln(stderr, "softrnic pcap:", err)
			code = max(code, 2)
		}
	}()
	summary := io.Writer(out)
	if *asJSON {
		summary = stderr
	}
	var total pcapStats
	unreadable := false
	for i, name := range files {
		if !*asJSON && len(files) > 1 {
			if i > 0 {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "==> %s <==\n", name)
		}
		st, err := pcapFile(name, out, stderr, *asJSON)
		if err != nil {
			_ = out.Flush() // before the message; a write error sticks for the last Flush
			fmt.Fprintf(stderr, "softrnic pcap: %s: %v\n", name, err)
			unreadable = true
			if st.frames == 0 {
				continue // nothing was read: no summary to give
			}
		}
		fmt.Fprintf(summary, "%s: %v\n", name, st)
		total.add(st)
	}
	if len(files) > 1 {
		fmt.Fprintf(summary, "total: %v\n", total)
	}
	switch {
	case unreadable:
		return 2
	case total.bad > 0 || total.malformed > 0:
		return 1
	}
	return 0
}

// packetSource yields a capture's records.
type packetSource struct {
	next    func() (data []byte, captured, wire int, err error)
	link    layers.LinkType
	scratch []byte
}

func openCapture(r io.Reader) (*packetSource, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	head, err := br.Peek(4)
	if err != nil {
		return nil, errors.New("not a pcap or pcapng file (too short)")
	}
	ps := &packetSource{scratch: make([]byte, 0, 1<<16)}
	if binary.LittleEndian.Uint32(head) == 0x0A0D0D0A { // pcapng section header block
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, fmt.Errorf("pcapng: %w", err)
		}
		ps.link = ng.LinkType()
		ps.next = func() ([]byte, int, int, error) {
			d, ci, err := ng.ReadPacketData()
			return d, ci.CaptureLength, ci.Length, err
		}
		return ps, nil
	}
	pr, err := pcapgo.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("not a pcap or pcapng file: %w", err)
	}
	ps.link = pr.LinkType()
	ps.next = func() ([]byte, int, int, error) {
		d, ci, err := pr.ReadPacketData()
		return d, ci.CaptureLength, ci.Length, err
	}
	return ps, nil
}

// ethernet presents a record as an Ethernet frame for frame.Parse. Linux
// cooked captures (tcpdump -i any) and raw IP get a synthetic Ethernet
// header; only its EtherType matters. ok is false for records that cannot
// hold IP at all.
func (ps *packetSource) ethernet(d []byte) (eth []byte, ok bool) {
	synth := func(etherType uint16, ip []byte) []byte {
		b := append(ps.scratch[:0], make([]byte, 14)...)
		binary.BigEndian.PutUint16(b[12:], etherType)
		b = append(b, ip...)
		ps.scratch = b
		return b
	}
	switch ps.link {
	case layers.LinkTypeEthernet:
		return d, true
	case layers.LinkTypeLinuxSLL: // 16-byte header, protocol in its last two bytes
		if len(d) < 16 {
			return nil, false
		}
		return d[2:], true
	case layers.LinkTypeLinuxSLL2: // 20-byte header, protocol first
		if len(d) < 20 {
			return nil, false
		}
		return synth(binary.BigEndian.Uint16(d), d[20:]), true
	case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
		if len(d) == 0 {
			return nil, false
		}
		switch d[0] >> 4 {
		case 4:
			return synth(frame.EtherTypeIPv4, d), true
		case 6:
			return synth(frame.EtherTypeIPv6, d), true
		}
	}
	return nil, false
}

func pcapFile(name string, out, errw io.Writer, asJSON bool) (pcapStats, error) {
	var st pcapStats
	f, err := os.Open(name)
	if err != nil {
		return st, err
	}
	defer func() { _ = f.Close() }() // read only
	ps, err := openCapture(f)
	if err != nil {
		return st, err
	}
	switch ps.link {
	case layers.LinkTypeEthernet, layers.LinkTypeLinuxSLL, layers.LinkTypeLinuxSLL2,
		layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
	default:
		return st, fmt.Errorf("unsupported link type %v (want Ethernet, Linux cooked or raw IP)", ps.link)
	}
	enc := json.NewEncoder(out)
	var fr frame.Frame
	for n := 1; ; n++ {
		d, captured, wire, err := ps.next()
		if errors.Is(err, io.EOF) {
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("record %d: %w", n, err)
		}
		st.frames++
		eth, ok := ps.ethernet(d)
		if !ok {
			st.other++
			continue
		}
		perr := frame.Parse(eth, &fr)
		switch {
		case perr == nil:
		case frame.IsNotRoCE(perr):
			st.other++
			continue
		case captured < wire:
			st.snapped++
			fmt.Fprintf(errw, "%s: frame %d: RoCE frame cut by the capture's snap length (%d of %d bytes); ICRC not checked\n", name, n, captured, wire)
			continue
		default:
			st.malformed++
			if asJSON {
				fmt.Fprintf(errw, "%s: frame %d: malformed RoCEv2: %v\n", name, n, frame.ReasonOf(perr))
			} else {
				fmt.Fprintf(out, "%5d malformed RoCEv2: %v\n", n, frame.ReasonOf(perr))
			}
			continue
		}
		st.roce++
		good := fr.VerifyICRC()
		if good {
			st.good++
		} else {
			st.bad++
		}
		if asJSON {
			if err := enc.Encode(jsonOf(n, &fr, good)); err != nil {
				return st, err
			}
		} else {
			writeText(out, n, &fr, good)
		}
	}
}

func icrcWord(good bool) string {
	if good {
		return "ok"
	}
	return "bad"
}

func writeText(w io.Writer, n int, f *frame.Frame, good bool) {
	b := f.BTH()
	src := netip.AddrPortFrom(f.Src(), f.UDP().SrcPort())
	fmt.Fprintf(w, "%5d %v -> %v %v qp=0x%06x psn=%d ack_req=%d", n, src, f.Dst(), f.Opcode(), b.DestQP(), b.PSN(), b2i(b.AckReq()))
	if b.SE() {
		fmt.Fprint(w, " se=1")
	}
	if b.FECN() {
		fmt.Fprint(w, " fecn=1")
	}
	if b.BECN() {
		fmt.Fprint(w, " becn=1")
	}
	if b.PKey() != bth.DefaultPKey {
		fmt.Fprintf(w, " pkey=0x%04x", b.PKey())
	}
	if r := f.RETH(); r != nil {
		fmt.Fprintf(w, " reth[va=0x%x rkey=0x%08x len=%d]", r.VA(), r.RKey(), r.DMALen())
	}
	if fe := f.FETH(); fe != nil {
		fmt.Fprintf(w, " feth[placement=%d selectivity=%d]", fe.PlacementType(), fe.Selectivity())
	}
	if a := f.AETH(); a != nil {
		switch a.Kind() {
		case bth.KindACK:
			fmt.Fprintf(w, " aeth[ACK credit=%d msn=%d]", a.CreditCode(), a.MSN())
		case bth.KindRNRNAK:
			fmt.Fprintf(w, " aeth[RNR_NAK timer=%d (%v) msn=%d]", a.RNRTimer(), bth.RNRTimeout(a.RNRTimer()), a.MSN())
		case bth.KindNAK:
			fmt.Fprintf(w, " aeth[NAK %v msn=%d]", a.NAKCode(), a.MSN())
		default:
			fmt.Fprintf(w, " aeth[RESERVED syndrome=0x%02x msn=%d]", a.Syndrome(), a.MSN())
		}
	}
	if d := f.DETH(); d != nil {
		fmt.Fprintf(w, " deth[qkey=0x%08x src_qp=0x%06x]", d.QKey(), d.SrcQP())
	}
	if x := f.ImmDt(); x != nil {
		fmt.Fprintf(w, " imm=0x%08x", x.Imm())
	}
	if x := f.IETH(); x != nil {
		fmt.Fprintf(w, " ieth[rkey=0x%08x]", x.RKey())
	}
	if a := f.AtomicETH(); a != nil {
		fmt.Fprintf(w, " atomic[va=0x%x rkey=0x%08x swap_add=%d compare=%d]", a.VA(), a.RKey(), a.SwapAdd(), a.Compare())
	}
	if a := f.AtomicAckETH(); a != nil {
		fmt.Fprintf(w, " atomic_ack[orig=%d]", a.Orig())
	}
	if p := b.PadCount(); p != 0 {
		fmt.Fprintf(w, " pad=%d", p)
	}
	fmt.Fprintf(w, " payload=%d icrc=%s\n", f.PayloadLen(), icrcWord(good))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// JSON shape of one RoCE frame: exactly the keys README documents, the
// extended headers only when the opcode carries them.
type jsonFrame struct {
	Frame      int            `json:"frame"`
	Src        string         `json:"src"`
	Dst        string         `json:"dst"`
	UDPSport   uint16         `json:"udp_sport"`
	Opcode     uint8          `json:"opcode"`
	OpcodeName string         `json:"opcode_name"`
	DestQP     uint32         `json:"dest_qp"`
	PSN        uint32         `json:"psn"`
	AckReq     bool           `json:"ack_req"`
	SE         bool           `json:"se"`
	Pad        int            `json:"pad"`
	PKey       uint16         `json:"pkey"`
	FECN       bool           `json:"fecn"`
	BECN       bool           `json:"becn"`
	RETH       *jsonRETH      `json:"reth,omitempty"`
	AETH       *jsonAETH      `json:"aeth,omitempty"`
	DETH       *jsonDETH      `json:"deth,omitempty"`
	Imm        *uint32        `json:"imm,omitempty"`
	IETH       *uint32        `json:"ieth,omitempty"`
	Atomic     *jsonAtomic    `json:"atomic,omitempty"`
	AtomicAck  *jsonAtomicAck `json:"atomic_ack,omitempty"`
	PayloadLen int            `json:"payload_len"`
	ICRC       string         `json:"icrc"`
}

type jsonRETH struct {
	VA   uint64 `json:"va"`
	RKey uint32 `json:"rkey"`
	Len  uint32 `json:"len"`
}

type jsonAETH struct {
	Syndrome uint8  `json:"syndrome"`
	Kind     string `json:"kind"`
	Code     uint8  `json:"code"`
	MSN      uint32 `json:"msn"`
}

type jsonDETH struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"src_qp"`
}

type jsonAtomic struct {
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add"`
	Compare uint64 `json:"compare"`
}

type jsonAtomicAck struct {
	Orig uint64 `json:"orig"`
}

func jsonOf(n int, f *frame.Frame, good bool) *jsonFrame {
	b := f.BTH()
	j := &jsonFrame{
		Frame: n, Src: f.Src().String(), Dst: f.Dst().String(), UDPSport: f.UDP().SrcPort(),
		Opcode: uint8(f.Opcode()), OpcodeName: f.Opcode().String(), DestQP: b.DestQP(), PSN: uint32(b.PSN()),
		AckReq: b.AckReq(), SE: b.SE(), Pad: b.PadCount(), PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(),
		PayloadLen: f.PayloadLen(), ICRC: icrcWord(good),
	}
	if r := f.RETH(); r != nil {
		j.RETH = &jsonRETH{VA: r.VA(), RKey: r.RKey(), Len: r.DMALen()}
	}
	if a := f.AETH(); a != nil {
		j.AETH = &jsonAETH{Syndrome: a.Syndrome(), Kind: a.Kind().String(), Code: a.Code(), MSN: a.MSN()}
	}
	if d := f.DETH(); d != nil {
		j.DETH = &jsonDETH{QKey: d.QKey(), SrcQP: d.SrcQP()}
	}
	if x := f.ImmDt(); x != nil {
		v := x.Imm()
		j.Imm = &v
	}
	if x := f.IETH(); x != nil {
		v := x.RKey()
		j.IETH = &v
	}
	if a := f.AtomicETH(); a != nil {
		j.Atomic = &jsonAtomic{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
	}
	if a := f.AtomicAckETH(); a != nil {
		j.AtomicAck = &jsonAtomicAck{Orig: a.Orig()}
	}
	return j
}
