// Package bpf holds softrnic's XDP steering program and its loader.
//
// The program (steer.c, compiled by bpf2go into the committed steer_bpf*.o)
// redirects RoCEv2 frames (UDP destination port 4791 over IPv4 or IPv6,
// optionally behind one VLAN tag) to the AF_XDP socket registered for the
// receiving queue and passes everything else to the kernel, so ARP, ICMP, SSH
// and the TCP side channels of perftest and rdma_cm keep working.
//
// It is attached as a BPF link: the kernel detaches it when the last file
// descriptor of the link closes, which includes the process dying, so a
// crashed daemon never leaves an interface black-holing RoCE traffic.
package bpf
