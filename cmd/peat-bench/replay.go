package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The replay workload (W4): fill the broker's log with Count
// records on bench/replay/<i%16>, then read them back through
// $replay/<from>/+/<filter> and check that every offset arrives exactly
// once and in order, while sampling the broker's RSS.

// replayTopics is how many topics the fill spreads its records over.
const replayTopics = 16

// replayConfig describes one run: a fill, a replay, or both.
type replayConfig struct {
	Addr string

	// Fill publishes this many records first (0: the broker is already
	// filled), QoS 1 over FillConns connections, each keeping FillWindow
	// publishes unacknowledged.
	Fill       int
	FillConns  int
	FillWindow int
	Payload    int // bytes per record

	// Count is how many records the replay must deliver (0: no replay).
	// The fill's records must be the only ones in their stream's offset
	// range, so the replay expects the offsets First..First+Count-1.
	Count   int
	From    string   // the <from> of the subscription: earliest, a decimal offset, ...
	Filters []string // inner filters, each subscribed as $replay/<from>/+/<filter>
	QoS     byte
	Version byte   // MQTT protocol version of the consumer: 4 or 5
	Window  uint16 // the consumer's Receive Maximum (MQTT 5)
	// First is the first offset expected; -1 takes the SUBACK's "start"
	// property (MQTT 5), else From when it is decimal, else 0.
	First int64
	// Idle ends the replay when nothing arrived for this long; Linger
	// keeps reading after the last expected offset arrived, until nothing
	// arrived for this long, so duplicates sent after it are counted too.
	Idle, Linger time.Duration

	PID    int           // broker process, for RSS and CPU; 0: not sampled
	Sample time.Duration // RSS sampling interval
	Settle time.Duration // wait before measuring idle RSS (and then until the broker is quiet)

	// Load, when its Rate is set, runs a QoS 0 fan-in (W1) for LoadFor
	// while the replay runs, starting LoadLead before it.
	Load     faninConfig
	LoadFor  time.Duration
	LoadLead time.Duration
}

// replayResult is what a run measured. RSS figures are bytes.
type replayResult struct {
	FillAcked   int64
	FillElapsed time.Duration

	First                int64 // the first offset expected
	Received, Unique     int64
	Missing, Dups        int64 // offsets never delivered; deliveries of an offset seen before
	Reordered            int64 // first deliveries of an offset below one already delivered
	Outside, BadTopics   int64 // offsets outside the expected range; topics without an offset
	Elapsed, FirstRecord time.Duration
	ClientCPU            time.Duration

	MemIdle, MemPeak, MemEnd memStat
	BrokerCPU                time.Duration
	BrokerWait               time.Duration // ready to run but waiting for a CPU (other processes had it)

	Load        *faninResult
	LoadCovered bool     // the load still ran when the replay ended
	LoadDuring  *samples // the load's end-to-end latencies of the messages meant to be sent while the replay ran
	LoadErr     error
}

