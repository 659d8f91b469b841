package mqtt

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/vmihailenco/msgpack/v5"
)

// Durable sessions.
//
// A client with a persistent session (MQTT 3 clean session false, MQTT 5
// session expiry above 0) is backed by a cursor per stream, not by an
// in-memory queue: Peat keeps, per stream, the offset below which every
// record was acknowledged by the client or not for it (its progress), and
// when the client comes back, after a disconnect or a broker restart, it
// reads each stream from there. What it missed is bounded by retention,
// not by memory or by mochi's inflight limit.
//
// The session (client properties, subscriptions) is kept in the log's
// StateStore under "s/<client id>", msgpack-encoded, and given to mochi at
// start through the storage hooks StoredClients and StoredSubscriptions, so
// the client finds its session present after a restart (in a site, the
// site keeps it and a broker reads it at connect: sessions_site.go). Its offsets
// (cursors) belong to the streams they point into and are kept in each
// stream's own state: "s/<client id>" for the client's plain
// subscriptions, "t/<client id>\x00<filter>" for each of its $replay
// subscriptions (MQTT strings hold no U+0000). Offsets follow
// acknowledgements in memory at once and reach the store within the state
// writer's interval, and at once when the client disconnects: a broker
// killed with kill -9 delivers again at most that interval's worth of
// acknowledged messages (at least once, never lost).
//
// Shared subscriptions ($share) are not resumed from the log: their
// records go to whichever member is connected. A session that expires
// releases its cursor and its subscriptions.
//
// Which session a connection gets, and how long it lasts, follow MQTT 5
// 3.1.2.4 and 3.1.2.11.2: Clean Start 1 (clean session, v3) ends the stored
// session and starts a new one; Clean Start 0 resumes the stored session
// whatever this connection's Session Expiry Interval says (paho's Python
// client reconnects with none). The expiry only decides what happens when
// this connection ends: 0 or absent (v3: clean session) ends the session
// then, and such a session is not kept in the store meanwhile (a crash ends
// the connection too); above 0 keeps it. A v5 DISCONNECT may lower it to 0.

// sessionStatePrefix starts every durable session's state key.
const sessionStatePrefix = "s/"

// cursorKey names one of a session's offsets: in stream, for the client's
// plain subscriptions when tap is "", else for its $replay subscription
// with filter tap.
type cursorKey struct{ stream, tap string }

// Cursor keys in a stream's state.
const (
	cursorStatePrefix    = "s/"
	tapCursorStatePrefix = "t/"
)

// ref is where the client id's offset for c is stored.
func (c cursorKey) ref(id string) stateRef {
	if c.tap == "" {
		return stateRef{stream: c.stream, key: cursorStatePrefix + id}
	}
	return stateRef{stream: c.stream, key: tapCursorStatePrefix + id + "\x00" + c.tap}
}

// cursorOf parses a key of stream's state; ok is false for other keys.
func cursorOf(stream, key string) (id string, c cursorKey, ok bool) {
	if id, ok := strings.CutPrefix(key, cursorStatePrefix); ok && id != "" {
		return id, cursorKey{stream: stream}, true
	}
	if rest, ok := strings.CutPrefix(key, tapCursorStatePrefix); ok {
		id, filter, ok := strings.Cut(rest, "\x00")
		return id, cursorKey{stream: stream, tap: filter}, ok && id != "" && filter != ""
	}
	return "", cursorKey{}, false
}

// sessionSub is a stored subscription.
type sessionSub struct {
	Filter            string `msgpack:"f"`
	Qos               byte   `msgpack:"q"`
	NoLocal           bool   `msgpack:"nl,omitempty"`
	RetainAsPublished bool   `msgpack:"rap,omitempty"`
	RetainHandling    byte   `msgpack:"rh,omitempty"`
	Identifier        int    `msgpack:"id,omitempty"`
	// Clients: a $replay or $group subscription that asked for each
	// record's publisher (user property client: true); its tap asks
	// again when the session resumes.
	Clients bool `msgpack:"cl,omitempty"`
}

