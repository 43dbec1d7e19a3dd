package ib

// EventType is the kind of an asynchronous event (ibv_event_type), numbered
// as IBV_EVENT_*.
type EventType uint8

// Asynchronous events.
const (
	// EventCQErr: a CQ overflowed; completions were lost, the CQ is in
	// error and its QPs go to ERR.
	EventCQErr EventType = 0
	// EventQPFatal: the QP went to ERR because of a transport error; its
	// WRs were flushed.
	EventQPFatal EventType = 1
	// EventQPReqErr: the QP went to ERR because a request it received
	// broke the protocol (invalid request).
	EventQPReqErr EventType = 2
	// EventQPAccessErr: the QP went to ERR because of a remote access
	// violation it received.
	EventQPAccessErr EventType = 3
	// EventCommEst: a QP in RTR received its first packet; a passive CM
	// side whose RTU was lost moves the QP to RTS on it.
	EventCommEst EventType = 4
	// EventSQDrained: a QP moved to SQD with SQDrainNotify has no send
	// WQE in progress any more.
	EventSQDrained EventType = 5
	// EventDeviceFatal: the device is gone (the daemon stopped).
	EventDeviceFatal EventType = 8
	// EventPortActive and EventPortErr: the port's link came up or went
	// down.
	EventPortActive EventType = 9
	EventPortErr    EventType = 10
	// EventSRQErr: an SRQ can take no more receives (the daemon found its
	// ring corrupted by the client); the QPs using it stop receiving.
	EventSRQErr EventType = 14
	// EventSRQLimitReached: an SRQ armed with a limit (SRQAttr.Limit)
	// holds fewer receives than the limit; the limit is disarmed.
	EventSRQLimitReached EventType = 15
	// EventQPLastWQEReached: a QP attached to an SRQ went to ERR and will
	// take no more receives from it.
	EventQPLastWQEReached EventType = 16
)

func (t EventType) String() string {
	switch t {
	case EventCQErr:
		return "CQ_ERR"
	case EventQPFatal:
		return "QP_FATAL"
	case EventQPReqErr:
		return "QP_REQ_ERR"
	case EventQPAccessErr:
		return "QP_ACCESS_ERR"
	case EventCommEst:
		return "COMM_EST"
	case EventSQDrained:
		return "SQ_DRAINED"
	case EventDeviceFatal:
		return "DEVICE_FATAL"
	case EventPortActive:
		return "PORT_ACTIVE"
	case EventPortErr:
		return "PORT_ERR"
	case EventSRQErr:
		return "SRQ_ERR"
	case EventSRQLimitReached:
		return "SRQ_LIMIT_REACHED"
	case EventQPLastWQEReached:
		return "QP_LAST_WQE_REACHED"
	}
	return "EVENT_?"
}
