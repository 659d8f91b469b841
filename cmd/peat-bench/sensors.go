package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// sensorsConfig describes a run of many mostly idle connections: each one
// publishes a small payload every 1/Rate seconds to sensors/<id>, like a
// field of sensors behind one gateway.
type sensorsConfig struct {
	Addr        string
	Connections int
	Rate        float64 // msg/s per connection
	QoS         byte
	Payload     int           // bytes, at least headerLen
	Duration    time.Duration // of the publishing phase
	Settle      time.Duration // wait after all are connected, before measuring and publishing
	Dialers     int           // connections opened at once
	PID         int           // broker process, for RSS and CPU
}

// sensorsResult is what a run measured. RSS figures are bytes of the broker.
type sensorsResult struct {
	Connected                int
	Sent, Acked, Errors      int64
	RSSIdle, RSSConnected    int64
	RSSEnd, RSSMax, HWM      int64
	CPU                      time.Duration // broker CPU during the publishing phase
	ConnectTime, PublishTime time.Duration
	Puback                   *samples
	FirstError               string
}

// sensorBufSize is the load generator's read buffer per connection: a
// sensor only ever reads CONNACK and PUBACK, so a few bytes are enough and a
// thousand connections cost the generator little.
const sensorBufSize = 64

// sensor is one connection and its counters. Its goroutine publishes and,
// for QoS 1, waits for each PUBACK before the next tick: a sensor has at
// most one message in flight.
type sensor struct {
	id  uint32
	c   *conn
	buf []byte // encoded PUBLISH, re-encoded in place
}

func runSensors(cfg sensorsConfig) (*sensorsResult, error) {
	if cfg.Connections <= 0 || cfg.Rate <= 0 {
		return nil, errors.New("sensors: connections and rate must be positive")
	}
	cfg.Payload = max(cfg.Payload, headerLen)
	cfg.Dialers = max(cfg.Dialers, 1)
	res := &sensorsResult{Puback: newSamples()}
	idle, _ := readProc(cfg.PID)
	res.RSSIdle = idle.rss

	sensors, err := connectSensors(cfg, res)
	defer func() {
		for _, s := range sensors {
			s.close()
		}
	}()
	if err != nil {
		return res, err
	}
	time.Sleep(cfg.Settle)
	conn, _ := readProc(cfg.PID)
	res.RSSConnected = conn.rss

	// Sample RSS once a second while publishing, to report the highest seen
	// beside the kernel's VmHWM (which also covers start-up).
	stopSampling := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		var hi int64
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				sampled <- hi
				return
			case <-t.C:
				if st, err := readProc(cfg.PID); err == nil {
					hi = max(hi, st.rss)
				}
			}
		}
	}()

	period := time.Duration(float64(time.Second) / cfg.Rate)
	start := time.Now().Add(50 * time.Millisecond)
	end := start.Add(cfg.Duration)
	var sent, acked, errs atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, s := range sensors {
		// Stagger: sensor i first fires i/N of a period after start.
		offset := time.Duration(int64(period) * int64(i) / int64(len(sensors)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := newSamples()
			st := s.run(cfg, start.Add(offset), end, period, lat)
			sent.Add(st.sent)
			acked.Add(st.acked)
			errs.Add(st.errs)
			mu.Lock()
			res.Puback.merge(lat)
			if st.err != nil && res.FirstError == "" {
				res.FirstError = st.err.Error()
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.PublishTime = time.Since(start)
	last, _ := readProc(cfg.PID)
	close(stopSampling)
	res.RSSMax = max(<-sampled, last.rss)
	res.RSSEnd, res.HWM = last.rss, last.hwm
	res.CPU = last.cpu - conn.cpu
	res.Sent, res.Acked, res.Errors = sent.Load(), acked.Load(), res.Errors+errs.Load()
	return res, nil
}

// connectSensors opens cfg.Connections connections, cfg.Dialers at a time.
// A connection that fails is counted as an error; the run goes on with the
// others.
func connectSensors(cfg sensorsConfig, res *sensorsResult) ([]*sensor, error) {
	t0 := time.Now()
	out := make([]*sensor, cfg.Connections)
	next := atomic.Int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range cfg.Dialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.Connections {
					return
				}
				s, err := dialSensor(cfg, uint32(i))
				if err != nil {
					mu.Lock()
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
					mu.Unlock()
					continue
				}
				out[i] = s
			}
		}()
	}
	wg.Wait()
	res.ConnectTime = time.Since(t0)
	sensors := out[:0]
	for _, s := range out {
		if s != nil {
			sensors = append(sensors, s)
		}
	}
	res.Connected = len(sensors)
	if len(sensors) == 0 {
		return nil, fmt.Errorf("sensors: no connection succeeded: %s", res.FirstError)
	}
	return sensors, nil
}

func dialSensor(cfg sensorsConfig, id uint32) (*sensor, error) {
	// Keep-alive well above the publishing period, so no PINGREQ is needed.
	keepalive := max(60, int(3/cfg.Rate)+1)
	c, err := dial(cfg.Addr, fmt.Sprintf("sensor-%d", id),
		dialOptions{clean: true, keepalive: uint16(min(keepalive, 65535)), readBuf: sensorBufSize})
	if err != nil {
		return nil, err
	}
	s := &sensor{id: id, c: c}

	pub := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: cfg.QoS},
		ProtocolVersion: 4,
		TopicName:       fmt.Sprintf("sensors/%d", id),
		Payload:         make([]byte, cfg.Payload),
	}
	if cfg.QoS > 0 {
		pub.PacketID = 1
	}
	binary.BigEndian.PutUint32(pub.Payload, id)
	if s.buf, err = c.Encode(pub); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("encode publish: %w", err)
	}
	return s, nil
}

