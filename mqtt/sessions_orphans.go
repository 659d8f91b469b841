package mqtt

import (
	"log/slog"
	"sync"
	"time"
)

// Orphaned sessions in a site.
//
// A session's expiry is run by the broker holding its claim: mochi
// expires the disconnected client there, or the broker the client comes
// back to finds it expired (sessions_site.go). A broker that dies, or
// restarts (it does not load sessions at start), leaves its sessions to
// no one: those whose client was connected were stored with
// Disconnected 0, and a client that never comes back would leave its
// session in the site's state for good.
//
// So the site offers the sessions whose holder it saw fail, leave or
// restart, and those no broker holds, to one broker
// (SiteSessions.OnSessionsOrphaned; in Peat the leader of the sessions'
// stream), which adopts each one
// (AdoptSession): the claim moves to it, under the claims' rules, so a
// broker that comes back in the same epoch drops the session and its
// late writes as after any take-over. The adopter reads the session and
// its offsets and holds it as a disconnected session of its own, outside
// mochi (mochi's clock would start at the adoption):
//
//   - A session stored while connected counts as disconnected from its
//     adoption, soon after the site saw its broker go (one claim, a
//     round trip to the ISR, per session, one session after another);
//     the time is written, so an adopter that dies in turn hands the
//     same clock on. A session disconnected before keeps its time.
//   - Each second (mochi's expiry tick) an adopted session whose expiry
//     ran out, by mochi's rule (expired), is deleted site-wide, offsets
//     included, and its claim released: no client has to connect.
//   - A client that connects, here or on any broker, claims and resumes
//     it as any stored session.
//
// A claim adopted while a connection of the same client claims it here
// is left to that connection. peat_mqtt_sessions_adopted_total counts the
// adoptions, peat_mqtt_sessions_expired_total every expiry a broker runs
// (mochi's, at connect, and these).

// orphanSweepInterval is how often adopted sessions are looked at for
// expiry: mochi's expiry tick ($SYS interval, a second by default).
const orphanSweepInterval = time.Second

// orphanQueue holds the client ids the site offered for adoption until
// runOrphans gets to them.
type orphanQueue struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	kick chan struct{} // cap 1
}

// startOrphans starts runOrphans and has the site offer orphaned
// sessions to it.
func (d *delivery) startOrphans() {
	d.orphans.ids = map[string]struct{}{}
	d.orphans.kick = make(chan struct{}, 1)
	d.wg.Add(1)
	go d.runOrphans()
	d.sessions.site.OnSessionsOrphaned(d.sessionsOrphaned)
}

// sessionsOrphaned is SiteSessions.OnSessionsOrphaned.
func (d *delivery) sessionsOrphaned(ids []string) {
	d.orphans.mu.Lock()
	for _, id := range ids {
		d.orphans.ids[id] = struct{}{}
	}
	d.orphans.mu.Unlock()
	poke(d.orphans.kick)
}

// runOrphans adopts the sessions offered and expires the adopted ones,
// until delivery closes.
func (d *delivery) runOrphans() {
	defer d.wg.Done()
	t := time.NewTicker(orphanSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.orphans.kick:
		case <-t.C:
		}
		d.orphans.mu.Lock()
		ids := d.orphans.ids
		d.orphans.ids = map[string]struct{}{}
		d.orphans.mu.Unlock()
		adopted := 0
		for id := range ids {
			if d.ctx.Err() != nil {
				return
			}
			if d.adopt(id) {
				adopted++
			}
		}
		if adopted > 0 {
			d.m.SessionsAdopted.Add(float64(adopted))
			d.logger.Info("durable sessions adopted from brokers that are gone", slog.Int("sessions", adopted))
		}
		d.sweepOrphans()
	}
}

// adopt takes over client id's orphaned session; true when this broker
// now runs its expiry.
func (d *delivery) adopt(id string) bool {
	ss := d.sessions
	ss.mu.Lock()
	if _, busy := ss.claimed[id]; busy || ss.m[id] != nil {
		ss.mu.Unlock()
		return false // a connection of the client here holds it, or is claiming it
	}
	ss.attempt++
	attempt := ss.attempt
	ss.claimed[id] = attempt
	ss.mu.Unlock()
	if !ss.site.AdoptSession(d.ctx, id) {
		ss.mu.Lock()
		if ss.claimed[id] == attempt && ss.m[id] == nil {
			delete(ss.claimed, id)
		}
		ss.mu.Unlock()
		return false
	}
	s, found, err := loadSiteSession(ss.site.SessionState(), id)
	if err == nil && found {
		s.cursors, s.written, err = d.loadSiteCursors(id)
	}
	if err != nil { // this broker's replica is unreadable: the client's next connect decides
		d.logger.Warn("durable session: reading an orphaned session failed", slog.String(attrClient, id), attrErr, err)
		return false
	}
	ss.mu.Lock()
	if ss.claimed[id] != attempt || ss.m[id] != nil {
		// A connection of the client claimed it meanwhile, here (it has
		// it) or on another broker (sessionTaken let it go).
		ss.mu.Unlock()
		return false
	}
	if !found { // a claim left behind by a session that ended
		delete(ss.claimed, id)
		ss.mu.Unlock()
		ss.site.ReleaseSession(id)
		return false
	}
	if s.OwnerOnly { // a connection's session that ended with its broker
		ss.mu.Unlock()
		ss.saveMeta(id, true) // not in ss.m: deleted
		ss.releaseAfterWrite(id)
		return false
	}
	s.orphan = true
	since := s.Disconnected == 0
	if since {
		s.Disconnected = time.Now().Unix()
	}
	ss.m[id] = s
	ss.mu.Unlock()
	d.logger.Debug("durable session: adopted from a broker that is gone", slog.String(attrClient, id),
		slog.Time("disconnected", time.Unix(s.Disconnected, 0)))
	if since {
		ss.saveMeta(id, true) // the clock survives this broker
	}
	return true
}

// sweepOrphans deletes the adopted sessions whose expiry ran out.
func (d *delivery) sweepOrphans() {
	ss := d.sessions
	type ended struct {
		id string
		cs []cursorKey
	}
	var gone []ended
	ss.mu.Lock()
	for id, s := range ss.m {
		if s.orphan && s.conn == nil && d.expired(s) {
			delete(ss.m, id)
			gone = append(gone, ended{id, s.cursorList()})
		}
	}
	ss.mu.Unlock()
	d.m.SessionsExpired.Add(float64(len(gone)))
	for _, e := range gone {
		d.logger.Debug("durable session: expired", slog.String(attrClient, e.id))
		ss.saveMeta(e.id, true)
		ss.saveCursors(e.id, true, e.cs...)
		ss.releaseAfterWrite(e.id)
	}
}
