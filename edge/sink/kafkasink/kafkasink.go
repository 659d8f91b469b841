package kafkasink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/logstore"
)

// Defaults of Config.
const (
	DefaultWindow  = 256
	DefaultTopic   = "peat.{stream}"
	DefaultTimeout = 30 * time.Second
)

// Headers every record carries.
const (
	HeaderSite   = "peat-site"
	HeaderStream = "peat-stream"
	HeaderOffset = "peat-offset"
	HeaderTime   = "peat-time"
	HeaderTopic  = "peat-topic"
)

// Config is one Kafka upstream.
type Config struct {
	Brokers []string
	// Topic is the Kafka topic template: {stream} {node}.
	Topic string
	// Key is the record key template: {topic} {stream} {node}; "" sends
	// records without a key.
	Key string
	// Site names this node's records (header peat-site) and, with
	// ExactlyOnce, its transactional id.
	Site string
	// SinkName is the sink's name, part of the transactional id.
	SinkName string
	// Instance, when set, ends the transactional id: in a site, the node
	// id, since nodes leading different streams of one sink produce at the
	// same time and one id would have them fence each other.
	Instance    string
	Node        string
	ExactlyOnce bool
	Window      int
	TLS         *tls.Config
	SASL        sasl.Mechanism
	// Timeout bounds a delivery (and a transaction) before the connection
	// is given up and dialled again.
	Timeout time.Duration
}

// CheckTemplate checks a topic or key template against the placeholders
// it may use.
func CheckTemplate(tmpl string, allowed ...string) error {
	rest := tmpl
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			return nil
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return fmt.Errorf("%q: unclosed {", tmpl)
		}
		ph := rest[i : i+j+1]
		ok := false
		for _, a := range allowed {
			ok = ok || ph == a
		}
		if !ok {
			return fmt.Errorf("%q: unknown placeholder %s (want %s)", tmpl, ph, strings.Join(allowed, ", "))
		}
		rest = rest[i+j+1:]
	}
}

// Upstream is a Kafka cluster a sink produces to with franz-go: an
// idempotent producer; with ExactlyOnce, one transaction per window.
type Upstream struct {
	cfg Config
}

var _ sink.Upstream = (*Upstream)(nil)

// New checks cfg; it dials nothing.
func New(cfg Config) (*Upstream, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafkasink: no brokers")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if err := CheckTemplate(cfg.Topic, "{stream}", "{node}"); err != nil {
		return nil, err
	}
	if err := CheckTemplate(cfg.Key, "{topic}", "{stream}", "{node}"); err != nil {
		return nil, err
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.ExactlyOnce && (cfg.Site == "" || cfg.SinkName == "") {
		return nil, errors.New("kafkasink: exactly once needs a site and a sink name")
	}
	return &Upstream{cfg: cfg}, nil
}

func (u *Upstream) String() string { return "kafka://" + strings.Join(u.cfg.Brokers, ",") }

var _ sink.Originer = (*Upstream)(nil)

// Origin names the cluster as a Kafka source of it does (Origin of its
// brokers): the sink skips records such a source brought down, so a
// topic sent up and read back down does not loop.
func (u *Upstream) Origin() string { return Origin(u.cfg.Brokers) }

// Origin names a Kafka cluster by its seed brokers, whatever their order
// or case: "kafka://<broker>,<broker>", sorted.
func Origin(brokers []string) string {
	bs := make([]string, len(brokers))
	for i, b := range brokers {
		bs[i] = strings.ToLower(b)
	}
	slices.Sort(bs)
	return "kafka://" + strings.Join(bs, ",")
}

// TransactionalID is the producer's transactional id with ExactlyOnce.
func (u *Upstream) TransactionalID() string {
	id := "peat." + u.cfg.Site + "." + u.cfg.SinkName
	if u.cfg.Instance != "" {
		id += "." + u.cfg.Instance
	}
	return id
}

func (u *Upstream) topicFor(stream string) string {
	t := strings.ReplaceAll(u.cfg.Topic, "{stream}", stream)
	return strings.ReplaceAll(t, "{node}", u.cfg.Node)
}

func (u *Upstream) keyFor(stream string, r *logstore.Record) []byte {
	if u.cfg.Key == "" {
		return nil
	}
	k := strings.ReplaceAll(u.cfg.Key, "{stream}", stream)
	k = strings.ReplaceAll(k, "{node}", u.cfg.Node)
	return []byte(strings.ReplaceAll(k, "{topic}", r.Topic))
}

