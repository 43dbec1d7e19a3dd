package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// SeedRun is one seed's line in a merged workload summary.
type SeedRun struct {
	Seed          uint64         `json:"seed"`
	FlowsArrived  int            `json:"flows_arrived"`
	FlowsFinished int            `json:"flows_finished"`
	OfferedLoad   float64        `json:"offered_load"`
	DeliveredLoad float64        `json:"delivered_load"`
	QueueP99KB    float64        `json:"queue_p99_kb"`
	QueueMaxKB    float64        `json:"queue_max_kb"`
	Drops         uint64         `json:"drops"`
	Pauses        uint64         `json:"pfc_pauses"`
	Events        uint64         `json:"events"`
	CPUSeconds    float64        `json:"cpu_seconds"`
	WallSeconds   float64        `json:"wall_seconds"`
	Small         *SlowdownStats `json:"small_le_100kb,omitempty"`
}

// MergeWorkload merges one workload's runs under several seeds (in seed
// order, with their fct.txt files): fct.txt is their concatenation and the
// slowdown tables are over all their flows, as fct_analysis.py would make
// them from the concatenated file. Loads and queue percentiles are means
// over the seeds; counts, drops, events and CPU time are totals.
func MergeWorkload(sums []Summary, fcts [][]byte) (Summary, []byte, error) {
	if len(sums) == 0 || len(sums) != len(fcts) {
		return Summary{}, nil, errors.New("sim: merge needs one fct.txt per summary")
	}
	m := sums[0]
	if m.Workload == nil {
		return Summary{}, nil, errors.New("sim: merge of runs that are not workload runs")
	}
	w := *m.Workload
	m.Workload = &w
	m.Seeds, m.Runs = nil, nil
	m.Drops, m.Pauses, m.Events, m.CPUSeconds, m.WallSeconds = 0, 0, 0, 0, 0
	w.FlowsArrived, w.FlowsFinished, w.Incasts = 0, 0, 0
	w.OfferedLoad, w.DeliveredLoad, w.QueueMeanKB, w.QueueP99KB, w.QueueMaxKB = 0, 0, 0, 0, 0
	var done []flowDone
	var all bytes.Buffer
	k := float64(len(sums))
	for i, s := range sums {
		sw := s.Workload
		if sw == nil || s.Algorithm != m.Algorithm || sw.Topology != w.Topology || sw.CDF != w.CDF || sw.Load != w.Load {
			return Summary{}, nil, fmt.Errorf("sim: merge of different experiments (seed %d)", s.Seed)
		}
		d, err := ParseFCT(bytes.NewReader(fcts[i]))
		if err != nil {
			return Summary{}, nil, fmt.Errorf("seed %d: %w", s.Seed, err)
		}
		done = append(done, d...)
		all.Write(fcts[i])
		m.Seeds = append(m.Seeds, s.Seed)
		m.Runs = append(m.Runs, SeedRun{Seed: s.Seed, FlowsArrived: sw.FlowsArrived, FlowsFinished: sw.FlowsFinished,
			OfferedLoad: sw.OfferedLoad, DeliveredLoad: sw.DeliveredLoad, QueueP99KB: sw.QueueP99KB, QueueMaxKB: sw.QueueMaxKB,
			Drops: s.Drops, Pauses: s.Pauses, Events: s.Events, CPUSeconds: s.CPUSeconds, WallSeconds: s.WallSeconds, Small: sw.Small})
		m.Drops += s.Drops
		m.Pauses += s.Pauses
		m.Events += s.Events
		m.CPUSeconds += s.CPUSeconds
		m.WallSeconds += s.WallSeconds
		w.FlowsArrived += sw.FlowsArrived
		w.FlowsFinished += sw.FlowsFinished
		w.Incasts += sw.Incasts
		w.OfferedLoad += sw.OfferedLoad / k
		w.DeliveredLoad += sw.DeliveredLoad / k
		w.QueueMeanKB += sw.QueueMeanKB / k
		w.QueueP99KB += sw.QueueP99KB / k
		w.QueueMaxKB = math.Max(w.QueueMaxKB, sw.QueueMaxKB)
	}
	if m.CPUSeconds > 0 {
		m.EventsPerCPUSec = float64(m.Events) / m.CPUSeconds
	}
	if m.WallSeconds > 0 {
		m.EventsPerSec = float64(m.Events) / m.WallSeconds
	}
	w.Slowdown = SlowdownTable(done, SlowdownStep)
	w.Small = SlowdownOf(done, 0, 100_000)
	w.Medium = SlowdownOf(done, 100_000, 1_000_000)
	w.Large = SlowdownOf(done, 1_000_000, math.MaxInt64)
	w.Incast = IncastSlowdown(done)
	m.Utilization, m.QueueMeanKB, m.QueueMaxKB = w.DeliveredLoad, w.QueueMeanKB, w.QueueMaxKB
	return m, all.Bytes(), nil
}
