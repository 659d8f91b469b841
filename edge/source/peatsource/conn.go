package peatsource

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// The user properties a Peat's replay adds after a record's own (mqtt:
// delivery_tap.go), the one it adds before them to an expired record, and
// the one it adds after them, when asked, naming the record's publisher
// (also the SUBSCRIBE's request and the SUBACK's answer to it).
const (
	replayStream    = "stream"
	replayOffset    = "offset"
	replayTimestamp = "timestamp"
	replayExpired   = "expired"
	replayClient    = "client"
)

// conn is one replay subscription. The reader turns PUBLISHes into
// messages for Next (and answers PUBRELs); Done acknowledges; the pinger
// keeps the keepalive. Batches go one at a time (turn): a mirror takes a
// record after a gap only as a gap the upstream left (First), so no batch
// may be written after one that failed.
type conn struct {
	u    *Upstream
	nc   net.Conn
	br   *bufio.Reader
	head string // "$replay/<from>/": the start of every delivered topic
	in   chan source.Message
	turn chan struct{}

	*mqttclient.Link // writes, and how the connection ends

	next     uint64 // the offset after the last record read (reader's)
	end      atomic.Uint64
	durable  atomic.Uint64 // the offset after the last record stored
	lastRead atomic.Int64  // unix ns
}

var (
	_ source.Conn   = (*conn)(nil)
	_ source.Lagger = (*conn)(nil)
)

func newConn(u *Upstream, nc net.Conn, br *bufio.Reader, next uint64) *conn {
	c := &conn{
		u: u, nc: nc, br: br,
		head: "$replay/" + strconv.FormatUint(next, 10) + "/",
		in:   make(chan source.Message, u.cfg.Window+maxBatch),
		turn: make(chan struct{}, 1),
		Link: mqttclient.NewLink(nc, u.cfg.Keepalive),
		next: next,
	}
	c.durable.Store(next)
	c.turn <- struct{}{}
	c.lastRead.Store(time.Now().UnixNano())
	return c
}

// subscribe sends the replay's SUBSCRIBE (QoS 2, so that every record
// comes with the QoS it was published with) and reads its SUBACK: a
// refusal, or a filter that reached a stream other than Config.Stream,
// fails the connect.
func (c *conn) subscribe(ctx context.Context) error {
	next := c.next
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: 5,
		PacketID:        subscribeID,
		Filters:         packets.Subscriptions{{Filter: c.u.replayFilter(next), Qos: 2}},
		// Ask for each record's publisher: headquarters shows it where
		// its ACL lets this connection's user see it.
		Properties: packets.Properties{User: []packets.UserProperty{{Key: replayClient, Val: "true"}}},
	}
	var buf bytes.Buffer
	if err := pk.SubscribeEncode(&buf); err != nil {
		return mqttclient.WithReason("protocol", fmt.Errorf("encode SUBSCRIBE: %w", err))
	}
	_ = c.nc.SetDeadline(time.Now().Add(c.u.cfg.Timeout))
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Now()) })
	defer stop()
	if err := c.Write(buf.Bytes()); err != nil {
		return err
	}
	for {
		ack, err := mqttclient.ReadPacket(c.br, 5, nil, mqttclient.MaxControlPacket)
		if err != nil {
			return err
		}
		switch ack.FixedHeader.Type {
		case packets.Pingresp:
			continue
		case packets.Suback:
		default:
			return mqttclient.Errorf("protocol", "packet type %d before the SUBACK", ack.FixedHeader.Type)
		}
		if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] >= 0x80 {
			return mqttclient.Errorf("refused", "upstream refused the replay %q: %v %s", c.u.replayFilter(next), ack.ReasonCodes, ack.Properties.ReasonString)
		}
		props := map[string]string{}
		for _, p := range ack.Properties.User {
			props[p.Key] = p.Val
		}
		if want := c.u.cfg.Stream; want != "" && props[replayStream] != want {
			return mqttclient.Errorf("refused", "the replay %q reaches stream %q upstream, not %q", c.u.replayFilter(next), props[replayStream], want)
		}
		start, _ := strconv.ParseUint(props["start"], 10, 64)
		end, _ := strconv.ParseUint(props["end"], 10, 64)
		c.end.Store(max(end, next))
		if props[replayClient] != "true" && !c.u.noClients.Swap(true) {
			c.u.cfg.Logger.Warn("peat source: the upstream does not show publishers' client ids (a Peat before they could be asked for); mirrored records carry none",
				slog.String("stream", props[replayStream]))
		}
		if start > next {
			c.u.cfg.Logger.Warn("peat source: the upstream no longer holds the records after the mirror's end; they become gap markers",
				slog.String("stream", props[replayStream]), slog.Uint64("from", next), slog.Uint64("to", start))
		}
		_ = c.nc.SetDeadline(time.Time{})
		return nil
	}
}

