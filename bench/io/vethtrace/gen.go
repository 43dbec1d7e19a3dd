package main

// Regenerating needs clang, llvm and libbpf's headers, as for package bpf.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -no-global-types -output-stem vethtrace vethtrace vethtrace.c -- -O2 -g -Wall -Werror
