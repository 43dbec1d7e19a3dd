// Package rocelayers makes RoCEv2 decodable by gopacket: importing it
// registers LayerTypeBTH on UDP destination port 4791, so that
// gopacket.NewPacket on an Ethernet frame yields Ethernet / IPv4 or IPv6 /
// UDP / BTH / Payload.
//
// It exists for tools, tests and pcap analysis; the engine's hot path uses
// package frame, which decodes the same bytes without allocating. The BTH
// layer holds the BTH and every extended header the opcode carries (their
// presence depends on the opcode, so they are one layer, as in Wireshark's
// InfiniBand dissector); its payload excludes pad and ICRC.
package rocelayers
