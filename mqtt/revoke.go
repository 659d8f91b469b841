package mqtt

import (
	"log/slog"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Revocable is an Access whose identity a reload of the rules can take
// away (a user removed from the users file, or given a new password).
// An Access that is not Revocable is never revoked; its rights still
// follow the rules, publish by publish.
type Revocable interface {
	// Revoked reports whether the identity the client logged in with no
	// longer holds, and why.
	Revoked() (why string, revoked bool)
}

// DeniedRevoked is the reason of Denied for a connection closed because
// its identity was revoked.
const DeniedRevoked = "revoked"

// Revoke applies the rules in force to the clients already connected,
// after the node reloaded them: it closes the connection of each client
// whose identity was revoked (MQTT 5: DISCONNECT 0x87 with the reason).
// A last will is judged when it fires, under the rules then in force
// (will.go). It returns how many clients it disconnected.
func (b *Broker) Revoke() int {
	if b.cfg.Auth == nil {
		return 0
	}
	n := 0
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, cl := range b.srv.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() {
			continue
		}
		acc := accessOf(cl)
		if acc == nil {
			continue
		}
		if why, ok := revoked(acc); ok {
			n++
			wg.Go(func() { b.revoke(cl, why) })
		}
	}
	return n
}

// revoked reports whether acc's identity was revoked, and why.
func revoked(acc Access) (string, bool) {
	if r, ok := acc.(Revocable); ok {
		return r.Revoked()
	}
	return "", false
}

// revoke closes cl's connection because its identity was revoked: an
// MQTT 5 client is told why (DISCONNECT 0x87), within
// refusalWriteTimeout however slowly it reads; MQTT 3.1.1 has no
// DISCONNECT from the server.
func (b *Broker) revoke(cl *mochi.Client, why string) {
	b.m.Denied.WithLabelValues(DeniedRevoked).Inc()
	b.conns.denied(DeniedRevoked, cl.ID, cl.Net.Remote, slog.String(attrReason, why))
	code := packets.Code{Code: packets.ErrNotAuthorized.Code, Reason: "not authorized: " + why}
	if cl.Properties.ProtocolVersion < 5 {
		cl.Stop(code)
		return
	}
	// A write stuck on a client that does not read holds the client's
	// lock, which the DISCONNECT needs: the deadline ends it.
	_ = cl.Net.Conn.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	_ = b.srv.DisconnectClient(cl, code)
}

// revokeHook closes a connection whose identity was revoked between its
// authentication and its joining mochi's clients, where Revoke, walking
// the clients, cannot see it: OnSessionEstablished runs once the client
// is among them, so a reload either comes before this check or finds the
// client in its walk.
type revokeHook struct {
	mochi.HookBase
	b *Broker
}

func (h *revokeHook) ID() string { return "peat-revoke" }

func (h *revokeHook) Provides(b byte) bool { return b == mochi.OnSessionEstablished }

func (h *revokeHook) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	if acc := accessOf(cl); acc != nil && !cl.Net.Inline {
		if why, ok := revoked(acc); ok {
			h.b.revoke(cl, why)
		}
	}
}