func runReplay(cfg replayConfig) (*replayResult, error) {
	res := &replayResult{}
	if cfg.Fill > 0 {
		start := time.Now()
		acked, err := fillReplay(cfg)
		res.FillAcked, res.FillElapsed = acked, time.Since(start)
		if err != nil {
			return res, err
		}
	}
	if cfg.Count <= 0 {
		return res, nil
	}
	time.Sleep(cfg.Settle)
	waitQuiet(cfg.PID, 20*time.Second)

	c, err := dial(cfg.Addr, "bench-replay", dialOptions{clean: true, keepalive: 600, readBuf: 256 << 10,
		version: cfg.Version, receiveMax: cfg.Window})
	if err != nil {
		return res, err
	}
	defer c.close()

	var load sync.WaitGroup
	var loadEnd atomic.Int64
	if cfg.Load.Rate > 0 {
		cfg.Load.Count = max(1, int(cfg.LoadFor.Seconds()*float64(cfg.Load.Rate)/float64(cfg.Load.Publishers)))
		load.Add(1)
		go func() {
			defer load.Done()
			res.Load, res.LoadErr = runFanin(cfg.Load)
			loadEnd.Store(time.Now().UnixNano())
		}()
		time.Sleep(cfg.LoadLead)
	}

	idle, _ := readProc(cfg.PID)
	res.MemIdle, _ = readMem(cfg.PID)
	delay0 := runDelay(cfg.PID)
	sampler := sampleRSS(cfg.PID, cfg.Sample)
	cpu0 := clientCPU()

	filters := make([]string, len(cfg.Filters))
	for i, f := range cfg.Filters {
		filters[i] = "$replay/" + cfg.From + "/+/" + f
	}
	start := time.Now()
	ack, err := c.subscribeAck(cfg.QoS, filters...)
	if err != nil {
		sampler.stop()
		return res, err
	}
	res.First = firstOffset(cfg, ack)
	ck := newOffsetCheck(res.First, cfg.Count)
	last, err := consumeReplay(c, ck, cfg.Idle, cfg.Linger, start, &res.FirstRecord)
	if last.IsZero() { // nothing expected arrived
		last = time.Now()
	}
	res.Elapsed = last.Sub(start)
	res.ClientCPU = clientCPU() - cpu0
	peak := sampler.stop()
	end, _ := readProc(cfg.PID)
	res.MemEnd, _ = readMem(cfg.PID)
	res.BrokerCPU = end.cpu - idle.cpu
	res.BrokerWait = runDelay(cfg.PID) - delay0
	res.MemPeak = memStat{rss: max(peak.rss, res.MemEnd.rss), anon: max(peak.anon, res.MemEnd.anon), file: max(peak.file, res.MemEnd.file)}
	res.Received, res.Unique, res.Dups = ck.received, ck.unique, ck.dups
	res.Reordered, res.Outside, res.BadTopics = ck.reordered, ck.outside, ck.badTopics
	res.Missing = int64(cfg.Count) - ck.unique

	if cfg.Load.Rate > 0 {
		load.Wait()
		res.LoadCovered = loadEnd.Load() > last.UnixNano()
		if res.Load != nil {
			res.LoadDuring = res.Load.E2E.within(start.UnixNano(), last.UnixNano())
		}
	}
	if err != nil {
		return res, err
	}
	return res, res.LoadErr
}

// waitQuiet waits, at most limit, until the broker is idle: it used less
// than about 2% of a CPU over half a second (a freshly started Badger compacts
// for a while, and the idle RSS is measured after that).
func waitQuiet(pid int, limit time.Duration) {
	if pid <= 0 {
		return
	}
	const window = 500 * time.Millisecond
	deadline := time.Now().Add(limit)
	prev, err := readProc(pid)
	for err == nil && time.Now().Before(deadline) {
		time.Sleep(window)
		cur, err2 := readProc(pid)
		if err2 != nil || cur.cpu-prev.cpu <= window/50 { // one clock tick (10 ms) at most
			return
		}
		prev = cur
	}
}

// firstOffset is the first offset the replay must deliver.
func firstOffset(cfg replayConfig, suback packets.Packet) int64 {
	if cfg.First >= 0 {
		return cfg.First
	}
	for _, u := range suback.Properties.User {
		if u.Key == "start" {
			if v, err := strconv.ParseInt(u.Val, 10, 64); err == nil {
				return v
			}
		}
	}
	if v, err := strconv.ParseInt(cfg.From, 10, 64); err == nil {
		return v
	}
	return 0
}

