package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/peatmq/peat/edge/sink/kafkasink"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// Upstream is a Kafka cluster a source consumes from, on franz-go.
type Upstream struct {
	cfg Config
}

var _ source.Upstream = (*Upstream)(nil)

// New checks cfg; it dials nothing.
func New(cfg Config) (*Upstream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafkasource: %w", err)
	}
	cfg.defaults()
	return &Upstream{cfg: cfg}, nil
}

// String names the cluster and topics.
func (u *Upstream) String() string { return u.Origin() + "/" + strings.Join(u.cfg.Topics, ",") }

// Origin names the cluster as a Kafka sink to it names itself
// (kafkasink.Origin): such a sink skips what this source brought down.
func (u *Upstream) Origin() string { return kafkasink.Origin(u.cfg.Brokers) }

// Error is an upstream failure with its reason for peat_source_errors_total.
type Error struct {
	reason string
	err    error
}

func (e *Error) Error() string  { return e.err.Error() }
func (e *Error) Unwrap() error  { return e.err }
func (e *Error) Reason() string { return e.reason }

func (u *Upstream) opts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(u.cfg.Brokers...),
		kgo.DialTimeout(u.cfg.Timeout),
	}
	if u.cfg.ClientID != "" {
		opts = append(opts, kgo.ClientID(u.cfg.ClientID))
	}
	if u.cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(u.cfg.TLS.Clone()))
	}
	if u.cfg.SASL != nil {
		opts = append(opts, kgo.SASL(u.cfg.SASL))
	}
	return opts
}

// Connect finds in the log where the source left off (Resume), assigns
// itself every partition of the topics at those offsets (a partition the
// log holds nothing of at Start, resolved to an offset now) and starts
// fetching.
func (u *Upstream) Connect(ctx context.Context, r source.Resume) (source.Conn, error) {
	pos, scanned, found, err := Resume(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("kafkasource: resume from %s: %w", r.Stream(), err)
	}
	u.cfg.Logger.Debug("kafka source resumes", slog.String("source", u.cfg.Name), slog.Int("scanned", scanned),
		slog.Bool("found", found), slog.String("positions", pos.String()))
	admin, err := kgo.NewClient(u.opts()...)
	if err != nil {
		return nil, &Error{reason: "config", err: err}
	}
	assign, ids, err := u.assign(ctx, admin, pos)
	admin.Close()
	if err != nil {
		return nil, err
	}
	offsets := map[string]map[int32]kgo.Offset{}
	for tp, next := range assign {
		if offsets[tp.Topic] == nil {
			offsets[tp.Topic] = map[int32]kgo.Offset{}
		}
		offsets[tp.Topic][tp.Partition] = kgo.NewOffset().At(next)
	}
	iso := kgo.ReadCommitted()
	if u.cfg.ReadUncommitted {
		iso = kgo.ReadUncommitted()
	}
	cl, err := kgo.NewClient(append(u.opts(),
		kgo.ConsumePartitions(offsets),
		kgo.FetchIsolationLevel(iso),
		// An offset Kafka no longer has (retention passed it) restarts
		// the partition at the earliest it has; kgo reports the loss.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)...)
	if err != nil {
		return nil, &Error{reason: "config", err: err}
	}
	c := &conn{u: u, r: r, cl: cl, next: assign, ids: ids, turn: make(chan struct{}, 1), refreshed: time.Now()}
	c.mu.durable = maps.Clone(assign)
	c.mu.ends = map[TP]int64{}
	c.turn <- struct{}{}
	return c, nil
}

// assign returns the offset each partition of the topics starts at: its
// position in pos, or Start for a partition pos lacks.
func (u *Upstream) assign(ctx context.Context, cl *kgo.Client, pos Positions) (Positions, map[string][16]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	defer cancel()
	parts, ids, err := partitions(ctx, cl, u.cfg.Topics)
	if err != nil {
		return nil, nil, err
	}
	out := Positions{}
	var missing []TP
	for _, tp := range parts {
		if next, ok := pos[tp]; ok {
			out[tp] = next
		} else {
			missing = append(missing, tp)
		}
	}
	if len(missing) > 0 {
		ts := int64(-2) // earliest
		if u.cfg.Start == StartLatest {
			ts = -1
		}
		starts, err := listOffsets(ctx, cl, missing, ts, !u.cfg.ReadUncommitted)
		if err != nil {
			return nil, nil, err
		}
		maps.Copy(out, starts)
	}
	return out, ids, nil
}

// partitions lists every partition of topics, and their topic ids.
func partitions(ctx context.Context, cl *kgo.Client, topics []string) ([]TP, map[string][16]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, mt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, nil, err
	}
	var out []TP
	ids := map[string][16]byte{}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, nil, &Error{reason: "protocol", err: fmt.Errorf("metadata of %s: %w", *t.Topic, err)}
		}
		ids[*t.Topic] = t.TopicID
		for _, p := range t.Partitions {
			out = append(out, TP{Topic: *t.Topic, Partition: p.Partition})
		}
	}
	return out, ids, nil
}

