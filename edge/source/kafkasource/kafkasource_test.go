package kafkasource_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/kafkasource"
	"github.com/peatmq/peat/edge/source/sourcetest"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// memResume is source.Resume over a MemStream, as the framework's is over
// the stream it appends to.
type memResume struct {
	st   *mqtttest.MemStream
	name string
	mu   sync.Mutex
	mark *uint64
}

func (r *memResume) Stream() string { return r.st.Name() }

func (r *memResume) End() uint64 { return r.st.Committed() }

func (r *memResume) WaitCommitted(context.Context) error { return nil } //XX // one writer, which waits for its own appends

func (r *memResume) Scan(ctx context.Context, from uint64, fn func(*logstore.Record) bool) error {
	recs := r.st.Records()
	for i := len(recs) - 1; i >= 0 && recs[i].Offset >= from; i-- {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if sourceOf(recs[i]) == r.name && !fn(recs[i]) {
			return nil
		}
	}
	return nil
}

func (r *memResume) Mark() (uint64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mark == nil {
		return 0, false, nil
	}
	return *r.mark, true, nil
}

func (r *memResume) SetMark(off uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mark = &off
	return nil
}

func sourceOf(r *logstore.Record) string {
	for _, u := range r.UserProperties {
		if u.Key == source.PropSource {
			return u.Value
		}
	}
	return ""
}

func prop(r *logstore.Record, key string) string {
	v := ""
	for _, u := range r.UserProperties {
		if u.Key == key {
			v = u.Value
		}
	}
	return v
}

// crash says where a run of the writer stops dead: at which batch and
// how much of it reached the log.
type crash struct {
	batch int
	// stored is how many of that batch's records were appended before
	// the "kill": 0 (killed before the append), some (a torn write of a
	// prefix), or all (killed after the commit, before Done).
	stored func(n int) int
}

