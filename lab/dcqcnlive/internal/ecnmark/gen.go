package ecnmark

// Regenerating needs clang, llvm (llvm-strip) and libbpf's headers
// (Debian: apt-get install clang llvm libbpf-dev); the outputs are committed so
// that building softrnic needs none of them.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -no-global-types -output-stem ecnvq ecnvq ecn_vq.c -- -O2 -g -Wall -Werror
