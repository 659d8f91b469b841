package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Crash test shape: rounds of kill -9 under load, on one data directory.
const (
	crashRounds     = 5
	crashPublishers = 4
	crashWindow     = 32   // QoS 1 publishes in flight per client
	crashMaxKillAt  = 3000 // the kill comes after a random number of acks below this
	crashLive       = 100  // messages published to a live subscriber after the last restart
)

// TestCrash_KillDuringQoS1LoadLosesNoAcknowledgedMessage runs peat serve,
// publishes QoS 1 from several clients with many messages in flight, kills
// the process with SIGKILL at a random moment, and checks the log: every
// acknowledged message is there exactly once, nothing is there twice, and
// offsets are contiguous. It repeats that on the same data directory, then
// restarts once more and checks the HTTP API and a live subscriber.
//
// PEAT_CRASH_SEED=n replays the kill points of an earlier run.
func TestCrash_KillDuringQoS1LoadLosesNoAcknowledgedMessage(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PEAT_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("PEAT_CRASH_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (rerun with PEAT_CRASH_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x9ea7))

	data := t.TempDir()
	acked := make(map[string]bool) // payloads PUBACKed, every round
	for round := range crashRounds {
		killAt := rng.IntN(crashMaxKillAt)
		jitter := time.Duration(rng.IntN(3000)) * time.Microsecond
		n := crashRound(t, data, round, killAt, jitter, acked)
		t.Logf("round %d: killed after %d acks (+%v): %d acknowledged this round", round, killAt, jitter, n)
		checkCrashLog(t, data, acked)
		if t.Failed() {
			return
		}
	}

	// After the last crash: the API counts at least every acknowledged
	// message, and a live subscriber gets new messages, at the next offsets.
	p := startPeat(t, data)
	before := p.stream("default")
	if before.NextOffset < uint64(len(acked)) || before.CommittedOffset != before.NextOffset {
		t.Fatalf("after restart /api/v1/streams says %+v, want next_offset >= %d acknowledged and committed = next", before, len(acked))
	}
	sub := newSubscriber(t, p.mqttAddr, "crash-live-sub", "crash/#")
	pub := newPublisher(t, p.mqttAddr, "live", "crash/live", 16)
	pub.publish(crashLive)
	if got := len(pub.wait()); got != crashLive {
		t.Fatalf("%d of %d live publishes acknowledged", got, crashLive)
	}
	for seq := range crashLive {
		m := sub.next(t)
		if want := payloadOf("live", seq); string(m.Payload()) != want || m.Topic() != "crash/live" {
			t.Fatalf("live subscriber got %q on %s, want %q on crash/live", m.Payload(), m.Topic(), want)
		}
	}
	if after := p.stream("default"); after.NextOffset != before.NextOffset+crashLive {
		t.Errorf("next_offset went from %d to %d after %d publishes", before.NextOffset, after.NextOffset, crashLive)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit status %d after SIGTERM\n%s", code, p.log())
	}
	recs := readLog(t, data, "default")
	if uint64(len(recs)) != before.NextOffset+crashLive {
		t.Fatalf("log holds %d records, want %d", len(recs), before.NextOffset+crashLive)
	}
	for i, r := range recs[before.NextOffset:] {
		if want := payloadOf("live", i); string(r.Payload) != want || r.Offset != before.NextOffset+uint64(i) {
			t.Fatalf("record at offset %d is %q, want %q at offset %d", r.Offset, r.Payload, want, before.NextOffset+uint64(i))
		}
	}
}

// crashRound starts peat on data (with args added to peat serve's),
// publishes from crashPublishers clients, kills it with SIGKILL once
// killAt+jitter acknowledgements have come, and adds what was acknowledged
// to acked. It returns how many were.
func crashRound(t *testing.T, data string, round, killAt int, jitter time.Duration, acked map[string]bool, args ...string) int {
	t.Helper()
	p := startPeat(t, data, args...)
	var acks atomic.Int64
	pubs := make([]*publisher, crashPublishers)
	for i := range pubs {
		id := fmt.Sprintf("r%d-c%d", round, i)
		pubs[i] = newPublisher(t, p.mqttAddr, id, "crash/"+id, crashWindow)
		pubs[i].acks = &acks
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, pub := range pubs {
		wg.Go(func() { pub.run(-1, stop) })
	}
	deadline := time.Now().Add(time.Minute)
	for acks.Load() < int64(killAt) {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("round %d: only %d acks in a minute, want %d\n%s", round, acks.Load(), killAt, p.log())
		}
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(jitter)
	p.kill()
	close(stop)
	wg.Wait()
	n := 0
	for _, pub := range pubs {
		for _, seq := range pub.wait() {
			acked[payloadOf(pub.id, seq)] = true
			n++
		}
	}
	return n
}

// checkCrashLog reads the log of the stopped node and checks it against
// what was acknowledged.
func checkCrashLog(t *testing.T, data string, acked map[string]bool) {
	t.Helper()
	recs := readLog(t, data, "default")
	at := make(map[string]uint64, len(recs))
	for i, r := range recs {
		if r.Offset != uint64(i) {
			t.Fatalf("record %d has offset %d: offsets are not contiguous from 0", i, r.Offset)
		}
		key := string(r.Payload)
		if prev, dup := at[key]; dup {
			t.Errorf("message %q is in the log twice, at offsets %d and %d", key, prev, r.Offset)
		}
		at[key] = r.Offset
		if id, _, _ := strings.Cut(key, "/"); r.ClientID != id || r.Topic != "crash/"+id || r.QoS != 1 {
			t.Errorf("record %d: client %q topic %q qos %d, want client %q on crash/%s at QoS 1", r.Offset, r.ClientID, r.Topic, r.QoS, id, id)
		}
	}
	missing := 0
	for key := range acked {
		if _, ok := at[key]; !ok {
			if missing < 10 {
				t.Errorf("message %q was acknowledged but is not in the log", key)
			}
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d acknowledged messages are missing from the log of %d records", missing, len(recs))
	}
	// Records beyond the acknowledged ones were in flight at the kill: stored,
	// but the PUBACK never reached the client. Allowed (at least once), and
	// shown so a run says how close the kill came.
	t.Logf("log: %d records, %d acknowledged, %d stored without an ack", len(recs), len(acked), len(recs)-len(acked)+missing)
}