// session is one durable session.
type session struct {
	ProtocolVersion byte `msgpack:"v"`
	// Username is a string, not mochi's []byte: msgpack allocates a bin
	// field's declared length before reading it (4 GiB for a damaged or
	// forged bin32 in the store or from a peer), a string only as its
	// bytes arrive. Either form decodes into either type.
	Username string `msgpack:"u,omitempty"`
	// Owner is the identity that made the session (Tenancy.Identity):
	// no other may connect with its client id. "" for a session stored
	// without Auth or by an older Peat: the next identity adopts it.
	Owner string `msgpack:"ow,omitempty"`
	// OwnerOnly marks, in a site, the record of a connection whose
	// session ends with it (transient): it names only its Owner, so that
	// a broker another identity connects to with the client id refuses
	// it rather than take the claim from the owner's connection. It is
	// never resumed; the next holder of the claim deletes it.
	OwnerOnly      bool                  `msgpack:"oo,omitempty"`
	Listener       string                `msgpack:"l,omitempty"`
	Clean          bool                  `msgpack:"c,omitempty"`
	Expiry         uint32                `msgpack:"e,omitempty"`
	ExpiryFlag     bool                  `msgpack:"ef,omitempty"`
	ReceiveMaximum uint16                `msgpack:"rm,omitempty"`
	Subs           map[string]sessionSub `msgpack:"s"`
	// Disconnected is when the session's last connection ended (unix
	// seconds; 0 while connected): in a site, the broker the client
	// reconnects to decides from it whether the session expired. For a
	// session whose broker died while it was connected, it is when
	// another broker adopted it (sessions_orphans.go).
	Disconnected int64 `msgpack:"dt,omitempty"`
	// Legacy holds the offsets that Peats of key layout 3 kept in the
	// session (by stream name, or "$tap:"+filter), until they move to the
	// streams' state (state_migrate.go). New sessions never write it.
	Legacy map[string]uint64 `msgpack:"o,omitempty"`

	// cursors are where the client resumes, kept in the streams' state.
	cursors map[cursorKey]uint64 `msgpack:"-"`
	// written: records below these offsets were written to the session's
	// earlier connections, so they are resent with DUP 1; live are the
	// marks of its connection's deliveries, written with them (resend.go).
	written map[cursorKey]uint64   `msgpack:"-"`
	live    map[cursorKey]*resends `msgpack:"-"`

	// conn is the connection that holds the session (nil while none does):
	// when an earlier connection of the same client id ends, it must not
	// end a session a newer connection took over.
	conn *mochi.Client `msgpack:"-"`
	// transient: the session ends with conn (its expiry is 0); it is not
	// in the store.
	transient bool `msgpack:"-"`
	// orphan: adopted from a broker that is gone (sessions_orphans.go);
	// its expiry runs here, from Disconnected, not in mochi.
	orphan bool `msgpack:"-"`
}

// sessions is the registry of durable sessions.
type sessions struct {
	w *stateWriter
	// shared: the streams' state is shared with other brokers, which keep
	// their own sessions (SharedState); offsets of unknown sessions stay.
	shared bool
	// site, when not nil, holds the sessions' properties and
	// subscriptions for every broker of a site (sessions_site.go).
	site SiteSessions

	mu sync.Mutex
	m  map[string]*session // by client id
	// claimed (site only) are the client ids whose session this broker
	// holds the site's claim of, each with the number of the attempt
	// that claimed it: writes of other sessions are dropped, and a
	// release goes only if no claim was attempted since.
	claimed map[string]uint64
	attempt uint64
}

func newSessions() *sessions {
	return &sessions{m: map[string]*session{}, claimed: map[string]uint64{}}
}

// mayWrite reports whether this broker writes id's session: always on a
// single broker, while it holds the session's claim in a site. ss.mu is
// held.
func (ss *sessions) mayWrite(id string) bool {
	return ss.site == nil || ss.claimed[id] != 0
}

// metaRef is where id's properties and subscriptions are kept.
func (ss *sessions) metaRef(id string) stateRef {
	if ss.site != nil {
		return stateRef{stream: siteSessionsStore, key: sessionStatePrefix + id}
	}
	return stateRef{key: sessionStatePrefix + id}
}

// persistent reports whether cl's session outlives its connection: a v5
// Session Expiry Interval above 0, or a v3 clean session false. It does not
// decide whether cl resumes a stored session; Clean Start does.
func persistent(cl *mochi.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryIntervalFlag && cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// load reads every stored session's properties and subscriptions; their
// offsets come with their streams (loadCursors).
func (ss *sessions) load(st StateStore) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return st.LoadState(sessionStatePrefix, func(k string, v []byte) error {
		var s session
		if err := msgpack.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		if s.Subs == nil {
			s.Subs = map[string]sessionSub{}
		}
		s.cursors = map[cursorKey]uint64{}
		ss.m[strings.TrimPrefix(k, sessionStatePrefix)] = &s
		return nil
	})
}