// fillReplay publishes cfg.Fill QoS 1 records, record i on
// bench/replay/<i%16> with i in the payload's first 8 bytes and random
// bytes after them (a log of zeros would compress to nothing and flatter
// both the reads and the memory they map), and returns
// how many were acknowledged.
func fillReplay(cfg replayConfig) (int64, error) {
	conns := max(cfg.FillConns, 1)
	var acked atomic.Int64
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for j := range conns {
		c, err := dial(cfg.Addr, fmt.Sprintf("bench-fill-%d", j), defaultDial)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.close()
			n := (cfg.Fill - j + conns - 1) / conns // records j, j+conns, ...
			a, err := fillConn(c, j, conns, n, cfg)
			acked.Add(a)
			errs[j] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return acked.Load(), err
	}
	if a := acked.Load(); a != int64(cfg.Fill) {
		return a, fmt.Errorf("fill: %d of %d publishes acknowledged", a, cfg.Fill)
	}
	return acked.Load(), nil
}

// fillConn publishes n records on c, the j-th connection of conns, keeping
// at most cfg.FillWindow unacknowledged, and returns how many were acked.
func fillConn(c *conn, j, conns, n int, cfg replayConfig) (int64, error) {
	window := make(chan struct{}, max(cfg.FillWindow, 1))
	var acked int64
	readErr := make(chan error, 1)
	go func() {
		for acked < int64(n) {
			pk, err := c.read()
			if err != nil {
				readErr <- fmt.Errorf("fill: read PUBACK: %w", err)
				return
			}
			if pk.FixedHeader.Type == packets.Puback {
				if pk.ReasonCode >= 0x80 {
					readErr <- fmt.Errorf("fill: publish %d refused: reason %#x", pk.PacketID, pk.ReasonCode)
					return
				}
				acked++
				<-window
			}
		}
		readErr <- nil
	}()
	topics := make([]string, replayTopics)
	for i := range topics {
		topics[i] = fmt.Sprintf("bench/replay/%d", i)
	}
	payload := make([]byte, max(cfg.Payload, 8))
	rng := rand.New(rand.NewPCG(uint64(j), 1))
	for k := range n {
		i := j + k*conns
		binary.BigEndian.PutUint64(payload, uint64(i))
		for b := 8; b < len(payload); b += 8 {
			var word [8]byte
			binary.LittleEndian.PutUint64(word[:], rng.Uint64())
			copy(payload[b:], word[:])
		}
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: 1},
			ProtocolVersion: 4,
			TopicName:       topics[i%replayTopics],
			PacketID:        uint16(k%65535) + 1,
			Payload:         payload,
		}
		select {
		case window <- struct{}{}:
		case err := <-readErr:
			return acked, err
		}
		if err := c.write(&pk); err != nil {
			c.Close()
			<-readErr
			return acked, fmt.Errorf("fill: publish: %w", err)
		}
	}
	err := <-readErr
	return acked, err
}

// offsetCheck counts, exactly, how the delivered offsets differ from
// first, first+1, ..., first+n-1, each once, in order.
type offsetCheck struct {
	first int64
	n     int64
	seen  []uint64 // bitset over the expected range
	max   int64    // highest offset delivered so far; first-1 before any

	received, unique, dups int64
	reordered, outside     int64
	badTopics              int64
}

func newOffsetCheck(first int64, n int) *offsetCheck {
	return &offsetCheck{first: first, n: int64(n), seen: make([]uint64, (n+63)/64), max: first - 1}
}

// add records one delivery of offset off.
func (k *offsetCheck) add(off int64) {
	k.received++
	i := off - k.first
	if i < 0 || i >= k.n {
		k.outside++
		return
	}
	word, bit := &k.seen[i/64], uint64(1)<<(i%64)
	if *word&bit != 0 {
		k.dups++
		return
	}
	*word |= bit
	k.unique++
	if off < k.max {
		k.reordered++
	} else {
		k.max = off
	}
}

func (k *offsetCheck) done() bool { return k.unique == k.n }

