package main

import (
	"context"
	"testing"
	"time"

	"github.com/peatmq/peat/edge"
	"github.com/peatmq/peat/logstore"
)

// startPeat runs a Peat node in process on a free loopback port, its log in
// a temporary directory, and returns its MQTT address.
func startPeat(t *testing.T) string {
	t.Helper()
	cfg := edge.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = ""
	cfg.Storage.Profile = string(logstore.ProfileServer)
	cfg.Streams[0].Durability = string(logstore.DurabilityInterval)
	n, err := edge.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return n.MQTTAddr().String()
}

// filledPeat is a Peat node holding fill records 0..fill-1 on
// bench/replay/<i%16>, written by the workload's own fill.
func filledPeat(t *testing.T, fill int) string {
	t.Helper()
	addr := startPeat(t)
	res, err := runReplay(replayConfig{Addr: addr, Fill: fill, FillConns: 3, FillWindow: 16, Payload: 64})
	if err != nil {
		t.Fatalf("fill: %v", err)
	}
	if res.FillAcked != int64(fill) {
		t.Fatalf("fill: %d acked, want %d", res.FillAcked, fill)
	}
	return addr
}

// replayRun is a replay of count records of the node at addr, QoS 1 with
// MQTT 5 and a window of 10 unless changed.
func replayRun(addr string, count int, filters ...string) replayConfig {
	return replayConfig{Addr: addr, Count: count, From: "earliest", Filters: filters, QoS: 1, Version: 5,
		Window: 10, First: -1, Idle: time.Second}
}

func TestReplay_DeliversEveryOffsetOnceInOrder(t *testing.T) {
	const n = 600
	addr := filledPeat(t, n)
	for _, tc := range []struct {
		name         string
		qos, version byte
	}{
		{"QoS0-v5", 0, 5}, {"QoS1-v5", 1, 5}, {"QoS1-v3", 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := replayRun(addr, n, "bench/replay/#")
			cfg.QoS, cfg.Version = tc.qos, tc.version
			cfg.Linger = 300 * time.Millisecond
			res, err := runReplay(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.First != 0 || res.Received != n || res.Unique != n || res.Missing != 0 || res.Dups != 0 ||
				res.Reordered != 0 || res.Outside != 0 || res.BadTopics != 0 {
				t.Fatalf("first %d received %d unique %d missing %d dups %d reordered %d outside %d bad topics %d; "+
					"want offsets 0..%d once each, in order", res.First, res.Received, res.Unique, res.Missing, res.Dups,
					res.Reordered, res.Outside, res.BadTopics, n-1)
			}
		})
	}
}

func TestReplay_CountsGaps(t *testing.T) {
	const n = 320
	addr := filledPeat(t, n)

	// A filter that misses 15 of the 16 topics: only offsets 3, 19, ...
	// arrive, the rest of 0..319 are gaps.
	cfg := replayRun(addr, n, "bench/replay/3")
	cfg.Idle = 500 * time.Millisecond
	res, err := runReplay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Received != n/16 || res.Unique != n/16 || res.Missing != n-n/16 || res.Dups != 0 || res.Reordered != 0 {
		t.Errorf("filter on one topic: received %d unique %d missing %d dups %d reordered %d; want %d, %d, %d missing, 0, 0",
			res.Received, res.Unique, res.Missing, res.Dups, res.Reordered, n/16, n/16, n-n/16)
	}

	// Expecting more than the log holds: the offsets past its end are gaps.
	cfg = replayRun(addr, n+50, "bench/replay/#")
	cfg.Idle = 500 * time.Millisecond
	if res, err = runReplay(cfg); err != nil {
		t.Fatal(err)
	}
	if res.Unique != n || res.Missing != 50 || res.Outside != 0 {
		t.Errorf("past the end: unique %d missing %d outside %d; want %d, 50, 0", res.Unique, res.Missing, res.Outside, n)
	}

	// A decimal <from>: the SUBACK's start is the first offset expected.
	cfg = replayRun(addr, n-100, "bench/replay/#")
	cfg.From = "100"
	if res, err = runReplay(cfg); err != nil {
		t.Fatal(err)
	}
	if res.First != 100 || res.Unique != n-100 || res.Missing != 0 || res.Outside != 0 {
		t.Errorf("from 100: first %d unique %d missing %d outside %d; want 100, %d, 0, 0", res.First, res.Unique, res.Missing, res.Outside, n-100)
	}
}

func TestReplay_CountsDuplicates(t *testing.T) {
	const n = 300
	addr := filledPeat(t, n)
	// Two replay subscriptions covering the same records: the broker sends
	// every offset twice, on the same delivered topics.
	cfg := replayRun(addr, n, "bench/replay/#", "bench/replay/+")
	cfg.Linger = 500 * time.Millisecond
	res, err := runReplay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Received != 2*n || res.Unique != n || res.Dups != n || res.Missing != 0 {
		t.Fatalf("received %d unique %d dups %d missing %d; want %d, %d, %d, 0", res.Received, res.Unique, res.Dups, res.Missing, 2*n, n, n)
	}
}

func TestOffsetCheck_CountsExactly(t *testing.T) {
	ck := newOffsetCheck(10, 6) // expects 10..15
	for _, off := range []int64{10, 11, 13, 12, 12, 15, 9, 16, 11} {
		ck.add(off)
	}
	// 14 never came; 12 and 11 came twice; 12 came after 13; 9 and 16 are
	// outside the range.
	if ck.received != 9 || ck.unique != 5 || ck.dups != 2 || ck.reordered != 1 || ck.outside != 2 || ck.done() {
		t.Fatalf("received %d unique %d dups %d reordered %d outside %d done %v; want 9, 5, 2, 1, 2, false",
			ck.received, ck.unique, ck.dups, ck.reordered, ck.outside, ck.done())
	}
}

func TestReplayOffset_ParsesTheDeliveredTopic(t *testing.T) {
	for _, tc := range []struct {
		topic string
		off   int64
		ok    bool
	}{
		{"$replay/earliest/42/bench/replay/3", 42, true},
		{"$replay/-1h/0/a", 0, true},
		{"$replay/earliest/x1/a", 0, false},
		{"$replay/earliest/42", 0, false}, // no original topic
		{"$replay/earliest//a", 0, false},
		{"$group/g/42/a", 0, false},
		{"bench/replay/3", 0, false},
	} {
		off, ok := replayOffset([]byte(tc.topic))
		if ok != tc.ok || (ok && off != tc.off) {
			t.Errorf("replayOffset(%q) = %d, %v; want %d, %v", tc.topic, off, ok, tc.off, tc.ok)
		}
	}
}
