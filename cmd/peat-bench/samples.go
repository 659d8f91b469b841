package main

import (
	"slices"
	"time"
)

// samples keeps latency samples in nanoseconds.
type samples struct{ v []int64 }

func newSamples() *samples      { return &samples{} }
func (s *samples) add(ns int64) { s.v = append(s.v, ns) }
func (s *samples) merge(o *samples) {
	s.v = append(s.v, o.v...)
}

// quantile returns the q-quantile in milliseconds, or 0 with no samples.
func (s *samples) quantile(q float64) float64 {
	if len(s.v) == 0 {
		return 0
	}
	slices.Sort(s.v)
	i := int(q * float64(len(s.v)-1))
	return float64(s.v[i]) / float64(time.Millisecond)
}
