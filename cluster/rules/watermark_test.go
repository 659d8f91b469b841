package rules

import (
	"slices"
	"testing"
	"time"
)

func TestTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := NewTracker("a", []string{"a", "b", "c"}, t0)

	if hw := tr.HW(10); hw != 0 {
		t.Fatalf("hw before any fetch = %d, want 0 (waits for b and c)", hw)
	}
	tr.Fetched("b", 1, 10, 10, at(1))
	if hw := tr.HW(10); hw != 0 {
		t.Fatalf("hw with c unknown = %d, want 0", hw)
	}
	tr.Fetched("c", 1, 4, 10, at(2))
	if hw := tr.HW(12); hw != 4 {
		t.Fatalf("hw = %d, want c's end 4", hw)
	}
	tr.Fetched("c", 1, 12, 12, at(3))
	if hw := tr.HW(12); hw != 10 {
		t.Fatalf("hw = %d, want b's end 10", hw)
	}
	tr.SetISR([]string{"a", "c"}) // b dropped: only c and the leader count
	if hw := tr.HW(12); hw != 12 {
		t.Fatalf("hw after dropping b = %d, want 12", hw)
	}
	tr.SetISR([]string{"a"})
	if hw := tr.HW(15); hw != 15 {
		t.Fatalf("hw of a lone leader = %d, want its log end", hw)
	}
}

func TestTracker_Laggards(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lag := 500 * time.Millisecond
	tr := NewTracker("a", []string{"a", "b", "c"}, t0)
	if got := tr.Laggards(at(400), lag, 0); len(got) != 0 {
		t.Fatalf("laggards within lag of the start = %v", got)
	}
	if got := tr.Laggards(at(600), lag, 0); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("laggards of followers that never fetched = %v, want b c", got)
	}
	// b keeps fetching what the leader had at its previous fetch while the
	// leader appends: caught up as of that previous fetch.
	tr.Fetched("b", 1, 0, 10, at(100))
	tr.Fetched("b", 1, 10, 20, at(1000))
	tr.Fetched("b", 1, 20, 30, at(1200))
	tr.Fetched("b", 1, 30, 40, at(1400))
	// c asks for the leader's end at 1.2 s, then falls behind.
	tr.Fetched("c", 1, 30, 30, at(1200))
	tr.Fetched("c", 1, 31, 60, at(1400))
	if got := tr.Laggards(at(1600), lag, 0); len(got) != 0 {
		t.Fatalf("laggards at 1.6 s = %v, want none", got)
	}
	tr.Fetched("b", 1, 40, 50, at(1650))
	tr.Fetched("c", 1, 32, 90, at(1800))
	if got := tr.Laggards(at(1800), lag, 0); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("laggards at 1.8 s = %v, want c (caught up at 1.2 s)", got)
	}
	if got := tr.Laggards(at(2000), lag, 0); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("laggards at 2.0 s = %v, want b (caught up as of 1.4 s) and c", got)
	}
}

// TestTracker_SilentFollowerIsALaggard: on an idle stream every follower
// is caught up, but one whose fetches stopped arriving is a laggard once
// silentMax has passed, long before lagMax; one in a long poll, answered
// at the end of it, is not.
func TestTracker_SilentFollowerIsALaggard(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lag, silent := 10*time.Second, 3*time.Second
	tr := NewTracker("a", []string{"a", "b", "c"}, t0)
	tr.Fetched("b", 1, 5, 5, at(100))
	tr.Fetched("c", 1, 5, 5, at(100))
	if got := tr.Laggards(at(2900), lag, silent); len(got) != 0 {
		t.Fatalf("laggards within silentMax = %v", got)
	}
	// b polls: each fetch waits 2 s at the leader, answered at its end;
	// c's fetches stopped after the first.
	for ms := 100; ms < 5000; ms += 2000 {
		tr.Fetched("b", 1, 5, 5, at(ms))
		tr.Heard("b", 1, at(ms+2000))
	}
	if got := tr.Laggards(at(5000), lag, silent); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("laggards at 5 s = %v, want c (silent since 0.1 s)", got)
	}
	if got := tr.Laggards(at(5000), lag, 0); len(got) != 0 {
		t.Fatalf("laggards at 5 s with no silence bound = %v, want none within lagMax", got)
	}
	tr.Heard("b", 2, at(9000)) // another broker epoch: not this replica
	if got := tr.Laggards(at(9500), lag, silent); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("laggards at 9.5 s = %v, want b (last heard at 6.1 s) and c", got)
	}
}

func TestTracker_Joiners(t *testing.T) {
	tr := NewTracker("a", []string{"a", "b"}, time.Unix(0, 0))
	now := time.Unix(1, 0)
	tr.Fetched("b", 1, 50, 50, now)
	tr.Fetched("c", 7, 40, 50, now)
	tr.Fetched("d", 3, 50, 50, now)
	if got := tr.Joiners(tr.HW(50)); !slices.Equal(got, []ISRMember{{"d", 3}}) {
		t.Fatalf("joiners = %v, want d in epoch 3", got)
	}
	tr.Fetched("c", 8, 50, 50, now) // restarted: its new epoch
	if got := tr.Joiners(50); !slices.Equal(got, []ISRMember{{"c", 8}, {"d", 3}}) {
		t.Fatalf("joiners = %v, want c in epoch 8 and d", got)
	}
}

// A joiner counts towards the watermark from the moment it is named until
// the ISR takes it or its proposal is dropped: the watermark must not pass
// its log end while it is being added, or a record committed meanwhile
// would be missing on an ISR member that may be elected (TestSite_LeaderKill
// once saw a new leader 2 records short of the watermark so).
func TestTracker_JoinerHoldsTheWatermark(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker("a", []string{"a", "b"}, t0)
	tr.Fetched("b", 1, 50, 50, t0)
	tr.Fetched("c", 7, 50, 50, t0)
	if got := tr.Joiners(tr.HW(50)); !slices.Equal(got, []ISRMember{{"c", 7}}) {
		t.Fatalf("joiners = %v, want c", got)
	}
	tr.Fetched("b", 1, 80, 80, t0)
	if hw := tr.HW(80); hw != 50 {
		t.Fatalf("hw while c is joining = %d, want c's end 50", hw)
	}
	tr.Fetched("c", 7, 70, 80, t0)
	if hw := tr.HW(80); hw != 70 {
		t.Fatalf("hw while c is joining = %d, want c's end 70", hw)
	}
	tr.SetISR([]string{"a", "b", "c"}) // the controller committed it
	if hw := tr.HW(80); hw != 70 || len(tr.joining) != 0 {
		t.Fatalf("hw with c in the ISR = %d (joining %v), want 70", hw, tr.joining)
	}

	// A proposal that failed stops holding the watermark.
	tr = NewTracker("a", []string{"a", "b"}, t0)
	tr.Fetched("b", 1, 50, 50, t0)
	tr.Fetched("c", 7, 50, 50, t0)
	tr.Joiners(tr.HW(50))
	tr.Fetched("b", 1, 80, 80, t0)
	tr.KeepJoining(nil)
	if hw := tr.HW(80); hw != 80 {
		t.Fatalf("hw after the proposal failed = %d, want b's end 80", hw)
	}
}