// appendAll appends recs and waits for the commit.
func appendAll(t testing.TB, st *mqtttest.MemStream, recs []*logstore.Record) {
	t.Helper()
	if len(recs) == 0 {
		return
	}
	done := make(chan error, 1)
	st.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// runWriter plays the source framework for one connection: Next, mark
// the records as the source's, append, Done; it ends at the crash (the
// connection dropped with no Done, as a kill -9 leaves it), or once
// nothing came for idle. It returns the number of batches served.
func runWriter(t *testing.T, up *kafkasource.Upstream, r *memResume, c *crash, idle time.Duration) int {
	t.Helper()
	conn, err := up.Connect(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for n := 0; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), idle)
		msgs, err := conn.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]*logstore.Record, 0, len(msgs))
		for _, m := range msgs {
			m.Record.UserProperties = append(m.Record.UserProperties,
				logstore.UserProperty{Key: source.PropSource, Value: r.name},
				logstore.UserProperty{Key: source.PropOrigin, Value: up.Origin()})
			recs = append(recs, m.Record)
		}
		if c != nil && n == c.batch {
			appendAll(t, r.st, recs[:c.stored(len(recs))])
			return n
		}
		appendAll(t, r.st, recs)
		if err := conn.Done(msgs); err != nil {
			t.Fatal(err)
		}
	}
}

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, "cmd")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func producer(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("cmd")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produce writes values from..to-1 to topic cmd, keyed dev<i%7>.
func produce(t *testing.T, cl *kgo.Client, from, to int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{Key: []byte("dev" + strconv.Itoa(i%7)), Value: []byte(strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

func newUpstream(t *testing.T, c *kfake.Cluster, cfg kafkasource.Config) *kafkasource.Upstream {
	t.Helper()
	cfg.Name = "cloud"
	cfg.Brokers = c.ListenAddrs()
	if cfg.Topics == nil {
		cfg.Topics = []string{"cmd"}
	}
	cfg.Logger = logger()
	up, err := kafkasource.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// checkExactlyOnce checks that the stream holds each of the n values once,
// and each Kafka (partition, offset) once.
func checkExactlyOnce(t *testing.T, st *mqtttest.MemStream, n int) {
	t.Helper()
	values := map[string]int{}
	positions := map[string]int{}
	for _, r := range st.Records() {
		values[string(r.Payload)]++
		positions[prop(r, kafkasource.PropPartition)+"@"+prop(r, kafkasource.PropOffset)]++
	}
	for i := range n {
		if c := values[strconv.Itoa(i)]; c != 1 {
			t.Errorf("value %d stored %d times, want once", i, c)
		}
	}
	for p, c := range positions {
		if c != 1 {
			t.Errorf("kafka partition@offset %s stored %d times", p, c)
		}
	}
	if got := len(st.Records()); got != n {
		t.Errorf("%d records stored for %d upstream", got, n)
	}
}

// A writer killed between appends, at every point a batch can be in
// (before its append, with a prefix of it written, after the commit
// but before Done), resumes from the records in the log: every Kafka
// record is stored once, none twice, none missing.
func TestKafkaSource_ExactlyOnceAcrossCrashes(t *testing.T) {
	c := newCluster(t)
	prod := producer(t, c)
	const n = 3000
	produce(t, prod, 0, n/2)
	st := mqtttest.NewMemLog(t, "cmds=cmd/#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topic: "cmd/{key}", MaxBatch: 70})
	res := &memResume{st: st, name: "cloud"}

	crashes := []crash{
		{batch: 3, stored: func(int) int { return 0 }},
		{batch: 2, stored: func(n int) int { return n / 2 }},
		{batch: 4, stored: func(n int) int { return n }},
		{batch: 0, stored: func(n int) int { return n }},
		{batch: 1, stored: func(n int) int { return 1 }},
		{batch: 5, stored: func(n int) int { return n - 1 }},
	}
	for i, cr := range crashes {
		if i == 2 {
			produce(t, prod, n/2, n) // more arrives while the source is down
		}
		runWriter(t, up, res, &cr, 10*time.Second)
		t.Logf("crash %d: %d records stored", i, len(st.Records()))
	}
	runWriter(t, up, res, nil, time.Second)
	checkExactlyOnce(t, st, n)

	// Topics mapped from the key, Kafka's position in properties.
	r := st.Records()[0]
	if want := "cmd/dev" + strconv.Itoa(mustAtoi(t, string(r.Payload))%7); r.Topic != want {
		t.Errorf("topic %q, want %q", r.Topic, want)
	}
	if prop(r, kafkasource.PropTopic) != "cmd" || prop(r, source.PropSource) != "cloud" {
		t.Errorf("record properties %v", r.UserProperties)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Records of an aborted transaction never reach the log (read
// committed); those of committed transactions do, once each, and the
// source goes on past the commit markers.
func TestKafkaSource_ReadCommittedSkipsAbortedTransactions(t *testing.T) {
	c := newCluster(t)
	tx := producer(t, c, kgo.TransactionalID("hq-tx"))
	txn := func(from, to int, commit bool) {
		t.Helper()
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produce(t, tx, from, to)
		if err := tx.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(0, 10, true)
	txn(100, 110, false) // aborted
	txn(10, 20, true)

	for _, tc := range []struct {
		name        string
		uncommitted bool
		want        int
	}{
		{"read committed", false, 20},
		{"read uncommitted", true, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
			up := newUpstream(t, c, kafkasource.Config{ReadUncommitted: tc.uncommitted})
			res := &memResume{st: st, name: "cloud"}
			runWriter(t, up, res, nil, 2*time.Second)
			got := map[int]bool{}
			for _, r := range st.Records() {
				got[mustAtoi(t, string(r.Payload))] = true
			}
			for i := range 20 {
				if !got[i] {
					t.Errorf("committed value %d missing", i)
				}
			}
			aborted := 0
			for i := 100; i < 110; i++ {
				if got[i] {
					aborted++
				}
			}
			if !tc.uncommitted && aborted > 0 {
				t.Errorf("%d records of the aborted transaction stored", aborted)
			}
			if tc.uncommitted && aborted != 10 {
				t.Errorf("read uncommitted stored %d of the aborted transaction's 10", aborted)
			}
			if len(st.Records()) != tc.want {
				t.Errorf("%d records stored, want %d", len(st.Records()), tc.want)
			}
		})
	}
	// After more transactions, a restarted source takes only what is new.
	st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{})
	res := &memResume{st: st, name: "cloud"}
	runWriter(t, up, res, nil, 2*time.Second)
	txn(200, 210, false)
	txn(20, 30, true)
	runWriter(t, up, res, nil, 2*time.Second)
	checkExactlyOnce(t, st, 30)
}

// The MQTT topic comes from a header when the template names one; a
// record whose topic maps to nothing valid is skipped, not stored.
func TestKafkaSource_TopicFromHeader(t *testing.T) {
	c := newCluster(t)
	prod := producer(t, c)
	recs := []*kgo.Record{
		{Value: []byte("a"), Headers: []kgo.RecordHeader{{Key: "mqtt-topic", Value: []byte("dev1/set")}, {Key: "trace", Value: []byte("x1")}}},
		{Value: []byte("b"), Headers: []kgo.RecordHeader{{Key: "mqtt-topic", Value: []byte("dev2/+")}}}, // a wildcard: skipped
		{Value: []byte("c")}, // no header: "cmd/" is still a topic
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topic: "cmd/{header:mqtt-topic}"})
	runWriter(t, up, &memResume{st: st, name: "cloud"}, nil, 2*time.Second)
	got := map[string]*logstore.Record{}
	for _, r := range st.Records() {
		got[string(r.Payload)] = r
	}
	if r := got["a"]; r == nil || r.Topic != "cmd/dev1/set" || prop(r, "trace") != "x1" {
		t.Errorf("record a: %+v", r)
	}
	if got["b"] != nil {
		t.Errorf("record b stored under %q", got["b"].Topic)
	}
	if r := got["c"]; r == nil || r.Topic != "cmd/" {
		t.Errorf("record c: %+v", r)
	}
}

func TestCheckTemplate(t *testing.T) {
	for tmpl, ok := range map[string]bool{
		"{topic}": true, "cmd/{key}": true, "{header:to}/x": true, "p{partition}": true,
		"{header:}": false, "{nope}": false, "a/+": false, "{topic": false,
	} {
		if err := kafkasource.CheckTemplate(tmpl); (err == nil) != ok {
			t.Errorf("CheckTemplate(%q) = %v", tmpl, err)
		}
	}
	_, err := kafkasource.New(kafkasource.Config{Topics: []string{"a/b"}, Start: "middle"})
	for _, want := range []string{"brokers", "topics[0]", "start"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want it to name %s", err, want)
		}
	}
}

// Under the source framework (several batches may wait to be stored,
// records another stream captures are dropped), stopped and started
// again while Kafka grows: every record is stored once, the dropped ones
// never, and the source's mark points at a record of its own.
func TestKafkaSource_UnderTheFramework(t *testing.T) {
	c := newCluster(t)
	prod := producer(t, c)
	const n = 2000
	produce(t, prod, 0, n/2)
	log := mqtttest.NewMemLog(t, "cmds=cmd/#", "other=cmd/dev6")
	st := log.Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topic: "cmd/{key}", MaxBatch: 50})
	mk := &sourcetest.Marks{}
	run := func() func() {
		s, err := source.New(source.Config{Name: "cloud", Kind: "kafka", Stream: "cmds", Log: sourcetest.MemLog{L: log}, Upstream: up, Marks: mk,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: logger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		return func() { cancel(); <-done }
	}
	// dev6 goes to the other stream: the source drops it (1 value in 7).
	want := func(upTo int) int { return upTo - (upTo+1)/7 }
	stop := run()
	sinktest.WaitFor(t, "some records", time.Minute, func() bool { return len(st.Records()) > 300 })
	stop()
	produce(t, prod, n/2, n)
	time.Sleep(1100 * time.Millisecond) // a mark is set at most once a second
	stop = run()
	defer stop()
	sinktest.WaitFor(t, "every record", time.Minute, func() bool { return len(st.Records()) >= want(n) })
	time.Sleep(300 * time.Millisecond)
	stop()
	values := map[int]int{}
	for _, r := range st.Records() {
		values[mustAtoi(t, string(r.Payload))]++
	}
	for i := range n {
		switch c := values[i]; {
		case i%7 == 6 && c != 0:
			t.Errorf("value %d (dev6, another stream's) stored", i)
		case i%7 != 6 && c != 1:
			t.Errorf("value %d stored %d times", i, c)
		}
	}
	off, ok, _ := mk.Load(source.Group("cloud"), "cmds")
	if !ok {
		t.Fatal("no mark set")
	}
	recs := st.Records()
	if off >= uint64(len(recs)) || prop(recs[off], kafkasource.PropNext) == "" {
		t.Errorf("the mark %d is not on a record with %s", off, kafkasource.PropNext)
	}
}

// A new leader (in a site) may hold records its predecessor wrote that
// are not committed yet: the source must not resume before they are, or
// it would fetch them again. Here the old instance's last batch is held
// uncommitted while a new instance starts; once it commits, the new one
// goes on after it: every record once.
func TestKafkaSource_ResumesOnlyOnceTheLogIsCommitted(t *testing.T) {
	c := newCluster(t)
	prod := producer(t, c)
	const n = 600
	produce(t, prod, 0, n/2)
	log := mqtttest.NewMemLog(t, "cmds=cmd/#")
	st := log.Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topic: "cmd/{key}", MaxBatch: 50})
	mk := &sourcetest.Marks{}
	start := func() func() {
		s, err := source.New(source.Config{Name: "cloud", Kind: "kafka", Stream: "cmds", Log: sourcetest.MemLog{L: log}, Upstream: up, Marks: mk,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: logger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	stopOld := start()
	sinktest.WaitFor(t, "the first half", time.Minute, func() bool { return len(st.Records()) >= n/2 })
	st.Hold()
	at := st.Submitted()
	produce(t, prod, n/2, n)
	sinktest.WaitFor(t, "a batch held uncommitted", time.Minute, func() bool { return st.Submitted() > at })
	held := len(st.Records())
	start() // the new leader
	time.Sleep(500 * time.Millisecond)
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopOld() }()
	st.Release()
	<-stopped
	t.Logf("%d records committed before the hold", held)
	sinktest.WaitFor(t, "every record", time.Minute, func() bool { return len(st.Records()) >= n })
	time.Sleep(300 * time.Millisecond)
	checkExactlyOnce(t, st, n)
}

// With a group, the stored positions are committed to it, where Kafka's
// own tools see them.
func TestKafkaSource_CommitsPositionsToTheGroup(t *testing.T) {
	c := newCluster(t)
	prod := producer(t, c)
	const n = 300
	produce(t, prod, 0, n)
	st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Group: "site-a-lake", CommitEvery: 10 * time.Millisecond})
	runWriter(t, up, &memResume{st: st, name: "cloud"}, nil, time.Second)

	// What the group holds, as `kafka-consumer-groups --describe` reads it.
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = "site-a-lake"
	cl := producer(t, c)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			committed += p.Offset
		}
	}
	if committed != n {
		t.Errorf("the group's offsets add up to %d, want %d (every record stored)", committed, n)
	}
}

// start: latest skips what the topic held when the source first saw it;
// once a batch is stored, a restart goes on from the log, taking what was
// produced while it was down.
func TestKafkaSource_StartLatest(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "one"))
	prod := producer(t, c, kgo.DefaultProduceTopic("one"))
	produce(t, prod, 0, 10) // before the source: skipped
	st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topics: []string{"one"}, Start: kafkasource.StartLatest})
	res := &memResume{st: st, name: "cloud"}
	conn, err := up.Connect(context.Background(), res)
	if err != nil {
		t.Fatal(err)
	}
	produce(t, prod, 10, 15) // while it runs
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(st.Records()) < 5 {
		msgs, err := conn.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var recs []*logstore.Record
		for _, m := range msgs {
			m.Record.UserProperties = append(m.Record.UserProperties, logstore.UserProperty{Key: source.PropSource, Value: "cloud"})
			recs = append(recs, m.Record)
		}
		appendAll(t, st, recs)
		if err := conn.Done(msgs); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	produce(t, prod, 15, 18) // while it is down
	runWriter(t, up, res, nil, time.Second)
	got := map[int]bool{}
	for _, r := range st.Records() {
		got[mustAtoi(t, string(r.Payload))] = true
	}
	for i := range 18 {
		if want := i >= 10; got[i] != want {
			t.Errorf("value %d stored: %v, want %v", i, got[i], want)
		}
	}
	if len(st.Records()) != 8 {
		t.Errorf("%d records stored, want 8", len(st.Records()))
	}
}

// Lag is what Kafka holds beyond what is stored: it falls to 0 as the
// source catches up.
func TestKafkaSource_Lag(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "one"))
	prod := producer(t, c, kgo.DefaultProduceTopic("one"))
	produce(t, prod, 0, 100)
	st := mqtttest.NewMemLog(t, "cmds=#").Stream(t, "cmds")
	up := newUpstream(t, c, kafkasource.Config{Topics: []string{"one"}, MaxBatch: 10})
	conn, err := up.Connect(context.Background(), &memResume{st: st, name: "cloud"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lagger := conn.(source.Lagger)
	if _, ok := lagger.Lag(); ok {
		t.Error("a lag known before any fetch")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lags []int64
	for len(st.Records()) < 100 {
		msgs, err := conn.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var recs []*logstore.Record
		for _, m := range msgs {
			recs = append(recs, m.Record)
		}
		appendAll(t, st, recs)
		if err := conn.Done(msgs); err != nil {
			t.Fatal(err)
		}
		lag, _ := lagger.Lag()
		lags = append(lags, lag)
	}
	if lags[0] <= 0 || lags[len(lags)-1] != 0 {
		t.Errorf("lag after each batch %v, want it to fall to 0", lags)
	}
}