// loadCursors reads the sessions' offsets in stream s as its state holds
// them: when delivery starts reading s, and whenever its state moved.
// Offsets of a client without a session (it ended while they were being
// written) are deleted, unless the state is shared: they are then most
// likely a session on another broker.
func (ss *sessions) loadCursors(s Stream) error {
	type entry struct {
		id  string
		c   cursorKey
		off uint64
	}
	var got []entry
	for _, prefix := range []string{cursorStatePrefix, tapCursorStatePrefix} {
		err := s.LoadState(prefix, func(k string, v []byte) error {
			id, c, ok := cursorOf(s.Name(), k)
			if !ok || len(v) != 8 {
				return fmt.Errorf("session offset %q: malformed", k)
			}
			got = append(got, entry{id, c, binary.BigEndian.Uint64(v)})
			return nil
		})
		if err != nil {
			return fmt.Errorf("stream %s: %w", s.Name(), err)
		}
	}
	stale, err := ss.loadMarks(s)
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.Name(), err)
	}
	ss.mu.Lock()
	for _, e := range got {
		if sess := ss.m[e.id]; sess != nil {
			sess.cursors[e.c] = e.off
		} else if !ss.shared {
			stale = append(stale, e.c.ref(e.id))
		}
	}
	ss.mu.Unlock()
	for _, ref := range stale {
		ss.w.put(ref, nil, nil)
	}
	return nil
}

// dropStream forgets the offsets in a stream the log removed (they went
// with it).
func (ss *sessions) dropStream(name string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.m {
		for c := range s.cursors {
			if c.stream == name {
				delete(s.cursors, c)
			}
		}
	}
}

// saveMeta writes the session of id (properties, subscriptions) as it is
// when the writer gets to it; urgent writes it at once. A session that
// ended is deleted, and so is a transient one, except in a site, where
// an owner's transient session leaves a record of its owner only.
func (ss *sessions) saveMeta(id string, urgent bool) {
	ss.saveMetaDone(id, urgentDone(urgent))
}

// saveMetaDone is saveMeta calling done (when not nil: at once) once
// written or failed.
func (ss *sessions) saveMetaDone(id string, done func(error)) {
	ss.w.putFunc(ss.metaRef(id), func() ([]byte, bool) {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if !ss.mayWrite(id) {
			return nil, false // another broker of the site holds it now
		}
		s := ss.m[id]
		if s == nil || s.transient && (ss.site == nil || s.Owner == "") {
			return nil, true // deleted meanwhile, or not to be kept
		}
		if s.transient {
			s = &session{ProtocolVersion: s.ProtocolVersion, Owner: s.Owner, OwnerOnly: true}
		}
		b, err := msgpack.Marshal(s)
		if err != nil { // cannot happen for this struct
			panic(fmt.Sprintf("mqtt: encode session %q: %v", id, err))
		}
		return b, true
	}, done)
}

// saveCursors writes the offsets cs of id's session the same way: deleted
// when the session ended, is transient, or no longer has the offset.
func (ss *sessions) saveCursors(id string, urgent bool, cs ...cursorKey) {
	for _, c := range cs {
		ss.saveMark(id, c, urgent)
		ss.w.putFunc(c.ref(id), func() ([]byte, bool) {
			ss.mu.Lock()
			defer ss.mu.Unlock()
			if !ss.mayWrite(id) {
				return nil, false
			}
			s := ss.m[id]
			if s == nil || s.transient {
				return nil, true
			}
			off, ok := s.cursors[c]
			if !ok {
				return nil, true
			}
			return encodeOffset(off), true
		}, urgentDone(urgent))
	}
}

// urgentDone is a stateWriter done that makes the write go out at once,
// for urgent, or nil.
func urgentDone(urgent bool) func(error) {
	if urgent {
		return func(error) {}
	}
	return nil
}

