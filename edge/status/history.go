package status

import (
	"sync"
	"time"
)

// Sample is one reading of the node's cumulative counters and gauges.
type Sample struct {
	At          time.Time
	Published   float64 // publishes stored since start
	Delivered   float64 // records delivered since start
	Refused     float64 // publishes refused since start
	MaxGroupLag float64 // the largest group lag, in records, at At
}

// Ring keeps the last samples a node took, for rates and sparklines. It is
// a fixed array: its memory does not grow with uptime.
type Ring struct {
	mu    sync.Mutex
	buf   []Sample
	next  int // where the next sample goes
	count int
}

// NewRing keeps the last n samples.
func NewRing(n int) *Ring {
	return &Ring{buf: make([]Sample, max(n, 2))}
}

// Add records s, dropping the oldest sample when the ring is full.
func (r *Ring) Add(s Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.count = min(r.count+1, len(r.buf))
}

// Samples returns the samples, oldest first.
func (r *Ring) Samples() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Sample, 0, r.count)
	start := (r.next - r.count + len(r.buf)) % len(r.buf)
	for i := range r.count {
		out = append(out, r.buf[(start+i)%len(r.buf)])
	}
	return out
}

// RatesSince returns the per-second rates between the oldest sample no
// older than window before now's sample and now. With no such sample
// (a node younger than one sampling interval) the rates are 0.
func RatesSince(samples []Sample, now Sample, window time.Duration) Rates {
	var from *Sample
	for i := range samples {
		if now.At.Sub(samples[i].At) <= window {
			from = &samples[i]
			break
		}
	}
	if from == nil {
		return Rates{}
	}
	secs := now.At.Sub(from.At).Seconds()
	if secs <= 0 {
		return Rates{}
	}
	rate := func(a, b float64) float64 { return max(b-a, 0) / secs }
	return Rates{
		WindowSeconds: secs,
		Published:     rate(from.Published, now.Published),
		Delivered:     rate(from.Delivered, now.Delivered),
		Refused:       rate(from.Refused, now.Refused),
	}
}

// HistoryOf turns consecutive samples into per-interval rates (one point
// fewer than samples) and the lag gauge beside them.
func HistoryOf(samples []Sample, interval time.Duration) History {
	h := History{IntervalSeconds: interval.Seconds(), Published: []float64{}, Delivered: []float64{}, MaxGroupLag: []float64{}}
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1], samples[i]
		secs := b.At.Sub(a.At).Seconds()
		if secs <= 0 {
			continue
		}
		h.Published = append(h.Published, max(b.Published-a.Published, 0)/secs)
		h.Delivered = append(h.Delivered, max(b.Delivered-a.Delivered, 0)/secs)
		h.MaxGroupLag = append(h.MaxGroupLag, b.MaxGroupLag)
	}
	return h
}