type sensorStats struct {
	sent, acked, errs int64
	err               error
}

// run publishes from first until end, one message per period; with QoS 1
// it waits for each PUBACK (up to a few periods) before the next.
func (s *sensor) run(cfg sensorsConfig, first, end time.Time, period time.Duration, lat *samples) sensorStats {
	var st sensorStats
	// The packet id and the sequence and send time in the payload sit at
	// fixed places at the end of the encoded packet.
	payload := s.buf[len(s.buf)-cfg.Payload:]
	idAt := len(s.buf) - cfg.Payload - 2
	ackWait := max(3*period, 5*time.Second)
	for seq := int64(0); ; seq++ {
		at := first.Add(time.Duration(seq) * period)
		if !at.Before(end) {
			return st
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		binary.BigEndian.PutUint64(payload[4:], uint64(seq))
		binary.BigEndian.PutUint64(payload[12:], uint64(at.UnixNano()))
		pid := uint16(seq%65535) + 1
		if cfg.QoS > 0 {
			binary.BigEndian.PutUint16(s.buf[idAt:], pid)
		}
		sentAt := time.Now()
		if _, err := s.c.NetConn().Write(s.buf); err != nil {
			st.errs++
			st.err = fmt.Errorf("sensor %d: publish: %w", s.id, err)
			return st
		}
		st.sent++
		if cfg.QoS == 0 {
			continue
		}
		if err := s.waitAck(pid, sentAt.Add(ackWait)); err != nil {
			st.errs++
			st.err = fmt.Errorf("sensor %d: %w", s.id, err)
			return st
		}
		lat.add(time.Since(sentAt).Nanoseconds())
		st.acked++
	}
}

// waitAck reads until the PUBACK for pid arrives or the deadline passes.
func (s *sensor) waitAck(pid uint16, deadline time.Time) error {
	_ = s.c.NetConn().SetReadDeadline(deadline)
	for {
		pk, err := s.c.read()
		if err != nil {
			return fmt.Errorf("wait for puback %d: %w", pid, err)
		}
		if pk.FixedHeader.Type == packets.Puback && pk.PacketID == pid {
			return nil
		}
	}
}

func (s *sensor) close() {
	if s == nil {
		return
	}
	_, _ = s.c.NetConn().Write([]byte{packets.Disconnect << 4, 0})
	_ = s.c.Close()
}

func sensorsCmd(args []string) error {
	fs := flag.NewFlagSet("sensors", flag.ExitOnError)
	cfg := sensorsConfig{}
	var qos int
	var label string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.IntVar(&cfg.Connections, "connections", 1000, "sensor connections")
	fs.Float64Var(&cfg.Rate, "rate", 1, "msg/s per connection (staggered across connections)")
	fs.IntVar(&qos, "qos", 1, "QoS of publishes (0 or 1)")
	fs.IntVar(&cfg.Payload, "payload", 32, "payload bytes (at least 20)")
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "publishing phase")
	fs.DurationVar(&cfg.Settle, "settle", time.Second, "wait after connecting before measuring and publishing")
	fs.IntVar(&cfg.Dialers, "dialers", 8, "connections opened at once")
	fs.IntVar(&cfg.PID, "pid", 0, "broker process id, to report its RSS and CPU time per message")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	if qos != 0 && qos != 1 {
		return fmt.Errorf("sensors: --qos %d: want 0 or 1", qos)
	}
	cfg.QoS = byte(qos)

	res, err := runSensors(cfg)
	if err != nil {
		return err
	}
	mb := func(b int64) float64 { return round(float64(b) / (1 << 20)) }
	out := map[string]any{
		"label": label, "workload": "sensors", "connections": cfg.Connections, "connected": res.Connected,
		"rate": cfg.Rate, "qos": cfg.QoS, "payload": cfg.Payload,
		"connect_s": round(res.ConnectTime.Seconds()), "seconds": round(res.PublishTime.Seconds()),
		"sent": res.Sent, "acked": res.Acked, "errors": res.Errors,
		"puback_p50_ms": round(res.Puback.quantile(0.5)), "puback_p99_ms": round(res.Puback.quantile(0.99)),
		"puback_p999_ms": round(res.Puback.quantile(0.999)),
	}
	if res.FirstError != "" {
		out["first_error"] = res.FirstError
	}
	if cfg.PID > 0 {
		out["rss_idle_mb"] = mb(res.RSSIdle)
		out["rss_connected_mb"] = mb(res.RSSConnected)
		out["rss_max_mb"] = mb(res.RSSMax)
		out["rss_end_mb"] = mb(res.RSSEnd)
		out["rss_peak_mb"] = mb(res.HWM)
		n := res.Acked // messages the broker took responsibility for
		if cfg.QoS == 0 {
			n = res.Sent
		}
		if n > 0 {
			out["cpu_us_per_msg"] = round(float64(res.CPU.Microseconds()) / float64(n))
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
