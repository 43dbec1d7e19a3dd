// Command hostile runs the attacks of a hostile local client on a softrnic
// daemon, black box, and prints what the daemon did: whether it survived,
// whether a new client was still served and a well-behaved stream through
// it still ran, and its file descriptors, mappings and memory before,
// during (the attacker holding what it took) and after each attack.
//
// Each attack gets a daemon of its own (the binary given, `softrnic
// daemon` on an AF_XDP port of a veth in a namespace) and a stream through
// it (`softrnic perf write_bw --daemon` against a perf client in the
// other namespace). The attackers are this program re-executed, speaking
// raw control messages (daemon/proto) and writing straight into their
// rings: what any local program in the daemon's group can do, here as
// user nobody (the well-behaved clients are root's). The attacks are those
// of the daemon's issue:
//
//	silent   2 processes × 12 000 connections that never speak
//	cqs      3 connections × 4095 CQs of depth 1 (two fds each)
//	maps     16 connections × 4 090 one-page MRs, each in a memfd of its own, and 700 CQs each
//	mrs      100 000 one-page MRs in one memfd: registration rate at 1 000 and 100 000
//	qps      20 RC QPs of 16384/16384 WRs, 32/32 SGEs
//	bigcqs   20 CQs of 2^20 entries
//	qkey     a UD QP given the Q_Key 0x80010000 by another user (nobody)
//	badwr    WRs failing the device's checks: READ on UD, too many SGEs,
//	         inline over the QP's max, unknown opcode, unknown flag bits
//
// It needs root (namespaces, XDP, another user).
//
//	go run ./bench/hostile -softrnic bin/softrnic [-attacks silent,cqs,...]
package main
