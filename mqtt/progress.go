package mqtt

import "sync"

// progress tracks how far one consumer has got in one stream: the offset
// below which every record was either acknowledged (PUBACK or PUBCOMP for
// QoS 1/2, written for QoS 0) or not for this consumer. That is the
// contiguous acknowledged prefix a consumer group commits and a durable
// session resumes from. Deliveries are added in offset order; their
// acknowledgements may come in any order.
//
// Its memory is bounded by what is queued and unacknowledged for the
// consumer (the queue depth plus the window).
type progress struct {
	mu sync.Mutex
	// pending are the offsets handed to the consumer and not yet done, in
	// offset order; pending[0] has sequence number base.
	pending []progressEntry
	base    uint64
	gen     uint64 // bumped by reset: callbacks of older deliveries are ignored
	scanned uint64 // every offset below it was examined
	value   uint64 // last value reported to onAdvance
	// onAdvance is called when the value moves, under the lock so calls
	// come in order; it must not call back into progress.
	onAdvance func(uint64)
}

type progressEntry struct {
	offset uint64
	done   bool
}

func newProgress(start uint64, onAdvance func(uint64)) *progress {
	return &progress{scanned: start, value: start, onAdvance: onAdvance}
}

// track notes that the record at offset goes to the consumer, and returns
// what settles it (once it is acknowledged, written or skipped).
func (p *progress) track(offset uint64) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq, gen := p.base+uint64(len(p.pending)), p.gen
	p.pending = append(p.pending, progressEntry{offset: offset})
	return func() { p.settle(gen, seq) }
}

// untrack takes back the last track, for a delivery that could not be
// queued after all (it is tracked again when it is).
func (p *progress) untrack() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.pending); n > 0 && !p.pending[n-1].done {
		p.pending = p.pending[:n-1]
	}
}

// settle marks delivery seq of generation gen through with.
func (p *progress) settle(gen, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen != p.gen || seq < p.base || seq >= p.base+uint64(len(p.pending)) {
		return
	}
	p.pending[seq-p.base].done = true
	n := 0
	for n < len(p.pending) && p.pending[n].done {
		n++
	}
	p.pending = p.pending[n:]
	p.base += uint64(n)
	p.advanceLocked()
}

// scan notes that every offset below upto was examined.
func (p *progress) scan(upto uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if upto > p.scanned {
		p.scanned = upto
	}
	p.advanceLocked()
}

// reset starts over at offset (a seek): deliveries made before it no longer
// count.
func (p *progress) reset(offset uint64) {
	p.mu.Lock()
	p.gen++
	p.base += uint64(len(p.pending))
	p.pending = nil
	p.scanned, p.value = offset, offset
	p.mu.Unlock()
}

// get returns the current value.
func (p *progress) get() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.valueLocked()
}

func (p *progress) valueLocked() uint64 {
	if len(p.pending) > 0 {
		return p.pending[0].offset
	}
	return p.scanned
}

// advanceLocked reports a new value.
func (p *progress) advanceLocked() {
	if v := p.valueLocked(); v > p.value {
		p.value = v
		if p.onAdvance != nil {
			p.onAdvance(v)
		}
	}
}
