package rules

import (
	"testing"
	"time"
)

func TestSessionLive(t *testing.T) {
	t0 := time.Unix(1000, 0)
	timeout := 3 * time.Second
	for _, c := range []struct {
		name           string
		heard, leading time.Time
		now            time.Time
		want           bool
	}{
		{"heard just now", t0, t0.Add(-time.Hour), t0.Add(time.Second), true},
		{"heard too long ago", t0, t0.Add(-time.Hour), t0.Add(timeout), false},
		{"never heard, new controller: a whole session of grace", time.Time{}, t0, t0.Add(timeout - time.Millisecond), true},
		{"never heard, grace over", time.Time{}, t0, t0.Add(timeout), false},
		{"heard before this controller led: counted from its start", t0.Add(-time.Hour), t0, t0.Add(2 * time.Second), true},
	} {
		if got := SessionLive(c.heard, c.leading, c.now, timeout); got != c.want {
			t.Errorf("%s: SessionLive = %v", c.name, got)
		}
		if exp := SessionExpiry(c.heard, c.leading, timeout); c.want != c.now.Before(exp) {
			t.Errorf("%s: SessionExpiry %v disagrees with SessionLive at %v", c.name, exp, c.now)
		}
	}
}

// A leader stops before the controller can fence it: the self-fence
// counts from the heartbeat's send, which is no later than the
// controller's receipt, and ends sooner.
func TestSelfFenceAfter_BeforeTheSessionExpires(t *testing.T) {
	for _, s := range []time.Duration{time.Second, 3 * time.Second, 10 * time.Second} {
		if f := SelfFenceAfter(s); f <= 0 || f >= s {
			t.Errorf("SelfFenceAfter(%v) = %v", s, f)
		}
	}
	if !HeartbeatCounts(100*time.Millisecond, time.Second) || HeartbeatCounts(time.Second, time.Second) {
		t.Error("HeartbeatCounts: a broker counts only while its Raft hears the controller")
	}
}
