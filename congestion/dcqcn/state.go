package dcqcn

import "github.com/softrnic/softrnic/congestion"

// State is a snapshot of one QP's DCQCN state, for stats and tests.
type State struct {
	// Rate is the reaction point's current rate (R_C), Target its target
	// rate (R_T), Alpha its α.
	Rate, Target congestion.Rate
	Alpha        float64
	RPCounters
	NPCounters
}