// listOffsets returns the earliest (ts -2) or latest (ts -1: the end, or
// the last stable offset when committed) offset of each of tps.
func listOffsets(ctx context.Context, cl *kgo.Client, tps []TP, ts int64, committed bool) (Positions, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	if committed {
		req.IsolationLevel = 1
	}
	byTopic := map[string]*kmsg.ListOffsetsRequestTopic{}
	for _, tp := range tps {
		rt := byTopic[tp.Topic]
		if rt == nil {
			req.Topics = append(req.Topics, kmsg.NewListOffsetsRequestTopic())
			rt = &req.Topics[len(req.Topics)-1]
			rt.Topic = tp.Topic
			byTopic[tp.Topic] = rt
		}
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = tp.Partition, ts
		rt.Partitions = append(rt.Partitions, rp)
	}
	// byTopic points into req.Topics: appends above may have moved it.
	for i := range req.Topics {
		byTopic[req.Topics[i].Topic] = &req.Topics[i]
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := Positions{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, &Error{reason: "protocol", err: fmt.Errorf("list offsets of %s/%d: %w", t.Topic, p.Partition, err)}
			}
			out[TP{Topic: t.Topic, Partition: p.Partition}] = p.Offset
		}
	}
	return out, nil
}

// markEvery is how often the source moves its mark (Resume.SetMark) to
// its newest stored batch: the start's scan reads at most what was
// stored since.
const markEvery = time.Second

// conn is one consuming client. Batches go one at a time: Next returns
// the next only once the framework has stored the one before (Done).
// The position properties of a batch say where the source is once it is
// stored; a later batch stored while an earlier one failed would say
// the earlier one's records are stored too.
type conn struct {
	u    *Upstream
	r    source.Resume
	cl   *kgo.Client
	turn chan struct{} // holds a token while no batch waits to be stored

	next      Positions           // next offset to read, by partition (Next's goroutine)
	ids       map[string][16]byte // topic ids, under mu (group commits of v10 name topics by id)
	pending   []Positions         // next once each batch handed out is stored, oldest first
	pmu       sync.Mutex          // guards pending
	refreshed time.Time

	mu struct {
		sync.Mutex
		durable   Positions // stored
		ends      map[TP]int64
		committed time.Time // last group commit
		marked    time.Time // last SetMark
		marking   bool
	}
	commits sync.WaitGroup // group commits and marks
}

var (
	_ source.Conn   = (*conn)(nil)
	_ source.Lagger = (*conn)(nil)
)

// Next returns the next batch of records once the one before is stored.
func (c *conn) Next(ctx context.Context) ([]source.Message, error) {
	select {
	case <-c.turn:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		if time.Since(c.refreshed) > c.u.cfg.Refresh {
			if err := c.refresh(ctx); err != nil {
				c.turn <- struct{}{}
				return nil, err
			}
		}
		msgs, err := c.poll(ctx)
		if err != nil || len(msgs) > 0 {
			if err != nil {
				c.turn <- struct{}{}
			}
			return msgs, err
		}
	}
}