// Connect creates a client and checks that the cluster answers. With
// ExactlyOnce the client is transactional: creating it fences any
// producer of the same id left over from before a crash, whose open
// transaction is aborted.
func (u *Upstream) Connect(ctx context.Context) (sink.Conn, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(u.cfg.Brokers...),
		kgo.ProducerLinger(0),
		kgo.MaxBufferedRecords(u.cfg.Window),
		// No RecordDeliveryTimeout: franz-go counts it from the record's
		// timestamp, which is the edge time, so a backlog older than the
		// timeout would fail at once. The watchdog (closer) and Flush's
		// context bound a delivery instead.
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	if u.cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(u.cfg.TLS.Clone()))
	}
	if u.cfg.SASL != nil {
		opts = append(opts, kgo.SASL(u.cfg.SASL))
	}
	if u.cfg.ExactlyOnce {
		opts = append(opts, kgo.TransactionalID(u.TransactionalID()), kgo.TransactionTimeout(u.cfg.Timeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &Error{reason: "config", err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		cl.Close()
		return nil, err
	}
	if u.cfg.ExactlyOnce {
		// Fences a previous incarnation now, not at the first record.
		if _, _, err := cl.ProducerID(pctx); err != nil {
			cl.Close()
			return nil, err
		}
	}
	c := &conn{u: u, cl: cl, acks: make(chan uint64, 2*u.cfg.Window+4), done: make(chan struct{}), closed: make(chan struct{})}
	c.progress.Store(time.Now().UnixNano())
	go c.closer()
	return c, nil
}

// Error is an upstream failure with its reason for peat_sink_errors_total.
type Error struct {
	reason string
	err    error
}

func (e *Error) Error() string  { return e.err.Error() }
func (e *Error) Unwrap() error  { return e.err }
func (e *Error) Reason() string { return e.reason }

// conn is one client. Without ExactlyOnce each record is produced at once
// and acknowledged by its promise; with it, Send collects records and
// Flush writes them as one transaction, acknowledged once committed.
type conn struct {
	u    *Upstream
	cl   *kgo.Client
	acks chan uint64

	once   sync.Once
	done   chan struct{} // closed by fail
	err    error
	closed chan struct{} // closed by closer once acks is closed
	wg     sync.WaitGroup

	pending []pend // ExactlyOnce: the next transaction

	// outstanding counts records produced and not yet answered; progress
	// (unix ns) is the last answer, or when outstanding rose from 0.
	outstanding atomic.Int64
	progress    atomic.Int64
}

type pend struct {
	id  uint64
	rec *kgo.Record
}

var (
	_ sink.Conn    = (*conn)(nil)
	_ sink.Resumer = (*conn)(nil)
)

func (c *conn) Window() int         { return c.u.cfg.Window }
func (c *conn) Acks() <-chan uint64 { return c.acks }

func (c *conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

func (c *conn) fail(err error) {
	c.once.Do(func() {
		c.err = err
		close(c.done)
	})
}

// closer fails the connection when produced records go unanswered for
// the timeout; once it failed, it closes the client and, when every
// promise has run, the acks channel.
func (c *conn) closer() {
	defer close(c.closed)
	t := time.NewTicker(max(c.u.cfg.Timeout/4, 10*time.Millisecond))
	defer t.Stop()
	for waiting := true; waiting; {
		select {
		case <-c.done:
			waiting = false
		case <-t.C:
			idle := time.Since(time.Unix(0, c.progress.Load()))
			if c.outstanding.Load() > 0 && idle > c.u.cfg.Timeout {
				c.fail(&Error{reason: "timeout", err: fmt.Errorf("no answer from Kafka for %v", idle.Round(time.Millisecond))})
			}
		}
	}
	c.cl.Close()
	c.wg.Wait()
	close(c.acks)
}

func (c *conn) Close() error {
	c.fail(errors.New("closed"))
	<-c.closed
	return nil
}

func (c *conn) record(d sink.Delivery) *kgo.Record {
	r := d.Record
	hs := []kgo.RecordHeader{
		{Key: HeaderSite, Value: []byte(c.u.cfg.Site)},
		{Key: HeaderStream, Value: []byte(d.Stream)},
		{Key: HeaderOffset, Value: []byte(strconv.FormatUint(r.Offset, 10))},
		{Key: HeaderTime, Value: []byte(strconv.FormatInt(r.Timestamp, 10))},
		{Key: HeaderTopic, Value: []byte(r.Topic)},
	}
	for _, up := range r.UserProperties {
		hs = append(hs, kgo.RecordHeader{Key: up.Key, Value: []byte(up.Value)})
	}
	return &kgo.Record{
		Topic:     c.u.topicFor(d.Stream),
		Key:       c.u.keyFor(d.Stream, r),
		Value:     r.Payload,
		Headers:   hs,
		Timestamp: time.UnixMilli(r.Timestamp),
	}
}

// Send produces d (or, with ExactlyOnce, keeps it for the next Flush).
func (c *conn) Send(ctx context.Context, d sink.Delivery) error {
	if err := c.Err(); err != nil {
		return err
	}
	rec := c.record(d)
	if c.u.cfg.ExactlyOnce {
		c.pending = append(c.pending, pend{id: d.ID, rec: rec})
		return nil
	}
	c.wg.Add(1)
	if c.outstanding.Add(1) == 1 {
		c.progress.Store(time.Now().UnixNano())
	}
	id := d.ID
	c.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		defer c.wg.Done()
		c.outstanding.Add(-1)
		c.progress.Store(time.Now().UnixNano())
		if err != nil {
			c.fail(err)
			return
		}
		select {
		case c.acks <- id:
		case <-c.done:
		}
	})
	return nil
}

// Flush writes the pending records as one transaction (ExactlyOnce).
func (c *conn) Flush(ctx context.Context) error {
	if !c.u.cfg.ExactlyOnce || len(c.pending) == 0 {
		return c.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, c.u.cfg.Timeout)
	defer cancel()
	if err := c.cl.BeginTransaction(); err != nil {
		c.fail(err)
		return err
	}
	var mu sync.Mutex
	var produceErr error
	for _, p := range c.pending {
		c.cl.Produce(ctx, p.rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if produceErr == nil { // the first says why; the rest repeat it
					produceErr = err
				}
				mu.Unlock()
			}
		})
	}
	err := c.cl.Flush(ctx)
	mu.Lock()
	err = errors.Join(err, produceErr)
	mu.Unlock()
	if endErr := c.cl.EndTransaction(ctx, kgo.TransactionEndTry(err == nil)); err == nil {
		err = endErr
	}
	if err != nil {
		c.fail(err)
		return err
	}
	for _, p := range c.pending {
		select {
		case c.acks <- p.id:
		case <-c.done:
			return c.err
		}
	}
	c.pending = c.pending[:0]
	return nil
}

