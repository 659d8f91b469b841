package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/peatmq/peat/logstore"
)

// queueLen bounds what waits for a stream's writer; a full queue holds
// the sender's read goroutine (TCP back-pressure).
const queueLen = 1024

// Hook is the mochi hook that takes publishes to $mirror/<stream> into the
// mirror stream of that name. mochi checks the publisher's ACL on the
// $mirror topic before the hook sees it; the hook acks each publish itself,
// once its record is durable (or known to be).
type Hook struct {
	mochi.HookBase
	store   *logstore.Store
	site    Site // nil on a single node
	log     *slog.Logger
	records *prometheus.CounterVec // stream, result

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	writers map[*logstore.Stream]chan item // by stream, not name: a stream removed and added again gets a new writer
	stopped bool
}

// Site is a site's log (cluster.Log): it applies the rules on the mirror
// stream's leader, wherever the publish arrived, and answers once the
// records it took are committed in the site.
type Site interface {
	Mirror(ctx context.Context, stream string, in []Incoming) ([]Result, []error)
}

// item is one publish waiting for its stream's writer.
type item struct {
	cl  *mochi.Client
	pid uint16
	in  Incoming
}

var _ mochi.Hook = (*Hook)(nil)

// Records is peat_mirror_records_total, by stream and result.
func (h *Hook) Records() *prometheus.CounterVec { return h.records }

// Results counted in peat_mirror_records_total.
const (
	resultAppended  = "appended"
	resultDuplicate = "duplicate"
	resultRefused   = "refused"
	resultGap       = "gap" // offsets the source dropped before sending: markers, or the log start moved
)

// NewHook returns the hook over store's mirror streams, written through
// site when it is not nil (a node of a site) and into store otherwise;
// its metrics go to reg when it is not nil.
func NewHook(store *logstore.Store, site Site, log *slog.Logger, reg prometheus.Registerer) (*Hook, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	records := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_mirror_records_total",
		Help: "Records received for mirror streams, by result: appended, duplicate (a resend, acknowledged), refused, gap (offsets the source dropped before sending)."},
		[]string{"stream", "result"})
	if reg != nil {
		if err := reg.Register(records); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			records = are.ExistingCollector.(*prometheus.CounterVec) // a node started again
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hook{store: store, site: site, log: log, records: records, ctx: ctx, cancel: cancel, writers: map[*logstore.Stream]chan item{}}, nil
}

// ID names the hook.
func (h *Hook) ID() string { return "peat-mirror" }

// Provides reports the hook's events.
func (h *Hook) Provides(b byte) bool { return b == mochi.OnPublish }

// Stop ends the writers (mochi calls it when the server closes, before the
// log closes); publishes still queued are not acked, and are sent again.
func (h *Hook) Stop() error {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	return nil
}

// Reason codes of refused mirror publishes.
var (
	codeNoMirror = packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: "no mirror stream of that name"}
	codeBadProps = packets.Code{Code: packets.ErrImplementationSpecificError.Code, Reason: "a mirror publish needs QoS 1 and the peat-* properties of a Peat sink"}
)

// OnPublish takes $mirror/ publishes; others pass.
func (h *Hook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	name, ok := strings.CutPrefix(pk.TopicName, Prefix)
	if !ok || cl.Net.Inline {
		return pk, nil
	}
	if pk.FixedHeader.Qos != 1 || cl.Properties.ProtocolVersion != 5 {
		h.refuse(cl, pk, codeBadProps)
		return pk, packets.ErrRejectPacket
	}
	st := h.store.Stream(name)
	if st == nil || !st.Config().Mirror {
		h.refuse(cl, pk, codeNoMirror)
		return pk, packets.ErrRejectPacket
	}
	in, err := incoming(&pk)
	if err != nil {
		h.refuse(cl, pk, packets.Code{Code: codeBadProps.Code, Reason: err.Error()})
		return pk, packets.ErrRejectPacket
	}
	q := h.writer(st)
	if q == nil {
		return pk, packets.ErrRejectPacket // closing: the sender sends it again
	}
	select {
	case q <- item{cl: cl, pid: pk.PacketID, in: in}:
	case <-h.ctx.Done():
	}
	return pk, packets.ErrRejectPacket
}

// refuse answers pk with a failure code; an MQTT 3 client (no negative
// acks) is disconnected.
func (h *Hook) refuse(cl *mochi.Client, pk packets.Packet, code packets.Code) {
	h.log.Warn("mirror publish refused", slog.String("client", cl.ID), slog.String("topic", pk.TopicName), slog.String("reason", code.Reason))
	if pk.FixedHeader.Qos == 0 {
		return
	}
	if cl.Properties.ProtocolVersion != 5 {
		cl.Stop(code)
		return
	}
	typ := byte(packets.Puback)
	if pk.FixedHeader.Qos == 2 {
		typ = packets.Pubrec
	}
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: pk.PacketID,
		ReasonCode: code.Code, Properties: packets.Properties{ReasonString: code.Reason}})
}

// writer returns st's queue, starting its writer on first use.
func (h *Hook) writer(st *logstore.Stream) chan item {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil
	}
	q, ok := h.writers[st]
	if !ok {
		q = make(chan item, queueLen)
		h.writers[st] = q
		h.wg.Add(1)
		go h.write(st, q)
	}
	return q
}

