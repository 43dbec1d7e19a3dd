// Package plot draws publication-style line charts as standalone SVG, with
// no dependency beyond the standard library: axes with 1-2-5 ticks, light
// grid, colour-blind-safe palette, legend, and min/max decimation so a
// series of a million points still draws every peak in a small file.
//
// The output is a pure function of the input (fixed number formatting, no
// maps), so plots are as reproducible as the traces they show.
package plot
