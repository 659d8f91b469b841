package mqtt

import (
	"slices"
	"testing"
)

func TestProgress_ContiguousAcknowledgedPrefix(t *testing.T) {
	var got []uint64
	p := newProgress(10, func(v uint64) { got = append(got, v) })
	d12 := p.track(12) // 10 and 11 were not for this consumer
	d13 := p.track(13)
	p.track(15)
	p.untrack() // could not be queued after all
	d15 := p.track(15)
	p.scan(16)
	if v := p.get(); v != 12 {
		t.Fatalf("value with 12 unacknowledged = %d, want 12", v)
	}
	d13() // out of order: 12 still holds the prefix
	if v := p.get(); v != 12 {
		t.Fatalf("after acking 13 only: %d, want 12", v)
	}
	d12()
	if v := p.get(); v != 15 {
		t.Fatalf("after acking 12: %d, want 15 (14 was skipped, 15 is pending)", v)
	}
	d15()
	d15() // a second ack of the same delivery changes nothing
	if v := p.get(); v != 16 {
		t.Fatalf("after acking 15: %d, want 16", v)
	}
	p.scan(20) // 16..19 examined, none for this consumer
	if !slices.Equal(got, []uint64{12, 15, 16, 20}) {
		t.Fatalf("reported %v, want [12 15 16 20]", got)
	}

	old := p.track(20)
	p.reset(5) // a seek back
	old()      // an ack from before the seek does not count
	if v := p.get(); v != 5 {
		t.Fatalf("after seek to 5 and a stale ack: %d, want 5", v)
	}
	p.track(5)()
	p.scan(6)
	if v := p.get(); v != 6 {
		t.Fatalf("after acking 5: %d, want 6", v)
	}
}
