package rules

import (
	"slices"
	"testing"
	"time"
)

// A leader's proposal drops its laggards and adds the joiners that are
// alive replicas in the broker epoch they caught up in; nothing to change,
// or a state that no longer names it leader in its epoch, proposes nothing.
func TestProposeISR(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc()})
	ft.ok(AlterISR{Name: "s", Leader: "a", LeaderEpoch: 1, Version: 1, ISR: []ISRMember{{"a", 1}, {"b", 1}}})
	st, _ := ft.f.State()

	c, added, ok := ProposeISR(st, "s", "a", 1, []string{"b"}, []ISRMember{{"c", 1}})
	if !ok || !slices.Equal(added, []string{"c"}) || c.Version != 2 || c.LeaderEpoch != 1 ||
		!slices.Equal(c.ISR, []ISRMember{{"a", 1}, {"c", 1}}) {
		t.Fatalf("ProposeISR = %+v %v %v", c, added, ok)
	}
	ft.ok(c) // the controller takes it
	st, _ = ft.f.State()
	if !slices.Equal(st.Streams["s"].ISR, []string{"a", "c"}) {
		t.Fatalf("ISR after the proposal: %v", st.Streams["s"].ISR)
	}

	for name, tc := range map[string]struct {
		self     string
		epoch    uint32
		laggards []string
		joiners  []ISRMember
	}{
		"nothing to change":         {"a", 1, nil, nil},
		"not the leader":            {"b", 1, []string{"c"}, nil},
		"an older leader epoch":     {"a", 0, []string{"c"}, nil},
		"a joiner in an old epoch":  {"a", 1, nil, []ISRMember{{"b", 0}}},
		"a joiner not a replica":    {"a", 1, nil, []ISRMember{{"d", 1}}},
		"a joiner already in there": {"a", 1, nil, []ISRMember{{"c", 1}}},
	} {
		if c, _, ok := ProposeISR(st, "s", tc.self, tc.epoch, tc.laggards, tc.joiners); ok {
			t.Errorf("%s: proposed %+v", name, c)
		}
	}
	if _, added, ok := ProposeISR(st, "s", "a", 1, nil, []ISRMember{{"b", 1}}); !ok || !slices.Equal(added, []string{"b"}) {
		t.Fatal("b, alive and caught up, not proposed")
	}
	ft.ok(BrokerFailed{ID: "b", Epoch: 1})
	st, _ = ft.f.State()
	if c, _, ok := ProposeISR(st, "s", "a", 1, nil, []ISRMember{{"b", 1}}); ok {
		t.Fatalf("a failed joiner proposed: %+v", c)
	}
}

// A leader commits only while the state names it leader in its epoch and
// it is in touch with the controller.
func TestMayCommit(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}})
	st, _ := ft.f.State()
	hb := time.Second
	for _, tc := range []struct {
		self       string
		epoch      uint32
		controller bool
		since      time.Duration
		want       bool
	}{
		{"a", 1, false, 500 * time.Millisecond, true},
		{"a", 1, false, time.Second, false}, // cut off for a heartbeat timeout
		{"a", 1, true, time.Hour, true},     // the controller itself
		{"a", 2, true, 0, false},            // another epoch
		{"b", 1, true, 0, false},            // not the leader
	} {
		if got := MayCommit(st, "s", tc.self, tc.epoch, InTouch(tc.controller, tc.since, hb)); got != tc.want {
			t.Errorf("%+v: MayCommit = %v", tc, got)
		}
	}
	if MayCommit(st, "nope", "a", 1, true) {
		t.Error("an unknown stream commits")
	}
}

func TestMinInsync(t *testing.T) {
	for _, tc := range []struct{ configured, replicas, want int }{
		{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 5, 2}, {3, 5, 3}, {1, 3, 1},
	} {
		if got := MinInsync(tc.configured, tc.replicas); got != tc.want {
			t.Errorf("MinInsync(%d, %d) = %d, want %d", tc.configured, tc.replicas, got, tc.want)
		}
	}
}