// tail is how many offsets before the end of each partition Resume reads:
// enough for the last transactions of this sink (each adds at most a
// window of records and one commit marker per partition).
func (c *conn) tail() int64 { return int64(4*c.u.cfg.Window + 16) }

// Resume reads the end of each partition of stream's topic (committed
// records only) and returns the offset after the highest edge offset this
// site wrote there for the stream: the output is the checkpoint. Only
// with ExactlyOnce: a transaction commits all its partitions or none, so
// every record below that offset is there too.
func (c *conn) Resume(ctx context.Context, stream string) (h sink.Held, ok bool, err error) {
	if !c.u.cfg.ExactlyOnce {
		return h, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.u.cfg.Timeout)
	defer cancel()
	topic := c.u.topicFor(stream)
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, c.cl)
	if err != nil {
		return h, false, err
	}
	if len(mresp.Topics) != 1 {
		return h, false, fmt.Errorf("metadata of %s: %d topics", topic, len(mresp.Topics))
	}
	t := mresp.Topics[0]
	if errors.Is(kerr.ErrorForCode(t.ErrorCode), kerr.UnknownTopicOrPartition) {
		return h, false, nil // nothing written yet
	}
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		return h, false, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	starts, err := c.listOffsets(ctx, topic, t.Partitions, -2)
	if err != nil {
		return h, false, err
	}
	ends, err := c.listOffsets(ctx, topic, t.Partitions, -1)
	if err != nil {
		return h, false, err
	}
	site := c.u.cfg.Site
	for _, p := range t.Partitions {
		from := max(starts[p.Partition], ends[p.Partition]-c.tail())
		for f := from; f < ends[p.Partition]; {
			fp, nextOff, err := c.fetch(ctx, topic, t.TopicID, p.Partition, p.Leader, f)
			if err != nil {
				return h, false, err
			}
			for _, r := range fp.Records {
				var rs, rst, ro, rt, rtop string
				for _, hd := range r.Headers {
					switch hd.Key {
					case HeaderSite:
						rs = string(hd.Value)
					case HeaderStream:
						rst = string(hd.Value)
					case HeaderOffset:
						ro = string(hd.Value)
					case HeaderTime:
						rt = string(hd.Value)
					case HeaderTopic:
						rtop = string(hd.Value)
					}
				}
				if rs != site || rst != stream {
					continue
				}
				if off, err := strconv.ParseUint(ro, 10, 64); err == nil && (!ok || off+1 > h.Next) {
					ms, _ := strconv.ParseInt(rt, 10, 64)
					h, ok = sink.Held{Next: off + 1, Time: ms, Topic: rtop}, true
				}
			}
			if nextOff <= f {
				break
			}
			f = nextOff
		}
	}
	return h, ok, nil
}

// listOffsets returns each partition's earliest (ts -2) or last stable
// (ts -1, read committed) offset.
func (c *conn) listOffsets(ctx context.Context, topic string, parts []kmsg.MetadataResponseTopicPartition, ts int64) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range parts {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p.Partition, ts
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, err)
			}
			out[p.Partition] = p.Offset
		}
	}
	return out, nil
}

// fetch reads committed records of one partition from offset from.
func (c *conn) fetch(ctx context.Context, topic string, id [16]byte, partition, leader int32, from int64) (kgo.FetchPartition, int64, error) {
	req := kmsg.NewPtrFetchRequest()
	req.IsolationLevel = 1
	req.MaxBytes = 4 << 20
	req.MaxWaitMillis = 0
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, from, 1<<20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, c.cl.Broker(int(leader)))
	if err != nil {
		return kgo.FetchPartition{}, 0, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return kgo.FetchPartition{}, 0, fmt.Errorf("fetch %s/%d: %w", topic, partition, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return kgo.FetchPartition{}, 0, fmt.Errorf("fetch %s/%d: unexpected response shape", topic, partition)
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
		Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: partition,
	}, &resp.Topics[0].Partitions[0], kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		return fp, 0, fmt.Errorf("fetch %s/%d: %w", topic, partition, fp.Err)
	}
	return fp, next, nil
}