// poll fetches once and turns what came into messages; the last record
// that is stored carries the positions after all of them.
func (c *conn) poll(ctx context.Context) ([]source.Message, error) {
	fs := c.cl.PollRecords(ctx, c.u.cfg.MaxBatch)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if fs.IsClientClosed() {
		return nil, &Error{reason: "closed", err: kgo.ErrClientClosed}
	}
	var fatal error
	fs.EachError(func(t string, p int32, err error) {
		var loss *kgo.ErrDataLoss
		switch {
		case errors.As(err, &loss):
			c.u.cfg.Logger.Error("kafka source: records lost upstream before they were read",
				slog.String("source", c.u.cfg.Name), slog.String("partition", TP{t, p}.String()),
				slog.Int64("from", loss.ConsumedTo), slog.Int64("to", loss.ResetTo))
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		default:
			if fatal == nil {
				fatal = &Error{reason: "protocol", err: fmt.Errorf("fetch %s/%d: %w", t, p, err)}
			}
		}
	})
	if fatal != nil {
		return nil, fatal
	}
	ends := map[TP]int64{}
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		end := p.LastStableOffset
		if c.u.cfg.ReadUncommitted || end < 0 {
			end = p.HighWatermark
		}
		ends[TP{p.Topic, p.Partition}] = end
	})
	var msgs []source.Message
	fs.EachRecord(func(r *kgo.Record) {
		tp := TP{r.Topic, r.Partition}
		c.next[tp] = r.Offset + 1
		if rec := c.record(r, tp); rec != nil {
			msgs = append(msgs, source.Message{Record: rec})
		}
	})
	c.mu.Lock()
	maps.Copy(c.mu.ends, ends)
	c.mu.Unlock()
	if len(msgs) > 0 {
		last := msgs[len(msgs)-1].Record
		after := maps.Clone(c.next)
		last.UserProperties = append(last.UserProperties, logstore.UserProperty{Key: PropNext, Value: after.String()})
		c.pmu.Lock()
		c.pending = append(c.pending, after)
		c.pmu.Unlock()
	}
	return msgs, nil
}

// record is r as a log record, nil when its topic maps to none.
func (c *conn) record(r *kgo.Record, tp TP) *logstore.Record {
	topic, ok := mapTopic(c.u.cfg.Topic, r)
	if !ok {
		c.u.cfg.Logger.Warn("kafka source: record skipped, its topic maps to no MQTT topic",
			slog.String("source", c.u.cfg.Name), slog.String("partition", tp.String()),
			slog.Int64("offset", r.Offset), slog.String("topic", topic))
		return nil
	}
	rec := &logstore.Record{Topic: topic, Payload: r.Value, QoS: c.u.cfg.QoS}
	for _, h := range r.Headers {
		// Headers that are not UTF-8 cannot be MQTT user properties, and
		// peat-source* ones would pass for the source's own.
		if strings.HasPrefix(h.Key, source.PropSource) || strings.HasPrefix(h.Key, source.PropOrigin) ||
			!utf8.ValidString(h.Key) || !utf8.Valid(h.Value) {
			continue
		}
		rec.UserProperties = append(rec.UserProperties, logstore.UserProperty{Key: h.Key, Value: string(h.Value)})
	}
	rec.UserProperties = append(rec.UserProperties, positionProps(tp, r.Offset)...)
	return rec
}

// Done takes a stored batch: its positions are durable; the next batch
// may go.
func (c *conn) Done(msgs []source.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c.pmu.Lock()
	if len(c.pending) == 0 {
		c.pmu.Unlock()
		return errors.New("kafkasource: a batch done that was not handed out")
	}
	after := c.pending[0]
	c.pending = c.pending[1:]
	c.pmu.Unlock()
	c.mu.Lock()
	c.mu.durable = after
	commit := c.u.cfg.Group != "" && time.Since(c.mu.committed) >= c.u.cfg.CommitEvery
	if commit {
		c.mu.committed = time.Now()
	}
	off, stored := carrier(msgs)
	mark := stored && !c.mu.marking && time.Since(c.mu.marked) >= markEvery
	if mark {
		c.mu.marking, c.mu.marked = true, time.Now()
	}
	c.mu.Unlock()
	if mark {
		c.commits.Add(1)
		go func() {
			defer c.commits.Done()
			if err := c.r.SetMark(off); err != nil {
				c.u.cfg.Logger.Warn("kafka source: mark not stored (the next start scans further)", slog.String("source", c.u.cfg.Name), slog.Any("err", err))
			}
			c.mu.Lock()
			c.mu.marking = false
			c.mu.Unlock()
		}()
	}
	if commit {
		c.commits.Add(1)
		go func() {
			defer c.commits.Done()
			c.commitGroup(after)
		}()
	}
	select {
	case c.turn <- struct{}{}:
	default:
	}
	return nil
}

