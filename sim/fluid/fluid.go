package fluid

import (
	"errors"
	"math"
)

// Params are the model's parameters.
type Params struct {
	N          int     // flows
	LinkBps    float64 // bottleneck capacity C, bit/s
	PacketBits float64 // packet size, bits (8000 = 1 KB)
	TauStar    float64 // feedback delay τ*, s

	G        float64 // α gain g
	Tau      float64 // CNP interval τ (N in the paper), s
	TauPrime float64 // α timer τ' (K), s
	Timer    float64 // rate-increase timer T, s
	ByteB    float64 // byte counter B, bytes
	F        float64 // fast-recovery steps
	RAIBps   float64 // additive increase R_AI, bit/s

	Kmin, Kmax float64 // RED thresholds, bytes
	Pmax       float64

	Dt       float64 // Euler step, s
	Duration float64 // s
	// Window is the [start, end) in seconds over which Result is measured.
	Window [2]float64
}

// Paper returns the paper's parameters for n flows at 40 Gb/s with 1 KB
// packets, Kmin/Kmax/Pmax = 5 KB/200 KB/1 %, τ* = 50 µs, measured over
// 30–60 ms with a 0.25 µs step.
func Paper(n int) Params {
	return Params{
		N: n, LinkBps: 40e9, PacketBits: 8000, TauStar: 50e-6,
		G: 1.0 / 256, Tau: 50e-6, TauPrime: 55e-6, Timer: 55e-6, ByteB: 10e6, F: 5, RAIBps: 40e6,
		Kmin: 5e3, Kmax: 200e3, Pmax: 0.01,
		Dt: 0.25e-6, Duration: 60e-3, Window: [2]float64{30e-3, 60e-3},
	}
}

// Result is the model's behaviour over the window.
type Result struct {
	QueueMinKB, QueueMeanKB, QueueMaxKB float64
	RateGbps                            float64 // per flow, mean
	Utilization                         float64 // mean of min(N·R_C, C)/C, 1 while a queue stands
	Alpha                               float64 // at the end
	// Series, one point per SampleEvery steps, for plots.
	TimesMs, QueueKB, RatesGbps []float64
}

// SampleEvery is the series' decimation: one point per this many steps.
const SampleEvery = 40

// Run integrates the model.
func Run(p Params) (*Result, error) {
	if p.N < 1 || p.LinkBps <= 0 || p.PacketBits <= 0 || p.Dt <= 0 || p.Duration <= 0 ||
		p.TauStar < 0 || p.Kmax <= p.Kmin || p.Tau <= 0 || p.TauPrime <= 0 || p.Timer <= 0 || p.ByteB <= 0 {
		return nil, errors.New("fluid: invalid parameters")
	}
	pkt := p.PacketBits / 8 // bytes
	C := p.LinkBps / p.PacketBits
	B := p.ByteB / pkt
	rai := p.RAIBps / p.PacketBits
	kmin, kmax := p.Kmin/pkt, p.Kmax/pkt
	steps := int(p.Duration / p.Dt)
	lag := int(math.Round(p.TauStar / p.Dt))

	// History rings of R_C and q, length lag+1: hist[(i) % len] is step i.
	histRC := make([]float64, lag+1)
	histQ := make([]float64, lag+1)
	rc, rt, alpha, q := C, C, 1.0, 0.0 // flows start at line rate, α = 1
	for i := range histRC {
		histRC[i] = rc
	}

	res := &Result{QueueMinKB: math.Inf(1)}
	var qSum, rSum, uSum float64
	var nWin int
	for i := 0; i < steps; i++ {
		t := float64(i) * p.Dt
		slot := i % (lag + 1)
		histRC[slot], histQ[slot] = rc, q
		old := (i - lag) % (lag + 1)
		if i < lag {
			old = 0 // constant initial history
		}
		rLag, qLag := histRC[old], histQ[old]
		if i < lag {
			rLag, qLag = C, 0
		}
		mp := markProb(qLag, kmin, kmax, p.Pmax)

		var a, b, c, d, e, aPrime float64
		switch {
		case mp <= 0:
			b, c = 1/B, 1/B
			if rLag > 0 {
				d = 1 / (p.Timer * rLag)
				e = d
			}
		case mp >= 1:
			a, aPrime = 1, 1
		default:
			L := math.Log1p(-mp)
			a = -math.Expm1(p.Tau * rLag * L)
			aPrime = -math.Expm1(p.TauPrime * rLag * L)
			b = mp / math.Expm1(-B*L)
			c = b * math.Exp(p.F*B*L)
			if x := math.Expm1(-p.Timer * rLag * L); x > 0 {
				d = mp / x
				e = d * math.Exp(p.F*p.Timer*rLag*L)
			}
		}
		dAlpha := p.G / p.TauPrime * (aPrime - alpha)
		dRT := -(rt-rc)*a/p.Tau + rai*rLag*c + rai*rLag*e
		dRC := -rc*alpha*a/(2*p.Tau) + (rt-rc)*rLag*b/2 + (rt-rc)*rLag*d/2
		if rc >= C && dRC > 0 {
			dRC = 0
		}
		if rt >= C && dRT > 0 {
			dRT = 0
		}
		dq := float64(p.N)*rc - C
		if q <= 0 && dq < 0 {
			dq = 0
		}

		if t >= p.Window[0] && t < p.Window[1] {
			kb := q * pkt / 1e3
			res.QueueMinKB = min(res.QueueMinKB, kb)
			res.QueueMaxKB = max(res.QueueMaxKB, kb)
			qSum += kb
			rSum += rc
			u := 1.0
			if q <= 0 {
				u = min(float64(p.N)*rc/C, 1)
			}
			uSum += u
			nWin++
		}
		if i%SampleEvery == 0 {
			res.TimesMs = append(res.TimesMs, t*1e3)
			res.QueueKB = append(res.QueueKB, q*pkt/1e3)
			res.RatesGbps = append(res.RatesGbps, rc*p.PacketBits/1e9)
		}

		alpha += dAlpha * p.Dt
		rt = min(rt+dRT*p.Dt, C)
		rc = min(rc+dRC*p.Dt, C)
		rc, rt = max(rc, 0), max(rt, 0)
		q = max(q+dq*p.Dt, 0)
	}
	if nWin == 0 {
		return nil, errors.New("fluid: window outside the run")
	}
	res.QueueMeanKB = qSum / float64(nWin)
	res.RateGbps = rSum / float64(nWin) * p.PacketBits / 1e9
	res.Utilization = uSum / float64(nWin)
	res.Alpha = alpha
	return res, nil
}

// markProb is the RED ramp in packets.
func markProb(q, kmin, kmax, pmax float64) float64 {
	switch {
	case q <= kmin:
		return 0
	case q <= kmax:
		return (q - kmin) / (kmax - kmin) * pmax
	}
	return 1
}
