package main

import (
	"slices"
	"time"
)

// samples keeps latency samples in nanoseconds and, for samples added with
// addSent, when each message was meant to be sent (unix ns), so the ones
// sent within a window can be taken apart (within).
type samples struct{ v, sent []int64 }

func newSamples() *samples      { return &samples{} }
func (s *samples) add(ns int64) { s.v = append(s.v, ns) }

// addSent adds a latency of ns for a message meant to be sent at sent.
func (s *samples) addSent(ns, sent int64) {
	s.v = append(s.v, ns)
	s.sent = append(s.sent, sent)
}

func (s *samples) merge(o *samples) {
	s.v = append(s.v, o.v...)
	s.sent = append(s.sent, o.sent...)
}

// within returns the samples of messages meant to be sent in [from, to]
// (unix ns). Only samples added with addSent have a send time.
func (s *samples) within(from, to int64) *samples {
	w := newSamples()
	if len(s.sent) != len(s.v) {
		return w
	}
	for i, at := range s.sent {
		if at >= from && at <= to {
			w.addSent(s.v[i], at)
		}
	}
	return w
}

// quantile returns the q-quantile in milliseconds, or 0 with no samples.
// It sorts a copy: the samples keep their order, and their send times.
func (s *samples) quantile(q float64) float64 {
	if len(s.v) == 0 {
		return 0
	}
	v := slices.Clone(s.v)
	slices.Sort(v)
	i := int(q * float64(len(v)-1))
	return float64(v[i]) / float64(time.Millisecond)
}