// carrier is the offset of the batch's last record, which carries
// PropNext (poll), when it was stored: the framework drops a record
// another stream captures, and leaves its Offset unset. Stored records
// hold increasing offsets, so the last one is stored when its offset is
// the batch's highest; at offset 0 that says nothing, and the mark can
// wait.
func carrier(msgs []source.Message) (uint64, bool) {
	last := msgs[len(msgs)-1].Record
	if last == nil || last.Offset == 0 {
		return 0, false
	}
	for _, m := range msgs[:len(msgs)-1] {
		if m.Record != nil && m.Record.Offset > last.Offset {
			return 0, false
		}
	}
	return last.Offset, true
}

// commitGroup writes pos to the group, as a consumer outside any group
// membership commits (generation -1): for Kafka's tools, never read back.
func (c *conn) commitGroup(pos Positions) {
	ctx, cancel := context.WithTimeout(context.Background(), c.u.cfg.Timeout)
	defer cancel()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = c.u.cfg.Group, -1
	idx := map[string]int{}
	for tp, next := range pos {
		i, ok := idx[tp.Topic]
		if !ok {
			t := kmsg.NewOffsetCommitRequestTopic()
			t.Topic = tp.Topic
			c.mu.Lock()
			t.TopicID = c.ids[tp.Topic]
			c.mu.Unlock()
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
			idx[tp.Topic] = i
		}
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset, p.LeaderEpoch = tp.Partition, next, -1
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, p)
	}
	resp, err := req.RequestWith(ctx, c.cl)
	if err == nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				err = errors.Join(err, kerr.ErrorForCode(p.ErrorCode))
			}
		}
	}
	if err != nil {
		c.u.cfg.Logger.Warn("kafka source: group commit failed (visibility only)", slog.String("source", c.u.cfg.Name),
			slog.String("group", c.u.cfg.Group), slog.Any("err", err))
	}
}

// refresh assigns partitions that appeared upstream since the last look.
func (c *conn) refresh(ctx context.Context) error {
	c.refreshed = time.Now()
	rctx, cancel := context.WithTimeout(ctx, c.u.cfg.Timeout)
	defer cancel()
	parts, ids, err := partitions(rctx, c.cl, c.u.cfg.Topics)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.ids = ids
	c.mu.Unlock()
	var added []TP
	for _, tp := range parts {
		if _, ok := c.next[tp]; !ok {
			added = append(added, tp)
		}
	}
	if len(added) == 0 {
		return nil
	}
	// A partition created after the source started reads from its
	// beginning, whatever Start says: all of it is new since then.
	starts, err := listOffsets(rctx, c.cl, added, -2, !c.u.cfg.ReadUncommitted)
	if err != nil {
		return err
	}
	add := map[string]map[int32]kgo.Offset{}
	for tp, off := range starts {
		c.next[tp] = off
		if add[tp.Topic] == nil {
			add[tp.Topic] = map[int32]kgo.Offset{}
		}
		add[tp.Topic][tp.Partition] = kgo.NewOffset().At(off)
	}
	c.cl.AddConsumePartitions(add)
	c.u.cfg.Logger.Info("kafka source: partitions added", slog.String("source", c.u.cfg.Name), slog.String("positions", Positions(starts).String()))
	return nil
}

// Lag is how many offsets the stored positions are behind the ends the
// last fetches reported (the last stable offset when reading committed
// records, whose commit markers take an offset each).
func (c *conn) Lag() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.mu.ends) == 0 {
		return 0, false
	}
	var lag int64
	for tp, end := range c.mu.ends {
		if d, ok := c.mu.durable[tp]; ok && end > d {
			lag += end - d
		}
	}
	return lag, true
}

// Close ends the client; what was fetched and not stored is fetched again
// by the next connection. With a Group, the stored positions go to it a
// last time first.
func (c *conn) Close() error {
	c.commits.Wait()
	if c.u.cfg.Group != "" {
		c.mu.Lock()
		pos := c.mu.durable
		c.mu.Unlock()
		c.commitGroup(pos)
	}
	c.cl.Close()
	return nil
}