func TestTruncateTo(t *testing.T) {
	for _, tc := range []struct {
		leaderEnd, ownEnd uint64
		haveOwn           bool
		logEnd, want      uint64
		cut               bool
	}{
		{10, 8, true, 12, 8, true},    // its own epoch ended earlier
		{10, 12, true, 12, 10, true},  // the leader's ended earlier
		{10, 0, false, 12, 10, true},  // no records of that epoch here
		{10, 12, true, 10, 10, false}, // nothing past the leader's end
		{15, 20, true, 12, 15, false},
	} {
		got, cut := TruncateTo(tc.leaderEnd, tc.ownEnd, tc.haveOwn, tc.logEnd)
		if cut != tc.cut || (cut && got != tc.want) {
			t.Errorf("%+v: TruncateTo = %d %v", tc, got, cut)
		}
	}
}

// The watermark waits for min_insync_replicas, never goes back, and the
// members holding everything are those that fetched the leader's end.
func TestTracker_Advance(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker("a", []string{"a", "b", "c"}, t0)
	tr.SetMinInsync(2)
	tr.Fetched("b", 1, 10, 10, t0)
	tr.Fetched("c", 7, 6, 10, t0)
	if hw, ok := tr.Advance(10, 0); !ok || hw != 6 {
		t.Fatalf("Advance = %d %v, want 6", hw, ok)
	}
	if _, ok := tr.Advance(10, 6); ok {
		t.Fatal("Advance to where the watermark is")
	}
	if got := tr.HoldingAll(10); !slices.Equal(got, []ISRMember{{"b", 1}}) {
		t.Fatalf("HoldingAll = %v", got)
	}
	tr.SetISR([]string{"a"})
	if tr.InSync() {
		t.Fatal("in sync with 1 of min 2")
	}
	if _, ok := tr.Advance(10, 6); ok {
		t.Fatal("moved below min_insync_replicas")
	}
	tr.SetMinInsync(1)
	if hw, ok := tr.Advance(10, 6); !ok || hw != 10 || !tr.InSync() {
		t.Fatalf("Advance alone = %d %v", hw, ok)
	}
	if p := tr.Positions(); p["b"].LogEnd != 10 || p["c"].BrokerEpoch != 7 || len(p) != 2 {
		t.Fatalf("Positions = %v", p)
	}
}

// A node leads what the state gives it only once the state registered
// its current incarnation; it follows whoever else leads.
func TestLeader(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}})
	st, _ := ft.f.State()
	for _, tc := range []struct {
		name, self string
		epoch      uint64
		leader     string
		ok         bool
	}{
		{"s", "a", 1, "a", true}, // leads, registered
		{"s", "a", 2, "", false}, // restarted, not registered yet
		{"s", "b", 1, "a", true}, // follows
		{"s", "c", 9, "a", true}, // an observer follows too
		{"x", "a", 1, "", false}, // no such stream
	} {
		leader, epoch, ok := Leader(st, tc.name, tc.self, tc.epoch)
		if leader != tc.leader || ok != tc.ok || (ok && epoch != 1) {
			t.Errorf("%+v: Leader = %q %d %v", tc, leader, epoch, ok)
		}
	}
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(BrokerFailed{ID: "b", Epoch: 1}) // the stream goes offline under b
	st, _ = ft.f.State()
	if l, _, ok := Leader(st, "s", "b", 1); ok {
		t.Fatalf("offline stream led by %q", l)
	}
}

// A proposal that timed out may commit later, so long as the stream's
// version is the one it named: its joiners keep holding the watermark
// (a refusal of a later proposal does not drop them) until the version
// moves, after which it can never commit.
func TestStillJoining_UnansweredProposalHoldsItsJoiners(t *testing.T) {
	u := Unanswered{Version: 7, Added: []string{"n3"}}
	if got := StillJoining([]string{"n1", "n2"}, nil, u, 7); !slices.Contains(got, "n3") {
		t.Fatalf("at the version it named: %v, want n3 kept", got)
	}
	if got := StillJoining([]string{"n1", "n2"}, nil, u, 8); slices.Contains(got, "n3") {
		t.Fatalf("after the version moved: %v, want n3 dropped", got)
	}
	if got := StillJoining([]string{"n1"}, []string{"n3"}, u, 7); len(got) != 2 {
		t.Fatalf("n3 both proposed again and unanswered: %v, want it once", got)
	}
	if got := StillJoining([]string{"n1"}, nil, Unanswered{}, 0); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("none unanswered: %v", got)
	}
}
