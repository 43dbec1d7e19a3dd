// Package fluid integrates the DCQCN fluid model (Zhu et al., SIGCOMM 2015
// §5; restated as equation 11 of "ECN or Delay", CoNEXT 2016): N identical,
// synchronised flows through one RED/ECN bottleneck, with the feedback
// delay τ*. It is the simulator's second oracle: where the model is stable
// its fixed point (queue, per-flow rate) is what the packet-level
// simulator's means must approach.
//
// Units follow the model: rates in packets per second, queue in packets,
// times in seconds. Fixed-step Euler with a ring-buffer history for the
// delayed terms; (1−p)^x is computed as exp(x·log1p(−p)) so the tiny
// marking probabilities near Kmin lose no precision.
package fluid
