package main

import "testing"

// A replay under load reports the latencies of the live messages sent while
// it ran, apart from the ones before and after it.
func TestSamples_WithinKeepsTheWindowsMessages(t *testing.T) {
	s := newSamples()
	for sent := int64(0); sent < 100; sent++ {
		lat := int64(1e6) // 1 ms outside the window
		if sent >= 40 && sent <= 59 {
			lat = 50e6 // 50 ms inside it
		}
		s.addSent(lat, sent)
	}
	if got := s.quantile(0.5); got != 1 {
		t.Fatalf("median of all = %v ms, want 1", got)
	}
	w := s.within(40, 59)
	if len(w.v) != 20 {
		t.Fatalf("within kept %d samples, want 20", len(w.v))
	}
	// quantile above must not have reordered the latencies away from their send times.
	if got := w.quantile(0); got != 50 {
		t.Fatalf("fastest in the window = %v ms, want 50", got)
	}
	if got := s.within(100, 200); len(got.v) != 0 {
		t.Fatalf("an empty window kept %d samples", len(got.v))
	}
}
