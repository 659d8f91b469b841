package mqtt

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/vmihailenco/msgpack/v5"
)

// Durable sessions in a site (a Log that is SiteSessions).
//
// A session's properties and subscriptions are the site's
// (SiteSessions.SessionState), its offsets its streams' state, which the
// site replicates too: a client may resume on any broker. A broker does
// not load sessions at start; it reads a client's session when the
// client connects (its copy from start would be stale once the client
// used another broker), in OnSessionEstablish, after authentication and
// before mochi looks for the session to hand over:
//
//  1. A connection that has or may keep a session (Clean Start 0, a
//     Session Expiry Interval above 0 or v3 clean session false, or a
//     stored session that Clean Start 1 is to end) claims the client id
//     (SiteSessions.ClaimSession). The broker that held it is told and
//     closes its connection of that client (DISCONNECT 0x8E, session
//     taken over, for MQTT 5) and forgets the session: MQTT's one
//     connection per client id, site-wide. A connection whose claim the
//     site cannot decide (no leader reachable) is refused with CONNACK
//     0x88 (v3: 3, server unavailable), unless this broker holds the
//     claim already for a live connection of the client.
//  2. Unless the client is connected to this broker, or was last and
//     this broker has held the claim since (mochi then takes that
//     session over, as on a single broker), whatever this broker had of
//     the session goes and the stored one is read:
//     its properties and subscriptions from SessionState, its offsets
//     from this broker's replica of each stream's state. It is handed
//     to mochi as a disconnected client, which mochi's takeover then
//     gives to the new connection: session present, subscriptions
//     active, and delivery resumes from the offsets. A session whose
//     expiry has run out since its last disconnect is deleted instead.
//  3. Only the broker holding a session's claim writes it: a late write
//     of the broker that lost it (its connection's end, an
//     acknowledgement) is dropped when it comes to be written, and an
//     ended session's deletion goes before its claim is released. One
//     already on its way when the claim moved is dropped by the site
//     (Peat's sessions' leader refuses it: SiteSessionKey).
//  4. A session whose holder died, left or restarted, or that no broker
//     holds, is adopted by one broker, which runs its expiry
//     (sessions_orphans.go).
//  5. A session that ends with its connection (Clean Start 0, expiry 0,
//     resuming a stored one) holds the claim while it lasts but is not
//     kept: with Auth, its record names only its owner (OwnerOnly), so
//     that step 1 on another broker does not let another identity take
//     the claim from the owner's live connection (tenancy.go).
//
// Clean sessions without expiry that find nothing stored claim nothing
// (a sensor that only publishes costs no replicated write per connect),
// so two such connections of one client id on two brokers both stay.

// SiteSessionKey is where client id's session is in
// SiteSessions.SessionState, and SiteSessionClient the client a key
// there belongs to (false: no session's): a site that fences each
// session's writes by its claim maps keys to claims with them.
func SiteSessionKey(id string) string { return sessionStatePrefix + id }

// SiteSessionClient is SiteSessionKey's inverse.
func SiteSessionClient(key string) (id string, ok bool) {
	return strings.CutPrefix(key, sessionStatePrefix)
}

// SessionOffsetClient is the client whose session offset key is in a
// stream's own state (false: no session's, a group's for one): a site
// fences those writes by the session's claim too.
func SessionOffsetClient(key string) (id string, ok bool) {
	if id, _, ok = cursorOf("", key); ok {
		return id, ok
	}
	id, _, ok = markOf("", key) // a resend mark goes with its offset
	return id, ok
}

