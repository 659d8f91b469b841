package status

import (
	"testing"
	"time"
)

// The page's formats; status.js repeats them for live updates.
func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{FormatCount(0), "0"},
		{FormatCount(1234567), "1,234,567"},
		{FormatCount(999), "999"},
		{FormatBytes(897), "897 B"},
		{FormatBytes(1536), "1.5 KiB"},
		{FormatBytes(-1), "off"},
		{FormatDuration(59.9), "59s"},
		{FormatDuration(61), "1m 1s"},
		{FormatDuration(3600), "1h"},
		{FormatDuration(7 * 86400), "7d"},
		{FormatDuration(7*86400 + 7200), "7d 2h"},
		{FormatRetention(Retention{}), "unlimited"},
		{FormatRetention(Retention{MaxAgeSeconds: 86400, MaxBytes: 1 << 30}), "1d, 1.0 GiB"},
		{sparkPoints(nil), ""},
		{sparkPoints([]float64{0, 2, 1}), "0.0,31.0 60.0,1.0 120.0,16.0"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// Rates come from the oldest sample within the window.
func TestRatesSince(t *testing.T) {
	r := NewRing(3)
	at := func(s int) Sample {
		return Sample{At: t0.Add(secs(s)), Published: float64(10 * s), Delivered: float64(s)}
	}
	for _, s := range []int{0, 30, 60, 90} { // 0 falls out of the ring
		r.Add(at(s))
	}
	got := RatesSince(r.Samples(), at(100), secs(60))
	if got.WindowSeconds != 40 || got.Published != 10 || got.Delivered != 1 {
		t.Errorf("RatesSince = %+v, want 40 s at 10/s and 1/s", got)
	}
	if h := HistoryOf(r.Samples(), secs(30)); len(h.Published) != 2 || h.Published[0] != 10 {
		t.Errorf("HistoryOf = %+v, want two points of 10/s", h)
	}
	if got := RatesSince(nil, at(5), secs(60)); got != (Rates{}) {
		t.Errorf("RatesSince without samples = %+v, want zero", got)
	}
}

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func secs(n int) time.Duration { return time.Duration(n) * time.Second }
