package rules

import (
	"reflect"
	"testing"
)

// What the controller submits for a member follows Serf's view against
// the state's: registrations for new incarnations, failures of the
// current one only.
func TestMemberCommand(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(BrokerFailed{ID: "b", Epoch: 1})
	st, _ := ft.f.State()
	for _, tc := range []struct {
		id    string
		epoch uint64
		alive bool
		want  Command
	}{
		{"a", 1, true, nil},                    // known, alive, same epoch
		{"a", 2, true, RegisterBroker{"a", 2}}, // restarted
		{"a", 0, true, nil},                    // not tagged yet
		{"b", 1, true, RegisterBroker{"b", 1}}, // back after a partition
		{"c", 5, true, RegisterBroker{"c", 5}}, // new
		{"a", 1, false, BrokerFailed{"a", 1}},  // failed
		{"a", 0, false, nil},                   // another epoch's failure
		{"b", 1, false, nil},                   // failed already
		{"c", 1, false, nil},                   // never known
	} {
		if got := MemberCommand(st, tc.id, tc.epoch, tc.alive); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("MemberCommand(%s, %d, alive %v) = %#v, want %#v", tc.id, tc.epoch, tc.alive, got, tc.want)
		}
	}
}

// A drained broker that stopped is removed; a removed one is forgotten
// by Raft and Serf unless it is back alive and holds nothing.
func TestDrainedAndForget(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}, ReplicationFactor: 2})
	ft.ok(DrainBroker{ID: "d"})
	ft.ok(DrainBroker{ID: "a"})
	ft.ok(BrokerFailed{ID: "d", Epoch: 1})
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	st, _ := ft.f.State()
	if !Drained(st, "d") || Drained(st, "a") || Drained(st, "b") {
		t.Fatalf("Drained: d %v (stopped, holds nothing), a %v (holds s), b %v",
			Drained(st, "d"), Drained(st, "a"), Drained(st, "b"))
	}
	ft.ok(RemoveBroker{ID: "d"})
	st, _ = ft.f.State()
	if !Forget(st, "d", false) || Forget(st, "d", true) || Forget(st, "b", false) {
		t.Fatal("Forget: a removed broker dead is forgotten, back alive holding nothing is not, a live broker never")
	}
}
