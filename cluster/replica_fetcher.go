package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
)

// Replica fetch: the follower's side here, the leader's in
// replica_leader.go, the connections in replica_server.go.
//
// Kafka's rules, on logstore's replica seams (its store runs with
// ManualCommit). A Server answers, one goroutine per connection, for the
// streams this node leads; each has a Leader, created with the
// controller's leader epoch and ISR. A Fetcher on a follower:
//
//  1. asks the leader where the leader's log of its own latest epoch ends
//     (an EpochRequest) and truncates where rules.TruncateTo says, so no
//     record the leader lacks survives a leader change;
//  2. fetches "everything after my offset" (its log end), with the leader
//     epoch it believes in (older: FencedLeaderEpoch, it stops; newer:
//     the leader has not heard yet, it retries) and the watermark it last
//     heard; appends the leader's record values unchanged (AppendReplica
//     checks each checksum against its offset) and moves its watermark to
//     the leader's, capped at its own log end;
//  3. below the leader's log start it starts over there (ResetTo); above
//     its log end it truncates as in 1.
//
// The leader answers at once when it has records past the offset or a
// watermark above the one the follower heard, else holds the fetch up to
// MaxWait (the long poll: followers learn new records and the watermark
// without polling). Each fetch tells the leader the follower's log end,
// which its rules.Tracker keeps: the watermark, laggards and joiners are
// the rules package's (rules/doc.go, "The watermark and the ISR").
//
// A fetch unanswered a second past MaxWait, on a connection that has
// received nothing meanwhile, makes the follower dial the leader again
// and fetch on the new connection (fetch_silence.go): a connection that
// lived through a cut may stay idle for seconds after the heal, and the
// leader's watermark, and so every acks=all producer, waits for the
// follower's fetch.
//
// An acks=all acknowledgement waits for the slowest ISR member's fsync.
// Two things keep that to about one fsync rather than four in a row: the
// leader serves a group commit while it is still writing it (logstore's
// early shipping: the follower appends and fsyncs beside the leader; the
// watermark still counts only the leader's durable end, and a fetch's
// offset may be up to ShipEnd), and a watermark move is published without
// a write of its own on leader and follower alike (logstore persists it
// lazily). BenchmarkLog_AcksAll measures it (scripts/bench-results/
// cluster.md).
//
// The protocol (cluster/wire) is length-prefixed frames of msgpack arrays
// with typed error codes; its doc draws them. Fetchers take a Dialer, so
// tests run replication over cluster/faultnet, an in-process network that
// delays, cuts, partitions and drops links.

// Fetcher defaults.
const (
	DefaultFetchMaxWait = 500 * time.Millisecond
	fetchRetryMin       = 50 * time.Millisecond
	fetchRetryMax       = time.Second // a follower back from a cut tries again within a second
	// DefaultFetchTimeout: a leader answers a fetch within its long poll
	// and a read of at most 1 MiB; one silent 3 s longer is behind a
	// dead link (a pulled cable, a partition), and the follower dials
	// again, so that it is back in the ISR soon after a heal.
	DefaultFetchTimeout = 3 * time.Second
)

// Fetcher replicates one stream from its leader into the local replica
// (a store with logstore.Config.ManualCommit): on every connection it
// first truncates its log where the leader's log of its latest epoch ends
// (KIP-101/279), then fetches "everything after my offset", appends the
// leader's record values unchanged (AppendReplica) and moves its high
// watermark to the leader's, capped at its own log end.
type Fetcher struct {
	Self        string // this replica's id
	BrokerEpoch uint64 // this node's broker epoch
	Stream      *logstore.Stream
	LeaderAddr  string
	LeaderEpoch uint32 // the controller's leader epoch of the stream
	Dial        Dialer
	MaxWait     time.Duration // long poll; 0: DefaultFetchMaxWait
	MaxBytes    uint32        // per fetch; 0: the leader's default (1 MiB)
	// Timeout is how long past MaxWait a leader may stay silent before the
	// connection is given up and dialled again; 0: DefaultFetchTimeout.
	Timeout time.Duration
	Log     *slog.Logger

	// silentAfter replaces fetchSilentAfter in this package's tests.
	silentAfter time.Duration
	sw          silenceWatch
}

// ErrFenced wraps the leader's answer that this fetcher's view of the
// stream is stale (another leader or epoch): the caller looks at the
// controller's state again and starts a new fetcher.
var ErrFenced = errors.New("cluster: fetcher fenced")

// Run fetches until ctx ends (returning nil), the leader says the view is
// stale (ErrFenced, wrapping the wire code), or the local log refuses
// (its error). Connection failures are retried with backoff.
func (f *Fetcher) Run(ctx context.Context) error {
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	if f.MaxWait <= 0 {
		f.MaxWait = DefaultFetchMaxWait
	}
	if f.Timeout <= 0 {
		f.Timeout = DefaultFetchTimeout
	}
	f.sw = silenceWatch{maxWait: f.MaxWait, after: cmp.Or(f.silentAfter, fetchSilentAfter),
		dial: func(ctx context.Context) (net.Conn, error) { return f.Dial(ctx, f.LeaderAddr) }}
	defer f.sw.close()
	backoff := fetchRetryMin
	for ctx.Err() == nil {
		err := f.session(ctx)
		var code wire.Code
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &code) && (code == wire.NotLeader || code == wire.FencedLeaderEpoch):
			return fmt.Errorf("%w: %s from %s: %w", ErrFenced, f.Stream.Name(), f.LeaderAddr, code)
		case errors.As(err, &code) && !code.Retriable():
			return fmt.Errorf("cluster: fetch %s from %s: %w", f.Stream.Name(), f.LeaderAddr, code)
		case errors.Is(err, errLocal):
			return err
		case errors.Is(err, errSilent):
			f.Log.Info("cluster: the fetch connection went silent: going on on a new one", slog.String("stream", f.Stream.Name()))
			continue // on the connection that replaced it, connected just now
		}
		f.Log.Info("cluster: fetch session ended", slog.String("stream", f.Stream.Name()), slog.Any("err", err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, fetchRetryMax)
	}
	return nil
}