func (c *conn) start() {
	c.WG.Add(2)
	go c.readLoop()
	go c.pingLoop()
}

// Next returns the records read so far (at least one), once the batch
// before is stored.
func (c *conn) Next(ctx context.Context) ([]source.Message, error) {
	select {
	case <-c.turn:
	case <-c.Ended():
		return nil, c.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var msgs []source.Message
	select {
	case m := <-c.in:
		msgs = append(msgs, m)
	case <-c.Ended():
		c.turn <- struct{}{}
		return nil, c.Err()
	case <-ctx.Done():
		c.turn <- struct{}{}
		return nil, ctx.Err()
	}
	for len(msgs) < maxBatch {
		select {
		case m := <-c.in:
			msgs = append(msgs, m)
		default:
			return msgs, nil
		}
	}
	return msgs, nil
}

// token packs a delivery's QoS and packet id into Message.Ack.
func token(qos byte, pid uint16) uint64 { return uint64(qos)<<16 | uint64(pid) }

// Done acknowledges msgs, now stored, in order (PUBACK for QoS 1, PUBREC
// for QoS 2, whose PUBREL the reader answers), and lets the next batch go.
func (c *conn) Done(msgs []source.Message) error {
	var buf []byte
	for _, m := range msgs {
		switch qos, pid := byte(m.Ack>>16), uint16(m.Ack); qos {
		case 1:
			buf = append(buf, mqttclient.Ack(packets.Puback, pid)...)
		case 2:
			buf = append(buf, mqttclient.Ack(packets.Pubrec, pid)...)
		}
		if m.Record != nil {
			c.durable.Store(m.Record.Offset + 1)
		}
	}
	if len(buf) > 0 {
		if err := c.Write(buf); err != nil {
			return err
		}
	}
	select {
	case c.turn <- struct{}{}:
	default:
	}
	return nil
}

// Lag is what is left of the history the upstream held when the replay
// started: its committed end then, less what is stored here.
func (c *conn) Lag() (int64, bool) {
	end, d := c.end.Load(), c.durable.Load()
	if end <= d {
		return 0, true
	}
	return int64(end - d), true
}

// readLoop reads the upstream's packets until the connection fails.
func (c *conn) readLoop() {
	defer c.WG.Done()
	for {
		pk, err := mqttclient.ReadPacket(c.br, 5, nil, c.u.cfg.MaxPacket)
		if err != nil {
			c.Fail(err)
			return
		}
		c.lastRead.Store(time.Now().UnixNano())
		switch pk.FixedHeader.Type {
		case packets.Publish:
			m, err := c.message(pk)
			if err != nil {
				c.Fail(err)
				return
			}
			select {
			case c.in <- m:
			case <-c.Ended():
				return
			}
		case packets.Pubrel:
			// The PUBREC went once the record was stored: nothing is
			// left to do for it.
			if c.Write(mqttclient.Ack(packets.Pubcomp, pk.PacketID)) != nil {
				return
			}
		case packets.Pingresp:
		case packets.Disconnect:
			c.Fail(mqttclient.Errorf("refused", "upstream disconnected: reason %#x %s", pk.ReasonCode, pk.Properties.ReasonString))
			return
		default:
			c.Fail(mqttclient.Errorf("protocol", "unexpected packet type %d from upstream", pk.FixedHeader.Type))
			return
		}
	}
}

// message turns a replay delivery into a record at its upstream offset:
// the offset from its topic ($replay/<from>/<offset>/<topic>), its time
// and publisher from the replay's properties, which are taken off. A
// record at or below one already read (never on one connection) comes
// with no record.
func (c *conn) message(pk packets.Packet) (source.Message, error) {
	qos := pk.FixedHeader.Qos
	if qos > 0 && pk.PacketID == 0 {
		return source.Message{}, mqttclient.Errorf("protocol", "a QoS %d PUBLISH with packet id 0", qos)
	}
	m := source.Message{Ack: token(qos, pk.PacketID)}
	rest, ok := strings.CutPrefix(pk.TopicName, c.head)
	offStr, topic, ok2 := strings.Cut(rest, "/")
	off, err := strconv.ParseUint(offStr, 10, 64)
	if !ok || !ok2 || err != nil || topic == "" {
		return m, mqttclient.Errorf("protocol", "replay delivery on %q, not %s<offset>/<topic>", pk.TopicName, c.head)
	}
	user := pk.Properties.User
	var client string
	if n := len(user); n > 0 && user[n-1].Key == replayClient {
		// After timestamp, where no record's own property can be.
		client, user = user[n-1].Val, user[:n-1]
	}
	n := len(user)
	if n < 3 || user[n-3].Key != replayStream || user[n-2].Key != replayOffset || user[n-1].Key != replayTimestamp || user[n-2].Val != offStr {
		return m, mqttclient.Errorf("protocol", "replay delivery of offset %d without the stream, offset and timestamp properties", off)
	}
	ts, err := strconv.ParseInt(user[n-1].Val, 10, 64)
	if err != nil {
		return m, mqttclient.Errorf("protocol", "replay delivery of offset %d: timestamp %q", off, user[n-1].Val)
	}
	user = user[:n-3]
	if off < c.next {
		return m, nil // read already: acknowledged, not stored again
	}
	c.next = off + 1
	p := &pk.Properties
	r := &logstore.Record{
		Offset:          off,
		Timestamp:       ts,
		Topic:           c.u.mapTopic(topic),
		Payload:         pk.Payload,
		QoS:             qos,
		Retain:          pk.FixedHeader.Retain,
		ClientID:        client,
		ContentType:     p.ContentType,
		ResponseTopic:   p.ResponseTopic,
		CorrelationData: p.CorrelationData,
	}
	if p.PayloadFormatFlag {
		f := p.PayloadFormat
		r.PayloadFormat = &f
	}
	if k := len(user) - 1; k >= 0 && user[k].Key == replayExpired && p.MessageExpiryInterval == 0 {
		// An expired record: its interval is when it expired less its time.
		if at, err := strconv.ParseInt(user[k].Val, 10, 64); err == nil && at > ts {
			r.MessageExpiry = uint32(min((at-ts)/1000, 1<<32-1))
			user = user[:k]
		}
	} else if left := p.MessageExpiryInterval; left > 0 {
		// What was left when it was sent, plus its age then: the
		// interval it was published with, to the second.
		age := max(time.Now().UnixMilli()-ts, 0)
		r.MessageExpiry = uint32(min(int64(left)+age/1000, 1<<32-1))
	}
	for _, u := range user {
		r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: u.Key, Value: u.Val})
	}
	m.Record = r
	return m, nil
}

// pingLoop sends a PINGREQ every half keepalive and fails the connection
// when nothing was read for a whole keepalive.
func (c *conn) pingLoop() {
	defer c.WG.Done()
	t := time.NewTicker(c.u.cfg.Keepalive / 2)
	defer t.Stop()
	ping := []byte{packets.Pingreq << 4, 0}
	for {
		select {
		case <-c.Ended():
			return
		case <-t.C:
		}
		if quiet := time.Since(time.Unix(0, c.lastRead.Load())); quiet > c.u.cfg.Keepalive {
			c.Fail(mqttclient.Errorf("timeout", "nothing from upstream for %v (keepalive)", quiet.Round(time.Millisecond)))
			return
		}
		if c.Write(ping) != nil {
			return
		}
	}
}
