package mqtt

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
)

// Login backoff: a password guesser is slowed down where it guesses, not
// everyone. Each failed login (Auth refused the credentials) counts
// against its source (an IPv4 address or IPv6 /64, as for pending
// connections) and against the user name it gave. A login waits, before
// Auth sees it, until both allow it:
//
//   - a source with n recent failures lets one login start every
//     Config.LoginBackoff x 2^(n-1) (at most Config.MaxLoginBackoff), one
//     after another: its logins queue, so parallel guesses from one host
//     run no faster than serial ones. A login that would wait longer than
//     MaxLoginBackoff is refused without asking Auth (MQTT 5: CONNACK 0x9F
//     connection rate exceeded; 3.1.1: 3, server unavailable) after
//     MaxLoginBackoff, so a queue never holds a connection longer than
//     that, and a guesser cannot turn refusals into a flood.
//   - a user name with n recent failures waits the same delay after its
//     latest failure, but logins do not queue behind each other: a guesser
//     delays the real user by at most MaxLoginBackoff. A successful login
//     clears its user name's failures (not its source's: a host with one
//     good account must not reset its guessing).
//
// Failures are forgotten after backoffForget without one. The state is
// in memory, at most backoffEntries sources and as many user names; when
// full, new keys are not tracked until old ones are forgotten.
//
// Logins from other sources and for other users never wait, and a source
// that guesses hashes at most one password per MaxLoginBackoff once it has
// failed a few times, so guessing cannot take the hashing capacity that
// other users' logins need either.

// backoffEntries bounds each of loginBackoff's maps.
const backoffEntries = 1 << 16

// backoffRule is the delay after n failures: base x 2^(n-1), at most max.
type backoffRule struct{ base, max time.Duration }

func (r backoffRule) delay(n int) time.Duration {
	if n <= 0 || r.base <= 0 {
		return 0
	}
	d := r.base
	for i := 1; i < n && d < r.max; i++ {
		d *= 2
	}
	return min(d, r.max)
}

// forget is how long failures are kept without a new one.
func (r backoffRule) forget() time.Duration { return max(time.Minute, 10*r.max) }

// failures are the recent failed logins of one source or user name.
type failures struct {
	n    int
	next time.Time // no login starts before
	last time.Time // the latest failure
}

// loginBackoff holds the failures of sources and user names. Its methods
// take the time, so tests drive it with their own clock.
type loginBackoff struct {
	rule backoffRule
	mu   struct {
		sync.Mutex
		srcs   map[netip.Prefix]*failures
		users  map[string]*failures
		sweeps int // failures since the last sweep
	}
}

func newLoginBackoff(base, maxDelay time.Duration) *loginBackoff {
	b := &loginBackoff{rule: backoffRule{base: base, max: maxDelay}}
	b.mu.srcs = map[netip.Prefix]*failures{}
	b.mu.users = map[string]*failures{}
	return b
}

// Which key made a login wait (the Backoff metric's label).
const (
	backoffBySource = "address"
	backoffByUser   = "user"
)

// admit is called as a login from src for user (may be "") arrives at
// now. It returns how long the login must wait before it is checked,
// which key made it wait, and false when it is refused at once.
func (b *loginBackoff) admit(src netip.Prefix, user string, now time.Time) (time.Duration, string, bool) {
	if b == nil || b.rule.base <= 0 {
		return 0, "", true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var wait time.Duration
	by := ""
	forget := b.rule.forget()
	if f := b.mu.srcs[src]; f != nil && now.Sub(f.last) <= forget {
		start := f.next
		if start.Before(now) {
			start = now
		}
		if w := start.Sub(now); w > b.rule.max {
			return 0, backoffBySource, false
		} else if w > 0 {
			wait, by = w, backoffBySource
		}
		f.next = start.Add(b.rule.delay(f.n)) // the next login queues behind this one
	}
	if f := b.mu.users[user]; user != "" && f != nil && now.Sub(f.last) <= forget {
		if w := f.next.Sub(now); w > wait {
			wait, by = w, backoffByUser
		}
	}
	return wait, by, true
}

// result records how the login from src for user ended at now.
func (b *loginBackoff) result(src netip.Prefix, user string, ok bool, now time.Time) {
	if b == nil || b.rule.base <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		delete(b.mu.users, user)
		return
	}
	forget := b.rule.forget()
	if f := failedIn(b.mu.srcs, src, now, forget); f != nil && f.next.Before(now.Add(b.rule.delay(f.n))) {
		f.next = now.Add(b.rule.delay(f.n))
	}
	if user != "" {
		if f := failedIn(b.mu.users, user, now, forget); f != nil {
			f.next = now.Add(b.rule.delay(f.n))
		}
	}
	if b.mu.sweeps++; b.mu.sweeps >= 1024 {
		b.mu.sweeps = 0
		sweep(b.mu.srcs, now.Add(-forget))
		sweep(b.mu.users, now.Add(-forget))
	}
}

// failedIn counts a failure of key in m at now, returning its entry; nil
// when m is full and key is new.
func failedIn[K comparable](m map[K]*failures, key K, now time.Time, forget time.Duration) *failures {
	f := m[key]
	if f != nil && now.Sub(f.last) > forget {
		f.n = 0
	}
	if f == nil {
		if len(m) >= backoffEntries {
			return nil
		}
		f = &failures{}
		m[key] = f
	}
	f.n++
	f.last = now
	return f
}

// sweep forgets the entries of m whose latest failure is before cutoff.
func sweep[K comparable](m map[K]*failures, cutoff time.Time) {
	for k, f := range m {
		if f.last.Before(cutoff) {
			delete(m, k)
		}
	}
}

// DeniedThrottled is the reason of Denied for a login refused by the
// backoff without being checked.
const DeniedThrottled = "throttled"

// waitLogin applies the backoff to a login of cl for user, before Auth
// checks it: it waits, and reports false when the login is refused
// without a check (counted and logged; cl's CONNACK says 0x9F).
func (h *authHook) waitLogin(cl *mochi.Client, cc *corkConn, user string) bool {
	wait, by, ok := h.backoff.admit(sourceKey(cl.Net.Remote), user, time.Now())
	if !ok {
		// The refusal waits the bound too: answered at once, a guesser
		// would just ask again, thousands of times a second. Waiting, it
		// holds one of its address's pending places (pending.go), so an
		// address has at most MaxPendingPerAddress logins in the broker.
		h.sleep(h.backoff.rule.max)
		cc.throttled.Store(true)
		h.m.Denied.WithLabelValues(DeniedThrottled).Inc()
		h.logs.denied(DeniedThrottled, cl.ID, cl.Net.Remote, slog.String(attrUser, user))
		return false
	}
	if wait <= 0 {
		return true
	}
	h.m.LoginBackoff.WithLabelValues(by).Inc()
	h.m.LoginBackoffSeconds.Add(wait.Seconds())
	h.sleep(wait)
	return true
}

// sleep waits d, or until the broker closes.
func (h *authHook) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.done:
	}
}

// loginDone records how Auth judged a login of cl for user.
func (h *authHook) loginDone(cl *mochi.Client, user string, ok bool) {
	h.backoff.result(sourceKey(cl.Net.Remote), user, ok, time.Now())
}