// errLocal marks failures of the local log, which a retry does not cure.
var errLocal = errors.New("cluster: local replica")

// session is one connection: the epoch handshake, then fetches.
func (f *Fetcher) session(ctx context.Context) error {
	conn, err := f.sw.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() }) // unblock a read when ctx ends
	defer stop()
	c := &fetchConn{conn: conn, wait: f.MaxWait + f.Timeout}
	if err := f.truncateToLeader(ctx, c); err != nil {
		return err
	}
	var hw uint64 // the leader's watermark as last heard: 0 makes the first fetch answer at once
	for {
		req := wire.FetchRequest{Stream: f.Stream.Name(), ReplicaID: f.Self, BrokerEpoch: f.BrokerEpoch,
			LeaderEpoch: f.LeaderEpoch, Offset: f.Stream.NextOffset(), HighWatermark: hw, MaxBytes: f.MaxBytes,
			MaxWaitMs: uint32(f.MaxWait / time.Millisecond)}
		var resp wire.FetchResponse
		if err := f.sw.roundTrip(ctx, c, wire.KindFetchRequest, req.AppendTo(nil), wire.KindFetchResponse, &resp); err != nil {
			return err
		}
		switch resp.Code {
		case wire.None:
		case wire.OffsetOutOfRange:
			if err := f.outOfRange(ctx, c, &resp); err != nil {
				return err
			}
			continue
		default:
			return resp.Code
		}
		if len(resp.Records) > 0 {
			if resp.Base != req.Offset {
				return fmt.Errorf("cluster: fetch from %d answered from %d", req.Offset, resp.Base)
			}
			if err := f.Stream.AppendReplica(ctx, resp.Base, resp.Records); err != nil {
				return fmt.Errorf("%w: %w", errLocal, err)
			}
		}
		hw = resp.HighWatermark
		if err := f.Stream.SetHighWatermark(ctx, min(hw, f.Stream.NextOffset())); err != nil {
			return fmt.Errorf("%w: %w", errLocal, err)
		}
	}
}

// truncateToLeader asks where the leader's log of this replica's latest
// epoch ends and truncates where rules.TruncateTo says, so that no
// record the leader does not have stays.
func (f *Fetcher) truncateToLeader(ctx context.Context, c *fetchConn) error {
	latest, _, ok := f.Stream.LatestEpoch()
	if !ok {
		return nil // no records: nothing to truncate
	}
	req := wire.EpochRequest{Stream: f.Stream.Name(), ReplicaID: f.Self, LeaderEpoch: f.LeaderEpoch, Epoch: latest}
	var resp wire.EpochResponse
	if err := c.roundTrip(wire.KindEpochRequest, req.AppendTo(nil), wire.KindEpochResponse, &resp); err != nil {
		return err
	}
	if resp.Code != wire.None {
		return resp.Code
	}
	_, own, haveOwn := f.Stream.EndOffsetForEpoch(resp.Epoch)
	end, cut := rules.TruncateTo(resp.EndOffset, own, haveOwn, f.Stream.NextOffset())
	if !cut {
		return nil
	}
	f.Log.Info("cluster: truncating to the leader's epoch end", slog.String("stream", f.Stream.Name()),
		slog.Uint64("epoch", uint64(resp.Epoch)), slog.Uint64("offset", end), slog.Uint64("log_end", f.Stream.NextOffset()))
	if err := f.Stream.Truncate(ctx, end); err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	return nil
}

// outOfRange handles a fetch offset the leader does not hold: below its
// log start (retention took it) the replica starts over there; above its
// log end the replica truncates to the leader's epoch end, then, if still
// above, to the leader's log end.
func (f *Fetcher) outOfRange(ctx context.Context, c *fetchConn, resp *wire.FetchResponse) error {
	next := f.Stream.NextOffset()
	var err error
	switch {
	case next < resp.LogStart:
		err = f.Stream.ResetTo(ctx, resp.LogStart)
	case next > resp.LogEnd:
		if err := f.truncateToLeader(ctx, c); err != nil {
			return err
		}
		if f.Stream.NextOffset() > resp.LogEnd {
			err = f.Stream.Truncate(ctx, resp.LogEnd)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errLocal, err)
	}
	return nil
}

// fetchConn is one connection to the leader, one request at a time.
type fetchConn struct {
	conn net.Conn
	wait time.Duration
	buf  []byte
	got  atomic.Uint64 // bytes read: an answer on its way is not silence
}

// Read reads from the connection, counting what came.
func (c *fetchConn) Read(p []byte) (int, error) {
	n, err := c.conn.Read(p)
	c.got.Add(uint64(n))
	return n, err
}

type decoder interface{ Decode([]byte) error }

func (c *fetchConn) roundTrip(kind byte, body []byte, want byte, resp decoder) error {
	// A leader that neither answers nor closes within the long poll and
	// Timeout is given up on.
	if err := c.conn.SetDeadline(time.Now().Add(c.wait)); err != nil {
		return err
	}
	if err := wire.WriteFrame(c.conn, kind, body); err != nil {
		return err
	}
	got, b, err := wire.ReadFrame(c, c.buf)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("cluster: frame kind %d, want %d", got, want)
	}
	// Records are sub-slices of b: keep b only until they are appended,
	// which happens before the next round trip reuses it.
	c.buf = b[:0]
	return resp.Decode(b)
}