// consumeReplay reads PUBLISHes from c, acknowledging QoS 1 ones, and
// feeds their offsets to ck until every expected offset arrived, or nothing
// arrived for about idle. With linger > 0 it then goes on reading until
// nothing arrived for about linger, counting late duplicates. It returns
// when the last expected offset (or the last delivery) arrived. firstAt is
// set to the time from start to the first delivery.
//
// It parses packets itself, without allocating, rather than with conn.read:
// at hundreds of thousands of messages a second the load generator must
// stay far cheaper than the broker it measures.
func consumeReplay(c *conn, ck *offsetCheck, idle, linger time.Duration, start time.Time, firstAt *time.Duration) (time.Time, error) {
	w := bufio.NewWriterSize(c.NetConn(), 4<<10)
	var body []byte
	var last, deadlineSet time.Time
	ack := []byte{packets.Puback << 4, 2, 0, 0}
	defer func() { _ = c.NetConn().SetReadDeadline(time.Time{}) }()
	for {
		if c.Reader().Buffered() == 0 {
			// About to wait on the socket: send the acks gathered so far.
			if err := w.Flush(); err != nil {
				return last, fmt.Errorf("replay: write PUBACK: %w", err)
			}
		}
		// Bound every wait on the socket by idle; the deadline is renewed
		// a few times per idle, not per packet.
		if now := time.Now(); now.Sub(deadlineSet) > idle/4 {
			_ = c.NetConn().SetReadDeadline(now.Add(idle))
			deadlineSet = now
		}
		hb, err := c.Reader().ReadByte()
		if err == nil {
			var n int
			if n, _, err = packets.DecodeLength(c.Reader()); err == nil {
				if cap(body) < n {
					body = make([]byte, n)
				}
				body = body[:n]
				_, err = io.ReadFull(c.Reader(), body)
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return last, nil // idle, or the linger is over
			}
			return last, fmt.Errorf("replay: read: %w", err)
		}
		if hb>>4 != packets.Publish {
			continue
		}
		now := time.Now()
		if ck.received == 0 {
			*firstAt = now.Sub(start)
		}
		topic, id, ok := publishTopic(hb, body)
		off, okOff := replayOffset(topic)
		switch {
		case !ok || !okOff:
			ck.received++
			ck.badTopics++
		case ck.done(): // lingering: count what still comes
			ck.add(off)
		default:
			ck.add(off)
			last = now
			if ck.done() {
				if linger <= 0 {
					return last, w.Flush()
				}
				idle, deadlineSet = linger, time.Time{} // from now on, wait only for stragglers
			}
		}
		if ok && (hb>>1)&3 > 0 {
			ack[2], ack[3] = byte(id>>8), byte(id)
			_, _ = w.Write(ack)
		}
	}
}

// publishTopic returns the topic and packet id of a PUBLISH body.
func publishTopic(hb byte, body []byte) (topic []byte, id uint16, ok bool) {
	if len(body) < 2 {
		return nil, 0, false
	}
	n := int(binary.BigEndian.Uint16(body))
	if len(body) < 2+n {
		return nil, 0, false
	}
	topic = body[2 : 2+n]
	if (hb>>1)&3 > 0 {
		if len(body) < 4+n {
			return nil, 0, false
		}
		id = binary.BigEndian.Uint16(body[2+n:])
	}
	return topic, id, true
}

// replayOffset parses the offset out of $replay/<from>/<offset>/<topic>.
func replayOffset(topic []byte) (int64, bool) {
	const prefix = "$replay/"
	if len(topic) < len(prefix) || string(topic[:len(prefix)]) != prefix {
		return 0, false
	}
	rest := topic[len(prefix):]
	slash := 0
	for slash < len(rest) && rest[slash] != '/' {
		slash++
	}
	rest = rest[min(slash+1, len(rest)):]
	var off int64
	digits := 0
	for _, b := range rest {
		if b == '/' {
			break
		}
		if b < '0' || b > '9' {
			return 0, false
		}
		off = off*10 + int64(b-'0')
		digits++
	}
	return off, digits > 0 && digits < len(rest)
}

// memStat is a process's resident memory, in bytes: all of it, and its
// anonymous (heap, stacks) and file-backed (mapped files, such as Badger's
// tables, which the kernel can reclaim) parts.
type memStat struct{ rss, anon, file int64 }

