package mqtt

import (
	"fmt"
	"log/slog"
	"strings"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Tenancy: the state a client owns besides topics.
//
// A consumer group is an object of the ACL: $group/<name>/... needs the
// rights to read and write group <name> (it reads the group's offset and
// moves it), $offsets/<group>/<stream> the right to read it (subscribe)
// or to write it (publish a commit); topic rules do not decide them.
// Groups whose names start with $ are Peat's own (a sink's position is
// "$sink.<name>"): no MQTT client reaches them, with or without Auth.
//
// A persistent session belongs to the identity that made it
// (Tenancy.Identity). A CONNECT with its client id from another identity
// is refused before mochi looks at the session: it neither resumes nor
// ends it, nor closes the owner's connection; the same holds for a
// connection of that client id that is live, persistent or not. In a
// site, another broker knows a live connection's owner from the stored
// session: a persistent one's, or the record naming only the owner of
// one resumed for its connection alone (session.OwnerOnly). A
// session stored without an owner (by a Peat before owners, or run
// without Auth) is adopted by the first identity that connects to it.
// Without Auth there are no identities and nothing is checked.

// Tenancy is what an Access says about the client's own state.
type Tenancy interface {
	// Identity names who the client is: the same for every connection
	// of one user, never empty. Sessions are owned by identities.
	Identity() string
	// MayUseClientID reports whether the client may connect with its
	// client id.
	MayUseClientID() bool
	// MayGroup reports whether the client may use consumer group: read
	// its committed offset (write false), or consume and commit (write
	// true).
	MayGroup(group string, write bool) bool
}

// Reasons of Denied for tenancy.
const (
	DeniedClientID = "client_id" // a client id the client-id rules refuse the user
	DeniedSession  = "session"   // a client id whose session or connection is another identity's
)

// reservedGroup reports whether a group is Peat's own: never reachable
// over MQTT.
func reservedGroup(name string) bool { return strings.HasPrefix(name, "$") }

// reservedGroupReason is the refusal's reason string for a $ group.
func reservedGroupReason(name string) string {
	return fmt.Sprintf("group %q: groups whose names start with $ are Peat's own (a sink moves through the HTTP API)", name)
}

// groupRefusal says why c may not subscribe to ext, a $group or $offsets
// filter, or nil. It runs before the group's consumer is looked at, so a
// refusal tells nothing about it.
func (d *delivery) groupRefusal(c *deliveryClient, ext extFilter) *tapError {
	if ext.kind != extGroup && ext.kind != extOffsets {
		return nil
	}
	if reservedGroup(ext.group) {
		d.m.Denied.WithLabelValues(DeniedSubscribe).Inc()
		return &tapError{code: subackNotAuthorized, reason: reservedGroupReason(ext.group)}
	}
	if d.auth == nil || c.cl.Net.Inline {
		return nil
	}
	acc := accessOf(c.cl)
	if acc != nil && acc.MayGroup(ext.group, false) && (ext.kind == extOffsets || acc.MayGroup(ext.group, true)) {
		return nil
	}
	d.m.Denied.WithLabelValues(DeniedSubscribe).Inc()
	return &tapError{code: subackNotAuthorized, reason: fmt.Sprintf("not authorized to use group %q", ext.group)}
}

// mayPublishTopic is Access.MayPublish, except for a commit to
// $offsets/<group>/<stream>, which needs the right to write the group.
// It stays shallow: ingest calls it on the read goroutine's small stack.
func mayPublishTopic(acc Access, topic string) bool {
	rest, ok := strings.CutPrefix(topic, offsetsPrefix)
	if !ok {
		return acc.MayPublish(topic)
	}
	group, _, _ := strings.Cut(rest, "/")
	return !reservedGroup(group) && acc.MayGroup(group, true)
}

// tenancy finds who owns a client id's session.
type tenancy struct {
	srv *mochi.Server
	ss  *sessions
}

// identityOf is the identity of cl's connection, "" without Auth.
func identityOf(cl *mochi.Client) string {
	if acc := accessOf(cl); acc != nil {
		return acc.Identity()
	}
	return ""
}

// owners returns the identities that hold client id: its connection's
// (live, or kept by mochi for a persistent session), and its stored
// session's. "" is none, or one without an owner.
func (t *tenancy) owners(id string) (conn, stored string, err error) {
	if old, ok := t.srv.Clients.Get(id); ok && !old.Net.Inline {
		conn = identityOf(old)
	}
	if t.ss.site != nil {
		s, found, err := loadSiteSession(t.ss.site.SessionState(), id)
		if err != nil {
			return conn, "", err
		}
		if found {
			stored = s.Owner
		}
		return conn, stored, nil
	}
	t.ss.mu.Lock()
	defer t.ss.mu.Unlock()
	if s := t.ss.m[id]; s != nil {
		stored = s.Owner
	}
	return conn, stored, nil
}

// admit checks what Auth let in against the client-id rules and the
// owner of the client id's session. A refusal is answered by
// OnPacketEncode with the code kept on cc.
func (h *authHook) admit(cl *mochi.Client, cc *corkConn, acc Access) bool {
	refuse := func(denied string, code packets.Code, why string) bool {
		code.Reason = why
		cc.refusal.Store(&code)
		h.m.Denied.WithLabelValues(denied).Inc()
		h.logs.denied(denied, cl.ID, cl.Net.Remote, slog.String(attrReason, why))
		return false
	}
	if !acc.MayUseClientID() {
		return refuse(DeniedClientID, packets.ErrClientIdentifierNotValid, "client id not allowed for this user")
	}
	if h.ten == nil {
		return true
	}
	me := acc.Identity()
	conn, stored, err := h.ten.owners(cl.ID)
	switch {
	case err != nil:
		return refuse(DeniedSession, packets.ErrServerUnavailable, "session owner unknown: "+err.Error())
	case conn != "" && conn != me, stored != "" && stored != me:
		return refuse(DeniedSession, packets.ErrNotAuthorized, "client id in use by another user")
	}
	return true
}

// tenancyConnack gives a client admit refused its CONNACK: the code and
// reason string for MQTT 5, the 3.1.1 return code closest to it.
func tenancyConnack(cl *mochi.Client, cc *corkConn, pk packets.Packet) (packets.Packet, bool) {
	code := cc.refusal.Load()
	if code == nil {
		return pk, false
	}
	if cl.Properties.ProtocolVersion < 5 {
		pk.ReasonCode = v3ReturnCode(code.Code, cl)
		return pk, true
	}
	pk.ReasonCode = code.Code
	pk.Properties.ReasonString = code.Reason
	return pk, true
}
