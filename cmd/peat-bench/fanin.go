package main

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// faninConfig describes one fan-in run: publishers send to bench/<id>,
// subscribers take bench/#.
type faninConfig struct {
	Addr        string
	Publishers  int
	Subscribers int
	QoS         byte // of publishes and subscriptions
	Window      int  // QoS 1 publishes in flight per publisher
	Payload     int  // bytes, at least headerLen
	Rate        int  // total msg/s across publishers; 0 = as fast as acks allow
	Count       int  // messages per publisher
	Drain       time.Duration
}

// Each payload starts with publisher id, sequence and intended send time, so
// loss and duplicates are counted exactly and latency includes queueing.
const headerLen = 4 + 8 + 8

type faninResult struct {
	Sent, Acked    int64
	Received, Dups int64
	Lost           int64
	// Elapsed runs from the first publish to the last delivery: when
	// messages are missing, the final silent Drain is not counted.
	Elapsed time.Duration
	// Publishing is how long the publishers took to send everything: far
	// above Count/Rate means the generator, not the broker, set the pace.
	Publishing  time.Duration
	Puback, E2E *samples
}

func runFanin(cfg faninConfig) (*faninResult, error) {
	if cfg.Payload < headerLen {
		cfg.Payload = headerLen
	}
	res := &faninResult{Puback: newSamples(), E2E: newSamples()}
	subs := make([]*subscriber, cfg.Subscribers)
	for i := range subs {
		c, err := dial(cfg.Addr, fmt.Sprintf("bench-sub-%d", i), defaultDial)
		if err != nil {
			return nil, err
		}
		if err := c.subscribe("bench/#", cfg.QoS); err != nil {
			return nil, err
		}
		subs[i] = newSubscriber(c, cfg.Publishers, cfg.Count)
		go subs[i].run()
	}
	pubs := make([]*conn, cfg.Publishers)
	for i := range pubs {
		c, err := dial(cfg.Addr, fmt.Sprintf("bench-pub-%d", i), defaultDial)
		if err != nil {
			return nil, err
		}
		pubs[i] = c
	}

	start := time.Now()
	var wg sync.WaitGroup
	var sent, acked atomic.Int64
	var mu sync.Mutex
	for i, c := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := newSamples()
			s, a := publish(c, uint32(i), cfg, start, lat)
			sent.Add(s)
			acked.Add(a)
			mu.Lock()
			res.Puback.merge(lat)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Publishing = time.Since(start)
	res.Sent, res.Acked = sent.Load(), acked.Load()
	expected := res.Sent
	if cfg.QoS > 0 {
		expected = res.Acked
	}
	for _, s := range subs {
		s.waitFor(expected, cfg.Drain)
	}
	res.Elapsed = time.Since(start)
	for _, s := range subs {
		s.stop()
		res.Received += s.received
		res.Dups += s.dups
		res.Lost += expected - s.unique
		res.E2E.merge(s.lat)
	}
	if res.Lost > 0 && res.Elapsed-cfg.Drain > res.Publishing {
		// waitFor gave up after Drain without a delivery: that silence
		// is not delivery time.
		res.Elapsed -= cfg.Drain
	}
	for _, c := range pubs {
		c.close()
	}
	return res, nil
}

// publish sends cfg.Count messages on c and returns how many were sent and
// acknowledged. QoS 1 publishes keep at most cfg.Window in flight.
func publish(c *conn, id uint32, cfg faninConfig, start time.Time, lat *samples) (sent, acked int64) {
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(cfg.Publishers) / float64(cfg.Rate))
	}
	window := make(chan struct{}, max(cfg.Window, 1))
	var sentAt [65536]int64
	done := make(chan struct{})
	if cfg.QoS > 0 {
		go func() {
			defer close(done)
			for acked < int64(cfg.Count) {
				pk, err := c.read()
				if err != nil {
					return
				}
				if pk.FixedHeader.Type == packets.Puback {
					lat.add(time.Now().UnixNano() - atomic.LoadInt64(&sentAt[pk.PacketID]))
					acked++
					<-window
				}
			}
		}()
	}
	payload := make([]byte, cfg.Payload)
	binary.BigEndian.PutUint32(payload, id)
	for seq := 0; seq < cfg.Count; seq++ {
		intended := time.Now()
		if interval > 0 {
			intended = start.Add(time.Duration(seq) * interval)
			if d := time.Until(intended); d > 0 {
				time.Sleep(d)
			}
		}
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: cfg.QoS},
			ProtocolVersion: 4,
			TopicName:       fmt.Sprintf("bench/%d", id),
			Payload:         payload,
		}
		if cfg.QoS > 0 {
			window <- struct{}{}
			pk.PacketID = uint16(seq%65535) + 1
			atomic.StoreInt64(&sentAt[pk.PacketID], intended.UnixNano())
		}
		binary.BigEndian.PutUint64(payload[4:], uint64(seq))
		binary.BigEndian.PutUint64(payload[12:], uint64(intended.UnixNano()))
		if err := c.write(&pk); err != nil {
			break
		}
		sent++
	}
	if cfg.QoS > 0 {
		select {
		case <-done:
		case <-time.After(cfg.Drain + 10*time.Second):
			c.Close()
			<-done
		}
	}
	return sent, acked
}