// readMem reads /proc/<pid>/status.
func readMem(pid int) (memStat, error) {
	var m memStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			m.rss = kb << 10
		case "RssAnon":
			m.anon = kb << 10
		case "RssFile":
			m.file = kb << 10
		}
	}
	return m, nil
}

// runDelay is how long the threads of a process, summed, were ready to run
// but waiting for a CPU (the second field of /proc/<pid>/task/*/schedstat):
// on a shared machine, the time other processes took from the broker.
// Threads that exited meanwhile are not counted.
func runDelay(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	dirs, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var sum time.Duration
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, d.Name()))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// rssSampler samples a process's resident memory in the background and
// keeps the highest value of each part.
type rssSampler struct {
	stopc chan struct{}
	peak  chan memStat
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stopc: make(chan struct{}), peak: make(chan memStat, 1)}
	go func() {
		var hi memStat
		if pid <= 0 || every <= 0 {
			<-s.stopc
			s.peak <- hi
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := readMem(pid); err == nil {
				hi = memStat{rss: max(hi.rss, m.rss), anon: max(hi.anon, m.anon), file: max(hi.file, m.file)}
			}
			select {
			case <-s.stopc:
				s.peak <- hi
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the highest of each part seen.
func (s *rssSampler) stop() memStat {
	close(s.stopc)
	return <-s.peak
}

// clientCPU is the CPU time this process (the load generator) used so far.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func replayCmd(args []string) error {
	fs := flag.NewFlagSet("replay", flag.ExitOnError)
	cfg := replayConfig{}
	var qos, version, window int
	var filter, label string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.IntVar(&cfg.Fill, "fill", 0, "records to publish on bench/replay/<i%16> first (QoS 1); 0 = already filled")
	fs.IntVar(&cfg.FillConns, "fill-conns", 4, "connections the fill publishes on")
	fs.IntVar(&cfg.FillWindow, "fill-window", 64, "QoS 1 publishes in flight per fill connection")
	fs.IntVar(&cfg.Payload, "payload", 128, "payload bytes of the fill's records")
	fs.IntVar(&cfg.Count, "count", 0, "records the replay must deliver; 0 = no replay (fill only)")
	fs.StringVar(&cfg.From, "from", "earliest", "the replay's <from>")
	fs.StringVar(&filter, "filter", "bench/replay/#", "filter replayed, as $replay/<from>/+/<filter>")
	fs.IntVar(&qos, "qos", 0, "QoS of the replay subscription (0 or 1)")
	fs.IntVar(&version, "mqtt", 5, "MQTT version of the replay consumer: 4 (3.1.1) or 5")
	fs.IntVar(&window, "window", 100, "the consumer's Receive Maximum (MQTT 5): QoS 1 deliveries in flight")
	fs.Int64Var(&cfg.First, "first", -1, "first offset expected; -1 = the SUBACK's start (MQTT 5), else --from if decimal, else 0")
	fs.DurationVar(&cfg.Idle, "idle", 5*time.Second, "end the replay when nothing arrived for this long")
	fs.DurationVar(&cfg.Linger, "linger", 0, "after the last expected record, keep reading until silent this long, to count late duplicates")
	fs.IntVar(&cfg.PID, "broker-pid", 0, "broker process id, to sample its RSS and CPU")
	fs.DurationVar(&cfg.Sample, "sample", 50*time.Millisecond, "RSS sampling interval")
	fs.DurationVar(&cfg.Settle, "settle", time.Second, "wait before measuring the idle RSS and replaying")
	fs.IntVar(&cfg.Load.Rate, "load-rate", 0, "total msg/s of a QoS 0 fan-in (W1) run during the replay; 0 = none")
	fs.IntVar(&cfg.Load.Publishers, "load-publishers", 10, "publishers of the concurrent fan-in")
	fs.DurationVar(&cfg.LoadFor, "load-for", 20*time.Second, "how long the concurrent fan-in publishes")
	fs.DurationVar(&cfg.LoadLead, "load-lead", time.Second, "how long the fan-in runs before the replay starts")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	if qos < 0 || qos > 1 || (version != 4 && version != 5) || window < 1 || window > 65535 || cfg.Idle <= 0 {
		return fmt.Errorf("replay: --qos must be 0 or 1, --mqtt 4 or 5, --window 1..65535, --idle positive; got %d, %d, %d, %v", qos, version, window, cfg.Idle)
	}
	cfg.QoS, cfg.Version, cfg.Window = byte(qos), byte(version), uint16(window)
	cfg.Filters = []string{filter}
	cfg.Load.Addr, cfg.Load.Subscribers, cfg.Load.Payload, cfg.Load.Drain = cfg.Addr, 1, 128, 3*time.Second

	res, err := runReplay(cfg)
	if err != nil {
		return err
	}
	out := map[string]any{"label": label, "workload": "replay", "payload": cfg.Payload}
	if cfg.Fill > 0 {
		out["fill"], out["fill_acked"], out["fill_seconds"] = cfg.Fill, res.FillAcked, round(res.FillElapsed.Seconds())
		out["fill_per_s"] = round(float64(res.FillAcked) / res.FillElapsed.Seconds())
	}
	if cfg.Count > 0 {
		secs := res.Elapsed.Seconds()
		maps.Copy(out, map[string]any{
			"count": cfg.Count, "from": cfg.From, "filter": filter, "qos": cfg.QoS, "mqtt": cfg.Version, "window": cfg.Window,
			"first": res.First, "received": res.Received, "unique": res.Unique,
			"missing": res.Missing, "dups": res.Dups, "reordered": res.Reordered, "outside": res.Outside, "bad_topics": res.BadTopics,
			"seconds": round(secs), "msg_per_s": round(float64(res.Unique) / secs),
			"first_record_ms":       round(float64(res.FirstRecord) / float64(time.Millisecond)),
			"client_cpu_us_per_msg": round(float64(res.ClientCPU) / float64(time.Microsecond) / float64(max(res.Received, 1))),
		})
		if cfg.PID > 0 {
			mb := func(b int64) float64 { return round(float64(b) / (1 << 20)) }
			i, p, e := res.MemIdle, res.MemPeak, res.MemEnd
			maps.Copy(out, map[string]any{
				"rss_idle_mb": mb(i.rss), "rss_peak_mb": mb(p.rss), "rss_end_mb": mb(e.rss), "rss_delta_mb": mb(p.rss - i.rss),
				"anon_idle_mb": mb(i.anon), "anon_peak_mb": mb(p.anon), "anon_delta_mb": mb(p.anon - i.anon),
				"file_idle_mb": mb(i.file), "file_peak_mb": mb(p.file), "file_delta_mb": mb(p.file - i.file),
				"cpu_us_per_msg": round(float64(res.BrokerCPU) / float64(time.Microsecond) / float64(max(res.Received, 1))),
				"broker_cpu_s":   round(res.BrokerCPU.Seconds()), "broker_wait_s": round(res.BrokerWait.Seconds()),
			})
		}
		if l := res.Load; l != nil {
			maps.Copy(out, map[string]any{
				"load_rate": cfg.Load.Rate, "load_sent": l.Sent, "load_received": l.Received, "load_lost": l.Lost,
				"load_dups": l.Dups, "load_covered_replay": res.LoadCovered,
				// The fan-in's messages meant to be sent while the replay ran:
				// the seconds before and after it would dilute the percentiles.
				"load_during": len(res.LoadDuring.v), "load_e2e_p50_ms": round(res.LoadDuring.quantile(0.5)),
				"load_e2e_p99_ms": round(res.LoadDuring.quantile(0.99)), "load_e2e_p999_ms": round(res.LoadDuring.quantile(0.999)),
				"load_e2e_p99_whole_ms": round(l.E2E.quantile(0.99)),
			})
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
