/*
 * The daemon's shared-memory rings (Go package shmring), client side: a
 * single-producer single-consumer ring of fixed-size slots in a sealed
 * memfd, with free-running 64-bit indexes and a wakeup flag. Posting and
 * polling are memory operations; an eventfd write happens only when the
 * other side has armed the flag before sleeping. The layout is the
 * generated struct softrnic_ring_header.
 *
 * The peer may be hostile: the geometry is ours (from the reply that came
 * with the fd), checked once against the header, and every index loaded
 * from shared memory is validated; an impossible one latches corrupt.
 */
#ifndef SRN_RING_H
#define SRN_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "softrnic_proto.h"

struct srn_ring {
	uint8_t *mem;
	size_t len;
	uint32_t slot_size, slots;
	struct softrnic_ring_header *hdr;
	uint8_t *base; /* the first slot */
};

struct srn_producer {
	struct srn_ring *r;
	uint64_t head, published, cached_cons;
	int db; /* the consumer's doorbell, -1: none */
	bool corrupt;
};

struct srn_consumer {
	struct srn_ring *r;
	uint64_t tail, released, cached_prod;
	bool corrupt;
};

/* Maps the ring in fd (taking the fd: it is closed in every case) after
 * checking its seals, size and header. Returns 0 or an errno. */
int srn_ring_map(struct srn_ring *r, int fd, uint32_t slot_size, uint32_t slots);
void srn_ring_unmap(struct srn_ring *r);
void srn_producer_init(struct srn_producer *p, struct srn_ring *r, int db);
void srn_consumer_init(struct srn_consumer *c, struct srn_ring *r);
/* Rings an eventfd; a saturated counter means a wakeup is pending anyway. */
void srn_doorbell_ring(int fd);

static inline uint8_t *srn_ring_slot(const struct srn_ring *r, uint64_t i)
{
	return r->base + (size_t)(i & (r->slots - 1)) * r->slot_size;
}

/* The next free slot, or NULL when the ring is full (or corrupt). */
static inline uint8_t *srn_reserve(struct srn_producer *p)
{
	uint64_t size = p->r->slots;
	if (p->head - p->cached_cons >= size) {
		if (p->corrupt)
			return NULL;
		uint64_t c = __atomic_load_n(&p->r->hdr->cons, __ATOMIC_SEQ_CST);
		if (p->published - c > size) {
			p->corrupt = true;
			return NULL;
		}
		p->cached_cons = c;
		if (p->head - c >= size)
			return NULL;
	}
	return srn_ring_slot(p->r, p->head++);
}

/* Gives back the most recent uncommitted slot. */
static inline void srn_unreserve(struct srn_producer *p)
{
	if (p->head > p->published)
		p->head--;
}

/* Gives back every slot reserved since the last commit. */
static inline void srn_unreserve_all(struct srn_producer *p)
{
	p->head = p->published;
}

/* Publishes the reserved slots and rings the consumer if it sleeps. */
static inline void srn_commit(struct srn_producer *p)
{
	if (p->head == p->published)
		return;
	p->published = p->head;
	__atomic_store_n(&p->r->hdr->prod, p->head, __ATOMIC_SEQ_CST);
	if (p->db >= 0 && __atomic_load_n(&p->r->hdr->wakeup, __ATOMIC_SEQ_CST) != 0 &&
	    __atomic_exchange_n(&p->r->hdr->wakeup, 0, __ATOMIC_SEQ_CST) != 0)
		srn_doorbell_ring(p->db);
}

static inline bool srn_reload(struct srn_consumer *c)
{
	if (c->corrupt)
		return false;
	uint64_t p = __atomic_load_n(&c->r->hdr->prod, __ATOMIC_SEQ_CST);
	if (p - c->released > c->r->slots || p - c->cached_prod > c->r->slots) {
		c->corrupt = true;
		return false;
	}
	c->cached_prod = p;
	return c->tail != p;
}

/* The next filled slot, or NULL when the ring is empty (or corrupt). */
static inline const uint8_t *srn_peek(struct srn_consumer *c)
{
	if (c->tail == c->cached_prod && !srn_reload(c))
		return NULL;
	return srn_ring_slot(c->r, c->tail++);
}

/* Hands the peeked slots back to the producer. */
static inline void srn_release(struct srn_consumer *c)
{
	if (c->tail != c->released) {
		c->released = c->tail;
		__atomic_store_n(&c->r->hdr->cons, c->tail, __ATOMIC_SEQ_CST);
	}
}

/* Asks the producer to ring our doorbell on its next commit (wake:
 * SOFTRNIC_RING_WAKE_ANY), or its next one marked solicited
 * (SOFTRNIC_RING_WAKE_SOLICITED), then rechecks: false if entries are
 * already there (the flag stays set). */
static inline bool srn_arm(struct srn_consumer *c, uint32_t wake)
{
	__atomic_store_n(&c->r->hdr->wakeup, wake, __ATOMIC_SEQ_CST);
	return !srn_reload(c);
}

static inline void srn_disarm(struct srn_consumer *c)
{
	__atomic_store_n(&c->r->hdr->wakeup, 0, __ATOMIC_SEQ_CST);
}

/* Free slots (reloading the consumer's index). */
static inline uint64_t srn_free(struct srn_producer *p)
{
	uint64_t c = __atomic_load_n(&p->r->hdr->cons, __ATOMIC_SEQ_CST);
	if (p->published - c > p->r->slots) {
		p->corrupt = true;
		return 0;
	}
	p->cached_cons = c;
	return p->r->slots - (p->head - c);
}

#endif