// siteEstablish readies cl's session on a broker of a site before mochi
// hands the session over; false refuses the connection.
func (d *delivery) siteEstablish(cl *mochi.Client) bool {
	ss := d.sessions
	id := cl.ID
	_, found, err := loadSiteSession(ss.site.SessionState(), id) // whether to claim; read again under the claim
	if err != nil {
		d.logger.Warn("durable session: read failed", slog.String(attrClient, id), attrErr, err)
		return false
	}
	ss.mu.Lock()
	_, holds := ss.claimed[id]
	ss.mu.Unlock()
	if !found && !holds && cl.Properties.Clean && !persistent(cl) {
		return true
	}
	live := false
	if old, ok := d.srv.Clients.Get(id); ok && !old.Closed() {
		live = true
	}
	ss.mu.Lock()
	ss.attempt++
	attempt := ss.attempt
	ss.claimed[id] = attempt // from now on no earlier release of id goes out
	ss.mu.Unlock()
	if !ss.site.ClaimSession(id) {
		if live && holds {
			return true // this broker holds it for a live connection: mochi takes it over
		}
		ss.mu.Lock()
		if ss.claimed[id] == attempt && ss.m[id] == nil {
			delete(ss.claimed, id)
		}
		ss.mu.Unlock()
		return false
	}
	if live {
		return true
	}
	ss.mu.Lock()
	_, mine := ss.m[id]
	ss.mu.Unlock()
	if _, ok := d.srv.Clients.Get(id); ok && holds && mine {
		// Held here since its last connection: this broker's copy is the
		// newest (acknowledgements not written yet included).
		return true
	}
	d.forgetLocal(id)
	// Read again under the claim: what the site wrote of the session
	// before it (another broker's Clean Start, a disconnect) is in this
	// broker's replica now, and may not have been at the first read.
	stored, found, err := loadSiteSession(ss.site.SessionState(), id)
	if err != nil {
		d.logger.Warn("durable session: read failed", slog.String(attrClient, id), attrErr, err)
		return false
	}
	if found && stored.OwnerOnly {
		// The owner of a connection that ended with its session, the
		// one this claim just closed: nothing to resume, and this
		// broker, holding the claim now, deletes the record.
		ss.saveMeta(id, true)
		found = false
	}
	if !found {
		return true
	}
	s := stored
	s.cursors, s.written, err = d.loadSiteCursors(id)
	if err != nil {
		d.logger.Warn("durable session: read offsets failed", slog.String(attrClient, id), attrErr, err)
		return false
	}
	if cl.Properties.Clean {
		return d.endSiteSession(id, s)
	}
	ss.mu.Lock()
	ss.m[id] = s
	ss.mu.Unlock()
	if d.expired(s) {
		d.m.SessionsExpired.Inc()
		ss.drop(id) // deleted site-wide; the client starts a new session
		return true
	}
	d.restoreClient(id, s)
	return true
}

// endSiteSession deletes the stored session s of client id, which holds
// the claim, for a connection with Clean Start 1, and returns once the
// site holds the deletion: queued, it could still be waiting when the
// client's next connection, on another broker, takes the claim, and a
// broker that lost the claim drops its writes, so the session would come
// back. False (not written within siteWriteWait) refuses the
// connection.
func (d *delivery) endSiteSession(id string, s *session) bool {
	ss := d.sessions
	done := make(chan error, 1)
	ss.saveMetaDone(id, func(err error) { done <- err }) // no session in ss.m: a deletion
	ss.saveCursors(id, true, s.cursorList()...)
	select {
	case err := <-done:
		if err != nil {
			d.logger.Warn("durable session: ending it failed", slog.String(attrClient, id), attrErr, err)
			return false
		}
		return true
	case <-time.After(siteWriteWait):
		d.logger.Warn("durable session: ending it took too long", slog.String(attrClient, id))
		return false
	}
}

// loadSiteSession reads client id's stored session.
func loadSiteSession(st StateStore, id string) (s *session, found bool, err error) {
	key := SiteSessionKey(id)
	err = st.LoadState(key, func(k string, v []byte) error {
		if k != key {
			return nil
		}
		s = &session{}
		if err := msgpack.Unmarshal(v, s); err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		if s.Subs == nil {
			s.Subs = map[string]sessionSub{}
		}
		found = true
		return nil
	})
	return s, found, err
}

