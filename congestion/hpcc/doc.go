package hpcc

// Wiring: HPCC needs switches that push INT records and receivers that
// echo them in ACKs. RoCEv2 has no standard field for either, so in
// softrnic HPCC runs in the simulator (sim pushes the records at dequeue
// and echoes them); a live deployment would carry them in a vendor
// extension of the data packet and its ACK and hand them to OnAck as
// Ack.INT (a view of the received frame: OnAck copies what it keeps). The
// rest is as for any window algorithm: OnPacketSent per data packet with
// its wire bytes, OnAck per ACK with the wire bytes newly acknowledged, and
// send only while bytes in flight are below Window and the pacer allows
// Rate.
