package cluster

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
)

// Consumer-state replication, the follower's side (log_state_leader.go).
const (
	// stateFetchWait is a follower's long poll for state changes.
	stateFetchWait = 500 * time.Millisecond
	stateRetry     = 200 * time.Millisecond
)

// followState is a follower's side: while another node leads the
// stream, one goroutine fetches the leader's consumer state into this
// replica's store; it is replaced when the leader or its epoch changes
// and ended while this node leads (ld non-nil).
type followState struct {
	s      *stream       // whose state it fetches
	stop   chan struct{} // closed by end
	cancel context.CancelFunc
	done   chan struct{}
	leader string
	epoch  uint32
	addr   string
	// The version held, (epoch, seq) of the leadership that sent it;
	// only the goroutine touches them while it runs.
	haveEpoch uint32
	haveSeq   uint64
}

// follow runs the fetching goroutine while another node leads the
// stream (ld, this node's Leader, nil): started, or replaced when the
// leader, its epoch or address changed or it ended, else left running.
func (fs *followState) follow(ld *Leader) {
	leader, epoch, addr := fs.s.stateLeader()
	want := ld == nil && leader != "" && leader != fs.s.l.node.ID() && addr != ""
	if fs.cancel != nil && (!want || fs.leader != leader || fs.epoch != epoch || fs.addr != addr || fs.ended()) {
		fs.cancel()
		<-fs.done
		fs.cancel = nil
	}
	if !want || fs.cancel != nil {
		return
	}
	select {
	case <-fs.stop:
		return
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	fs.cancel, fs.done, fs.leader, fs.epoch, fs.addr = cancel, make(chan struct{}), leader, epoch, addr
	go fs.fetch(ctx, leader, epoch, addr)
}

// fetch is the goroutine: sessions with the leader until ctx ends, or
// until the leader fences it (run then starts another).
func (fs *followState) fetch(ctx context.Context, leader string, epoch uint32, addr string) {
	defer close(fs.done)
	defer fs.s.wake() // run looks again (a fenced fetch ends this one)
	sw := &silenceWatch{maxWait: stateFetchWait, after: fetchSilentAfter,
		dial: func(ctx context.Context) (net.Conn, error) { return fs.s.l.node.dialer()(ctx, addr) }}
	defer sw.close()
	for ctx.Err() == nil {
		err := fs.session(ctx, sw, epoch)
		var code wire.Code
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSilent) {
			fs.s.l.log.Info("cluster: the state fetch connection went silent: going on on a new one", slog.String("stream", fs.s.name))
			continue // on the connection that replaced it
		}
		if errors.As(err, &code) && (code == wire.FencedLeaderEpoch || code == wire.NotLeader) {
			select { // the state moves on; run starts another after a pause
			case <-ctx.Done():
			case <-time.After(stateRetry):
			}
			return
		}
		if err != nil {
			fs.s.l.log.Debug("cluster: state fetch", slog.String("stream", fs.s.name), slog.String("leader", leader), slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(stateRetry):
		}
	}
}

// session is one connection to the leader, fetching state changes; one
// that goes silent is replaced as a replica fetch's is
// (fetch_silence.go): every answer to a state write waits for this
// follower's next fetch.
func (fs *followState) session(ctx context.Context, sw *silenceWatch, epoch uint32) error {
	conn, err := sw.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c := &fetchConn{conn: conn, wait: stateFetchWait + cmp.Or(fs.s.l.cfg.stateFetchTimeout, DefaultFetchTimeout)}
	for {
		req := wire.StateFetchRequest{Stream: fs.s.name, ReplicaID: fs.s.l.node.ID(), LeaderEpoch: epoch,
			Epoch: fs.haveEpoch, Seq: fs.haveSeq, MaxWaitMs: uint32(stateFetchWait / time.Millisecond)}
		var resp wire.StateFetchResponse
		if err := sw.roundTrip(ctx, c, wire.KindStateFetchRequest, req.AppendTo(nil), wire.KindStateFetchResponse, &resp); err != nil {
			return err
		}
		if resp.Code != wire.None {
			return resp.Code
		}
		if err := fs.apply(&resp); err != nil {
			return err
		}
		fs.haveEpoch, fs.haveSeq = resp.Epoch, resp.Seq
	}
}

// apply writes a leader's answer into this replica's store: the
// changes, or, on Reset, the whole state (keys the leader lacks go), in
// writes of at most MaxStateWrite entries.
func (fs *followState) apply(resp *wire.StateFetchResponse) error {
	puts := map[string][]byte{}
	for _, kv := range resp.Puts {
		puts[kv.Key] = kv.Val
	}
	dels := resp.Dels
	if resp.Reset {
		dels = nil
		err := fs.s.st.LoadState("", func(k string, v []byte) error {
			if _, keep := puts[k]; !keep {
				dels = append(dels, k)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	keys, gone := slices.Sorted(maps.Keys(puts)), dels
	for len(keys) > 0 || len(dels) > 0 {
		p := map[string][]byte{}
		for len(keys) > 0 && len(p) < logstore.MaxStateWrite {
			p[keys[0]] = puts[keys[0]]
			keys = keys[1:]
		}
		n := min(len(dels), logstore.MaxStateWrite-len(p))
		if err := fs.s.st.WriteState(p, dels[:n]); err != nil {
			return err
		}
		dels = dels[n:]
	}
	fs.s.claims.moved(puts, gone)
	return nil
}

func (fs *followState) ended() bool {
	select {
	case <-fs.done:
		return true
	default:
		return false
	}
}

// end stops the follower goroutine for good (the stream's run ends).
func (fs *followState) end() {
	close(fs.stop)
	if fs.cancel != nil {
		fs.cancel()
		<-fs.done
	}
}