// loadSiteCursors reads client id's offsets, and the resend marks that go
// with them (resend.go), from this broker's replica of each stream's state.
func (d *delivery) loadSiteCursors(id string) (cursors, marks map[cursorKey]uint64, err error) {
	cursors, marks = map[cursorKey]uint64{}, map[cursorKey]uint64{}
	for _, s := range d.log.Streams() {
		for _, prefix := range []string{cursorStatePrefix + id, tapCursorStatePrefix + id + "\x00"} {
			for _, kind := range []struct {
				prefix string
				parse  func(stream, key string) (string, cursorKey, bool)
				into   map[cursorKey]uint64
			}{{"", cursorOf, cursors}, {markStatePrefix, markOf, marks}} {
				err := s.LoadState(kind.prefix+prefix, func(k string, v []byte) error {
					got, c, ok := kind.parse(s.Name(), k)
					if ok && got == id && len(v) == 8 {
						kind.into[c] = binary.BigEndian.Uint64(v)
					}
					return nil
				})
				if err != nil {
					return nil, nil, fmt.Errorf("stream %s: %w", s.Name(), err)
				}
			}
		}
	}
	return cursors, marks, nil
}

// expired reports whether s, disconnected, has outlived its expiry, by
// mochi's rule (a v5 client's Session Expiry Interval, else the server's
// maximum; 0xFFFFFFFF seconds, also a v3 session's under mochi's
// default maximum, is 136 years: never).
func (d *delivery) expired(s *session) bool {
	if s.Disconnected == 0 {
		// Connected when its broker went, and not adopted yet
		// (sessions_orphans.go): its clock has not started.
		return false
	}
	expire := int64(d.srv.Options.Capabilities.MaximumSessionExpiryInterval)
	if s.ProtocolVersion == 5 && s.ExpiryFlag {
		expire = int64(s.Expiry)
	}
	return s.Disconnected+expire < time.Now().Unix()
}

// forgetLocal drops what this broker had of client id's session (not
// connected here): mochi's client with its subscriptions and this
// broker's copy, which another broker may have changed since.
func (d *delivery) forgetLocal(id string) {
	if old, ok := d.srv.Clients.Get(id); ok {
		d.srv.UnsubscribeClient(old)
		old.ClearInflights()
		d.srv.Clients.Delete(id)
	}
	d.sessions.mu.Lock()
	delete(d.sessions.m, id)
	d.sessions.mu.Unlock()
}

// restoreClient gives mochi session s of client id as a disconnected
// client with its subscriptions, as mochi's own storage loading does at
// start, for the connecting client to take over.
func (d *delivery) restoreClient(id string, s *session) {
	cl := d.srv.NewClient(nil, s.Listener, id, false)
	cl.Properties.Username = []byte(s.Username)
	cl.Properties.Clean = s.Clean
	cl.Properties.ProtocolVersion = s.ProtocolVersion
	cl.Properties.Props = packets.Properties{
		SessionExpiryInterval:     s.Expiry,
		SessionExpiryIntervalFlag: s.ExpiryFlag,
		ReceiveMaximum:            s.ReceiveMaximum,
	}
	cl.Stop(packets.ErrServerShuttingDown)
	d.srv.Clients.Add(cl)
	for _, sub := range s.Subs {
		sb := packets.Subscription{
			Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
			RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling,
			Identifier: sub.Identifier,
		}
		d.srv.Topics.Subscribe(id, sb)
		cl.State.Subscriptions.Add(sub.Filter, sb)
		d.parent.track(id, sub.Filter)
	}
}

// refuseConnect answers a connection whose session the site cannot
// decide now (CONNACK server unavailable) and closes it.
func (d *delivery) refuseConnect(cl *mochi.Client) {
	_ = d.srv.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
	cl.Stop(packets.ErrServerUnavailable)
}

// sessionTaken is SiteSessions.OnSessionTaken: another broker claimed the
// session of client id. This broker forgets it (its late writes are
// dropped) and closes its connection of the client, if any.
func (d *delivery) sessionTaken(id string) {
	ss := d.sessions
	ss.mu.Lock()
	delete(ss.claimed, id)
	delete(ss.m, id)
	ss.mu.Unlock()
	cl, ok := d.srv.Clients.Get(id)
	if !ok {
		return
	}
	d.srv.UnsubscribeClient(cl)
	d.srv.Clients.Delete(id)
	if cl.Closed() {
		cl.ClearInflights()
		return
	}
	// Writing the DISCONNECT may wait for a client that does not read:
	// not on the caller's goroutine (the site's state replication).
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		cl.Stop(packets.ErrSessionTakenOver)
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		_ = d.srv.DisconnectClient(cl, packets.ErrSessionTakenOver)
		cl.ClearInflights()
	}()
}
