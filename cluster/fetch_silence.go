package cluster

import (
	"context"
	"errors"
	"net"
	"time"
)

// A long poll to a leader that goes silent (replica fetch, state fetch).
//
// A connection that lived through a cut may stay idle for seconds after
// the heal, until TCP's next retransmission, while a new connection
// would connect at once; and what waits for a follower's fetch (the
// leader's watermark, an answered state write) waits for it too. So a
// request unanswered fetchSilentAfter past its long poll, on a
// connection that has received nothing meanwhile, makes the follower dial
// the leader again, a try at a time; once a new connection connects the
// silent one is given up and the request made again on the new one
// (fetches are idempotent). The allowance doubles per connection given
// up since a request was answered within it, so a leader that is only
// slow is given up on once or twice, then waited for.

// fetchSilentAfter is the silence allowed past a long poll before the
// follower dials again (doubled per connection given up since a request
// was answered within it).
const fetchSilentAfter = time.Second

// silenceWatch watches one follower's long polls to one leader.
type silenceWatch struct {
	maxWait time.Duration // the long poll: how long the leader may hold a request
	after   time.Duration // the silence allowed past maxWait: fetchSilentAfter, or a test's
	dial    func(ctx context.Context) (net.Conn, error)
	silent  int      // connections given up since a request was answered within maxWait+after
	spare   net.Conn // the connection that replaced a silent one, for the next session
}

// errSilent ends a session whose connection went silent while a new one
// connected (taken by the next session's conn).
var errSilent = errors.New("cluster: the fetch connection went silent")

// conn is the connection for a new session: the one that replaced a
// silent connection, if any, else a new one.
func (w *silenceWatch) conn(ctx context.Context) (net.Conn, error) {
	if c := w.spare; c != nil {
		w.spare = nil
		return c, nil
	}
	return w.dial(ctx)
}

// close closes a connection no session took.
func (w *silenceWatch) close() {
	if w.spare != nil {
		w.spare.Close()
		w.spare = nil
	}
}

// roundTrip is c.roundTrip, watched: unanswered past maxWait and the
// silence allowed, it dials the leader; once a new connection connects,
// c is given up and roundTrip returns errSilent, the new connection kept
// for conn.
func (w *silenceWatch) roundTrip(ctx context.Context, c *fetchConn, kind byte, body []byte, want byte, resp decoder) error {
	base := w.maxWait + w.after
	after := w.maxWait + w.after<<min(w.silent, 4)
	if after >= c.wait {
		return c.roundTrip(kind, body, want, resp)
	}
	start, got := time.Now(), c.got.Load()
	done := make(chan struct{})
	spare := make(chan net.Conn, 1)
	watched := make(chan struct{})
	// A timer, not a goroutine, per request: most are answered in time.
	t := time.AfterFunc(after, func() {
		defer close(watched)
		w.watch(ctx, c, got, done, spare)
	})
	err := c.roundTrip(kind, body, want, resp)
	close(done)
	if !t.Stop() {
		<-watched // it began: wait until it has given c up or stopped
	}
	select {
	case w.spare = <-spare:
		w.silent++
		return errSilent // its answer, if it came meanwhile, is asked for again
	default:
	}
	if err == nil && time.Since(start) < base {
		w.silent = 0
	}
	return err
}

// watch dials the leader, each try bounded by cutOffProbeWait, until
// one connects: it closes c, which ends the round trip waiting on it,
// and passes the new connection on spare. It stops once done is closed,
// or bytes came on c since it had read got (an answer on its way over a
// slow link is not silence).
func (w *silenceWatch) watch(ctx context.Context, c *fetchConn, got uint64, done <-chan struct{}, spare chan<- net.Conn) {
	for {
		select {
		case <-done:
			return
		default:
		}
		if c.got.Load() != got || ctx.Err() != nil {
			return
		}
		try := time.Now().Add(cutOffProbeWait)
		dctx, cancel := context.WithDeadline(ctx, try)
		go func() {
			select {
			case <-done:
				cancel()
			case <-dctx.Done():
			}
		}()
		nc, err := w.dial(dctx)
		cancel()
		if err == nil {
			select {
			case <-done:
				nc.Close() // answered meanwhile
			default:
				if c.got.Load() != got {
					nc.Close() // an answer began to come meanwhile
					return
				}
				spare <- nc
				c.conn.Close()
			}
			return
		}
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Until(try)):
		}
	}
}