// write is a stream's writer: it applies what is queued, in order, in
// batches (one commit for all that arrived meanwhile), then acks.
func (h *Hook) write(st *logstore.Stream, q chan item) {
	defer h.wg.Done()
	var batch []item
	var in []Incoming
	for {
		select {
		case <-h.ctx.Done():
			return
		case it := <-q:
			batch = append(batch[:0], it)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case it := <-q:
				batch = append(batch, it)
			default:
				break more
			}
		}
		in = in[:0]
		for _, it := range batch {
			in = append(in, it.in)
		}
		var res []Result
		var errs []error
		next, empty := st.NextOffset(), st.FirstOffset() == st.NextOffset()
		if h.site != nil {
			res, errs = h.site.Mirror(h.ctx, st.Name(), in)
			next = siteNext(st, next, empty, res, in)
		} else {
			res, errs = Apply(h.ctx, st, 0, in)
		}
		if h.ctx.Err() != nil {
			return
		}
		// Counted and logged before the PUBACKs go: a sender that got
		// them finds the metrics already saying what was done.
		if gap, missing := gaps(next, res, in); gap != "" {
			h.records.WithLabelValues(st.Name(), resultGap).Add(float64(missing))
			h.log.Warn("mirror gap marked: the source dropped records before they were sent", slog.String("stream", st.Name()), slog.String("offsets", gap))
		}
		for i, it := range batch {
			code := packets.CodeSuccess
			h.records.WithLabelValues(st.Name(), [...]string{Appended: resultAppended, Duplicate: resultDuplicate, Refused: resultRefused}[res[i]]).Inc()
			if res[i] == Refused {
				code = packets.Code{Code: packets.ErrUnspecifiedError.Code, Reason: errs[i].Error()}
				h.log.Warn("mirror record refused", slog.String("stream", st.Name()), slog.Uint64("offset", it.in.Offset), slog.Any("err", errs[i]))
			}
			ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: it.pid, ReasonCode: code.Code}
			if code.Code != 0 {
				ack.Properties.ReasonString = code.Reason
			}
			_ = it.cl.WritePacket(ack)
		}
	}
}

// siteNext is the log end the leader applied a batch at, as far as gaps
// need it: this replica's own end may lag the leader's. The first record
// appended finds the marker of a gap before it in this replica, which
// holds it by now (Site.Mirror answers once this replica's watermark
// passed what it took), or the log starting at it where this replica was
// empty (from before, its end then).
func siteNext(st *logstore.Stream, before uint64, empty bool, res []Result, in []Incoming) uint64 {
	for i, r := range res {
		if r != Appended {
			continue
		}
		n := in[i].Offset
		switch {
		case n == 0:
		case n-1 >= st.FirstOffset():
			recs, err := st.Read(n-1, 1, 0)
			if err != nil || len(recs) == 0 || recs[0].Topic != GapTopic || len(recs[0].UserProperties) == 0 {
				return n
			}
			from, _, _ := strings.Cut(recs[0].UserProperties[0].Value, "-")
			if f, err := strconv.ParseUint(from, 10, 64); err == nil && f < n {
				return f
			}
		case empty && before < n:
			return before
		}
		return n
	}
	return before
}

// gaps names the offsets an Apply from log end next marked missing (or
// started the log after), "" when none.
func gaps(next uint64, res []Result, in []Incoming) (string, uint64) {
	var out []string
	var missing uint64
	for i, r := range res {
		if r != Appended {
			continue
		}
		if in[i].Offset > next {
			out = append(out, fmt.Sprintf("%d..%d", next, in[i].Offset-1))
			missing += in[i].Offset - next
		}
		next = in[i].Offset + 1
	}
	return strings.Join(out, ", "), missing
}

// incoming reads a mirror publish: the record as it was in the source,
// with the sender's peat-* properties (the last len(Props)) taken off.
func incoming(pk *packets.Packet) (Incoming, error) {
	p := pk.Properties.User
	if len(p) < len(Props) {
		return Incoming{}, fmt.Errorf("missing peat-* properties")
	}
	tail := p[len(p)-len(Props):]
	v := map[string]string{}
	for i, k := range Props {
		if tail[i].Key != k {
			return Incoming{}, fmt.Errorf("property %d from the end is %q, want %q", len(Props)-i, tail[i].Key, k)
		}
		v[k] = tail[i].Val
	}
	num := func(k string) (uint64, error) {
		n, err := strconv.ParseUint(v[k], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: not a number", k, v[k])
		}
		return n, nil
	}
	var n [5]uint64
	for i, k := range []string{PropOffset, PropTime, PropQoS, PropExpiry, PropFirst} {
		var err error
		if n[i], err = num(k); err != nil {
			return Incoming{}, err
		}
	}
	if n[2] > 2 || n[3] > 1<<32-1 || v[PropTopic] == "" {
		return Incoming{}, fmt.Errorf("bad peat-qos, peat-expiry or peat-topic")
	}
	pp := &pk.Properties
	r := &logstore.Record{
		Timestamp:       int64(n[1]),
		Topic:           v[PropTopic],
		Payload:         pk.Payload,
		QoS:             byte(n[2]),
		Retain:          pk.FixedHeader.Retain,
		ClientID:        v[PropClient],
		ContentType:     pp.ContentType,
		ResponseTopic:   pp.ResponseTopic,
		CorrelationData: pp.CorrelationData,
		MessageExpiry:   uint32(n[3]),
	}
	if pp.PayloadFormatFlag {
		pf := pp.PayloadFormat
		r.PayloadFormat = &pf
	}
	for _, u := range p[:len(p)-len(Props)] {
		r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: u.Key, Value: u.Val})
	}
	return Incoming{Offset: n[0], First: n[4], Record: r}, nil
}
