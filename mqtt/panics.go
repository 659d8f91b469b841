package mqtt

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A panic on a goroutine that serves one client (its read goroutine, with
// mochi's packet handling and every hook; Peat's ack drainer, delivery
// sender and taps) would end the process and drop every other client. The
// guard checks every packet before mochi decodes it (packetcheck.go), so
// no packet should get that far; if one does, or a bug in Peat or mochi
// panics, the goroutine recovers: it counts the panic in
// peat_mqtt_panics_total, logs it once at ERROR with the stack, and closes
// that client's connection. mochi's write goroutine is mochi's own: Peat's
// hooks that run on it (OnPacketEncode, OnPacketSent) recover their own
// panics (writeSide); mochi's encoding there only encodes packets Peat
// or mochi built.

// panicKey is the rate-limit key of panic log lines: a client that finds a
// panic can repeat it, and the counter holds the true number.
const panicKey = "panic"

// panics recovers panics on client goroutines.
type panics struct {
	m    *Metrics
	logs *connLog
}

// catch, deferred at the top of a goroutine serving cl, recovers a panic
// and closes cl's connection. It must be deferred itself (recover works
// only there).
func (p panics) catch(cl *mochi.Client, where string) {
	r := recover()
	if r == nil {
		return
	}
	err := p.record(r, where, cl.ID, cl.Net.Remote)
	cl.Stop(err)
}

// record counts and logs a recovered panic r, and returns the error that
// ends the client's connection.
func (p panics) record(r any, where, clientID, remote string) error {
	p.m.Panics.Inc()
	p.logs.log(slog.LevelError, "recovered a panic serving a client; closing its connection", panicKey,
		slog.String(attrClient, clientID), slog.String(attrRemote, remote), slog.String("where", where),
		slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(debug.Stack())))
	return fmt.Errorf("%w: %v", ErrPanic, r)
}

// afterPanic does for a client whose read goroutine panicked what mochi
// does when a read loop ends (the panic skipped it): stop the client, run
// Peat's OnDisconnect hooks (delivery and ingest state, a will on a
// captured topic) and drop a session that ends with the connection.
// mochi's hook list is private, so hooks are Peat's, in the order New
// added them; a will on a topic no stream captures is not sent.
func (b *Broker) afterPanic(gc *guardConn, err error) {
	cl, ok := b.srv.Clients.Get(gc.clientID)
	if !ok || guardOf(cl) != gc {
		return // the panic came before the session was established
	}
	defer b.panics.catch(cl, "disconnect after a panic")
	cl.Stop(err)
	expire := (cl.Properties.ProtocolVersion == 5 && cl.Properties.Props.SessionExpiryInterval == 0) ||
		(cl.Properties.ProtocolVersion < 5 && cl.Properties.Clean)
	for _, h := range b.hooks {
		if h.Provides(mochi.OnDisconnect) {
			h.OnDisconnect(cl, err, expire)
		}
	}
	if expire && !cl.IsTakenOver() {
		cl.ClearInflights()
		b.srv.UnsubscribeClient(cl)
		b.srv.Clients.Delete(cl.ID)
	}
}

// A writer is a hook with work on a client's write goroutine (mochi's
// OnPacketEncode and OnPacketSent), where no recover of Peat's stands
// above it. Its Provides leaves those two events out and writes names
// them instead: addHook registers them apart, through writeSide, which
// recovers their panics, and mochi calls the hook itself for every other
// event. (A wrapper around the whole hook would put one more call, and
// one more copy of mochi's 800-byte packet each way, on every event of
// every packet: 1% of a leader's CPU in W5.)
type writer interface {
	mochi.Hook
	writes(event byte) bool // mochi.OnPacketEncode or mochi.OnPacketSent
}

// writeSide is a writer's OnPacketEncode and OnPacketSent as mochi sees
// them.
type writeSide struct {
	mochi.HookBase
	h writer
	p panics
}

func (w *writeSide) ID() string { return w.h.ID() + "-write" }

func (w *writeSide) Provides(b byte) bool {
	return (b == mochi.OnPacketEncode || b == mochi.OnPacketSent) && w.h.writes(b)
}

func (w *writeSide) OnPacketEncode(cl *mochi.Client, pk packets.Packet) (out packets.Packet) {
	out = pk
	defer w.p.catch(cl, "encode")
	return w.h.OnPacketEncode(cl, pk)
}

func (w *writeSide) OnPacketSent(cl *mochi.Client, pk packets.Packet, b []byte) {
	defer w.p.catch(cl, "sent")
	w.h.OnPacketSent(cl, pk, b)
}
