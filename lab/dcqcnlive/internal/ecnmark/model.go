package ecnmark

// Model is the marker's algorithm in Go, step for step the same integer
// arithmetic as ecn_vq.c: the tests hold the BPF program against it packet
// by packet, and it documents the program's semantics in a language a
// reviewer can run. It is not safe for concurrent use.
type Model struct {
	cfg            Config
	rate, pmax     uint64
	lastNs, q, rem uint64
	rng            uint64
	Counters       Counters
}

// NewModel returns a model with an empty queue, seeded as the program is.
func NewModel(cfg Config) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Model{cfg: cfg, rate: cfg.RateBitsPerSec / 8, pmax: cfg.pmaxQ32(), rng: cfg.seed()}, nil
}

// Backlog is the virtual queue (burst included) after the last packet.
func (m *Model) Backlog() uint64 { return m.q }

// Packet runs one packet of length l with ECN field ecn (0xff: not IP)
// arriving at nowNs and returns the verdict bits and the backlog estimate
// (virtual queue minus burst) the packet found.
func (m *Model) Packet(nowNs uint64, l uint32, ecn uint8) (verdict uint8, found uint64) {
	c := &m.Counters
	c.Packets++
	c.Bytes += uint64(l)
	if m.lastNs != 0 && nowNs > m.lastNs {
		dt := nowNs - m.lastNs
		if dt >= 1e9 {
			m.q, m.rem = 0, 0
		} else {
			num := dt*m.rate + m.rem
			d := num / 1e9
			if d >= m.q {
				m.q, m.rem = 0, 0
			} else {
				m.q -= d
				m.rem = num - d*1e9
			}
		}
	}
	if nowNs > m.lastNs {
		m.lastNs = nowNs
	}
	if m.q > m.cfg.BurstBytes {
		found = m.q - m.cfg.BurstBytes
	}
	if m.cfg.LimitBytes != 0 && found+uint64(l) > m.cfg.LimitBytes {
		verdict |= VerdictVQDrop
	} else {
		m.q += uint64(l)
	}
	if verdict&VerdictVQDrop == 0 && found > m.cfg.KminBytes {
		if found > m.cfg.KmaxBytes {
			verdict |= VerdictRED
		} else {
			x := m.rng
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			m.rng = x
			thr := m.pmax * (found - m.cfg.KminBytes) / (m.cfg.KmaxBytes - m.cfg.KminBytes)
			if x>>32 < thr {
				verdict |= VerdictRED
			}
		}
	}
	switch ecn {
	case 0xff:
		c.NonIP++
	case 0:
		c.NotECT++
	case 3:
		c.CE++
	default:
		c.ECT++
	}
	if verdict&VerdictRED != 0 {
		switch ecn {
		case 1, 2:
			c.Marked++
			verdict |= VerdictMarked
		case 3:
			c.CEHit++
		case 0:
			c.NotECTHit++
		}
	}
	if verdict&VerdictVQDrop != 0 {
		c.VQDrops++
	}
	return verdict, found
}