// cursorList returns the keys of s's offsets and resend marks.
func (s *session) cursorList() []cursorKey {
	cs := make([]cursorKey, 0, len(s.cursors))
	for c := range s.cursors {
		cs = append(cs, c)
	}
	for _, marks := range []map[cursorKey]uint64{s.written, liveEnds(s.live)} {
		for c := range marks {
			if _, ok := s.cursors[c]; !ok && !slices.Contains(cs, c) {
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// claim hands the stored session of a client that connects with Clean
// Start 0 to the new connection cl. It runs in OnSessionEstablish, before
// mochi disconnects the client's earlier connection, so that connection's
// end does not end the session the new one resumes.
//
// ends gives the streams' committed offsets now, before the CONNACK
// (read only for such a connect, not for every clean one): a session
// that resumes with subscriptions starts, in each stream it has no
// position in, there. What is published once the client has its
// CONNACK is then its own however late delivery attaches the connection
// (OnSessionEstablished runs after the CONNACK), where starting at the
// stream's end at that moment would skip it.
func (ss *sessions) claim(cl *mochi.Client, ends func() map[string]uint64) {
	if cl.Properties.Clean {
		return
	}
	at := ends() // before ss.mu: it takes delivery's lock
	ss.mu.Lock()
	if s := ss.m[cl.ID]; s != nil {
		s.conn = cl
		if len(s.Subs) > 0 {
			if s.cursors == nil {
				s.cursors = map[cursorKey]uint64{}
			}
			for name, end := range at {
				if k := (cursorKey{stream: name}); !hasCursor(s, k) {
					s.cursors[k] = end
				}
			}
		}
	}
	ss.mu.Unlock()
}

func hasCursor(s *session, k cursorKey) bool {
	_, ok := s.cursors[k]
	return ok
}

// establish records the session of a client that just connected, with the
// subscriptions mochi gave it. Clean Start ends a stored session; without
// it the stored session resumes, kept past this connection only if the
// connection is persistent.
func (ss *sessions) establish(cl *mochi.Client) {
	ss.mu.Lock()
	s := ss.m[cl.ID]
	var ended []cursorKey
	if s != nil && cl.Properties.Clean {
		ended = s.cursorList()
		delete(ss.m, cl.ID) // [MQTT-3.1.2-4]: a new session, not the old offsets
		s = nil
	}
	if s == nil && !persistent(cl) {
		ss.mu.Unlock()
		if ended != nil {
			ss.saveMeta(cl.ID, true)
			ss.saveCursors(cl.ID, true, ended...)
		}
		ss.releaseAfterWrite(cl.ID)
		return
	}
	if s == nil {
		s = &session{cursors: map[cursorKey]uint64{}}
		ss.m[cl.ID] = s
	}
	s.conn = cl
	s.Disconnected = 0
	s.transient = !persistent(cl) // resumed, but it ends with this connection
	s.ProtocolVersion = cl.Properties.ProtocolVersion
	s.Username = string(cl.Properties.Username)
	if id := identityOf(cl); id != "" { // tenancy.go: admit refused other identities
		s.Owner = id
	}
	s.Listener = cl.Net.Listener
	s.Clean = cl.Properties.Clean
	s.Expiry = cl.Properties.Props.SessionExpiryInterval
	s.ExpiryFlag = cl.Properties.Props.SessionExpiryIntervalFlag
	s.ReceiveMaximum = cl.Properties.Props.ReceiveMaximum
	old := s.Subs
	s.Subs = map[string]sessionSub{}
	for _, sub := range cl.State.Subscriptions.GetAll() {
		stored := sessionSubOf(sub)
		stored.Clients = old[sub.Filter].Clients // mochi's subscription does not hold it
		s.Subs[sub.Filter] = stored
	}
	cs := append(s.cursorList(), ended...)
	ss.mu.Unlock()
	ss.saveMeta(cl.ID, true) // a transient session is taken out of the store
	ss.saveCursors(cl.ID, true, cs...)
}

// held reports whether cl holds a session that resumes from the log.
func (ss *sessions) held(cl *mochi.Client) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[cl.ID]
	return s != nil && s.conn == cl
}

func sessionSubOf(sub packets.Subscription) sessionSub {
	return sessionSub{
		Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
		RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling,
		Identifier: sub.Identifier,
	}
}

// subscribed and unsubscribed follow a durable client's subscriptions;
// clients: the SUBSCRIBE asked for publishers (asksClients), which its
// extension subscriptions keep.
func (ss *sessions) subscribed(id string, subs []packets.Subscription, clients bool) {
	ss.mu.Lock()
	s := ss.m[id]
	if s != nil {
		for _, sub := range subs {
			stored := sessionSubOf(sub)
			stored.Clients = clients && (strings.HasPrefix(sub.Filter, replayPrefix) || strings.HasPrefix(sub.Filter, groupPrefix))
			s.Subs[sub.Filter] = stored
		}
	}
	ss.mu.Unlock()
	if s == nil {
		return
	}
	if ss.site == nil {
		ss.saveMeta(id, true)
		return
	}
	// In a site the SUBACK waits until the site holds the subscription
	// (a round trip): the client may resume on another broker at once.
	written := make(chan struct{})
	ss.saveMetaDone(id, func(error) { close(written) })
	t := time.NewTimer(siteWriteWait)
	defer t.Stop()
	select {
	case <-written:
	case <-t.C:
	}
}

// siteWriteWait bounds how long a SUBACK waits for the site to hold the
// subscription (the write goes on after).
const siteWriteWait = 10 * time.Second

func (ss *sessions) unsubscribed(id string, filters []string) {
	ss.mu.Lock()
	s := ss.m[id]
	var gone []cursorKey
	if s != nil {
		for _, f := range filters {
			delete(s.Subs, f)
			for _, c := range s.cursorList() {
				if c.tap == f {
					delete(s.cursors, c)
					delete(s.written, c)
					delete(s.live, c)
					gone = append(gone, c)
				}
			}
		}
	}
	ss.mu.Unlock()
	if s != nil {
		ss.saveMeta(id, true)
		ss.saveCursors(id, true, gone...)
	}
}

// advance sets where the client resumes. A transient session's position
// is not written: it is not in the store.
func (ss *sessions) advance(id string, c cursorKey, off uint64) {
	ss.mu.Lock()
	s := ss.m[id]
	keep := s != nil && !s.transient
	if s != nil {
		s.cursors[c] = off
	}
	ss.mu.Unlock()
	if keep {
		ss.saveCursors(id, false, c)
	}
}

// offset returns where the client resumes for c, if it has a stored one.
func (ss *sessions) offset(id string, c cursorKey) (uint64, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return 0, false
	}
	off, ok := s.cursors[c]
	return off, ok
}

// disconnected ends or writes the session cl held when its connection
// ended. expire is mochi's verdict from the connection's final Session
// Expiry Interval (a v5 DISCONNECT may have changed it) or clean session.
// A connection that a newer one took over leaves the session alone.
func (ss *sessions) disconnected(cl *mochi.Client, expire bool) {
	ss.mu.Lock()
	s := ss.m[cl.ID]
	if s == nil || (s.conn != nil && s.conn != cl) {
		ss.mu.Unlock()
		return
	}
	cs := s.cursorList()
	if expire {
		delete(ss.m, cl.ID)
	} else {
		s.conn = nil
		s.transient = false
		s.Expiry = cl.Properties.Props.SessionExpiryInterval
		s.ExpiryFlag = cl.Properties.Props.SessionExpiryIntervalFlag
		s.Disconnected = time.Now().Unix()
	}
	ss.mu.Unlock()
	ss.saveMeta(cl.ID, true)
	ss.saveCursors(cl.ID, true, cs...)
	if expire {
		ss.releaseAfterWrite(cl.ID)
	}
}

// expire ends a session.
func (ss *sessions) expire(id string) {
	if ss.drop(id) {
		ss.releaseAfterWrite(id)
	}
}

// drop ends a session and deletes it from the store; ok is false when
// there was none.
func (ss *sessions) drop(id string) (ok bool) {
	ss.mu.Lock()
	s, ok := ss.m[id]
	delete(ss.m, id)
	ss.mu.Unlock()
	if ok {
		ss.saveMeta(id, true)
		ss.saveCursors(id, true, s.cursorList()...)
	}
	return ok
}

// stored returns the sessions as mochi's storage records.
func (ss *sessions) stored() ([]storage.Client, []storage.Subscription) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var clients []storage.Client
	var subs []storage.Subscription
	for id, s := range ss.m {
		clients = append(clients, storage.Client{
			ID:              id,
			T:               storage.ClientKey,
			Listener:        s.Listener,
			Username:        []byte(s.Username),
			Clean:           s.Clean,
			ProtocolVersion: s.ProtocolVersion,
			Properties: storage.ClientProperties{
				SessionExpiryInterval:     s.Expiry,
				SessionExpiryIntervalFlag: s.ExpiryFlag,
				ReceiveMaximum:            s.ReceiveMaximum,
			},
		})
		for _, sub := range s.Subs {
			subs = append(subs, storage.Subscription{
				ID: id + ":" + sub.Filter, T: storage.SubscriptionKey, Client: id,
				Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
				RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling,
				Identifier: sub.Identifier,
			})
		}
	}
	return clients, subs
}

// releaseAfterWrite lets the site's claim of id's session go once what is
// queued for the session (its deletion) is written, unless a claim of id
// was attempted or a session of id began here meanwhile.
func (ss *sessions) releaseAfterWrite(id string) {
	if ss.site == nil {
		return
	}
	ss.mu.Lock()
	attempt, ok := ss.claimed[id]
	ss.mu.Unlock()
	if !ok {
		return
	}
	var done func(error)
	done = func(err error) {
		if err != nil { // the writer tries again; so does this
			ss.w.after(done)
			return
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.claimed[id] != attempt || ss.m[id] != nil {
			return
		}
		delete(ss.claimed, id)
		ss.site.ReleaseSession(id)
	}
	ss.w.after(done)
}

// asksClients reports whether the stored session of client id asked
// for publishers on its subscription to filter (sessionSub.Clients).
func (ss *sessions) asksClients(id, filter string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	return s != nil && s.Subs[filter].Clients
}
