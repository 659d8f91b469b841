package mqtt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Consumer groups ($group/<name>/+/<filter>) and their committed offsets
// ($offsets/<group>/<stream>).
//
// A group's committed offset in a stream is the next offset the group will
// be given (Kafka's convention): every record below it was acknowledged by
// the group's consumer, or did not match its filter. It is kept in the
// stream's own state (Stream.WriteState) under "g/<group>" as 8 big-endian
// bytes, so it travels with the stream (a cluster replicates it with the
// stream's records), written by the stateWriter: acknowledgements advance
// it in memory at once and reach the store within the writer's interval; a
// commit published to $offsets is written at once and acknowledged only
// when durable. When the stream's state moves (Stream.StateMoved: a
// cluster moved its leadership here), the offsets are loaded again and a
// consumer of a group whose offset changed continues from the new one.
//
// A group has one active consumer per stream at a time, like a Kafka
// partition's single owner. The stream decides which client it is
// (Stream.Claim: on a single node the node, in a cluster the stream's
// leader); on this node the tap that serves that client owns it. A second
// subscription to the same group and stream, by another client, is refused
// while the owner is connected. The same client id subscribing again (a
// reconnect racing the old connection's end, or a re-subscribe) takes over.

// groupStatePrefix starts every group's key in its stream's state.
const groupStatePrefix = "g/"

// groupKey names one group's position in one stream.
type groupKey struct{ group, stream string }

// ref is where the group's committed offset is stored.
func (k groupKey) ref() stateRef { return stateRef{stream: k.stream, key: groupStatePrefix + k.group} }

// claim is the key of the group's single consumer in Stream.Claim.
func (k groupKey) claim() string { return groupStatePrefix + k.group }

// groupKeyOf parses a state entry's name; ok is false for other entries.
func groupKeyOf(ref stateRef) (groupKey, bool) {
	g, ok := strings.CutPrefix(ref.key, groupStatePrefix)
	return groupKey{group: g, stream: ref.stream}, ok && g != "" && ref.stream != ""
}

// groups is the registry of consumer groups on this node.
type groups struct {
	w *stateWriter

	mu sync.Mutex
	m  map[groupKey]*group
}

// group is one group's state in one stream.
type group struct {
	// position is the committed offset as this node knows it: advanced by
	// acknowledgements and commits at once. known is false for a group
	// that never committed.
	position uint64
	known    bool
	// durable is what the store holds; changed is closed (and replaced)
	// whenever it moves, for $offsets subscribers.
	durable      uint64
	durableKnown bool
	changed      chan struct{}
	owner        *tap
	// seeking is set by a commit while the owner has not yet moved to it:
	// acknowledgements of what it delivered before must not move the
	// offset past the commit meanwhile.
	seeking bool
}

func newGroups() *groups {
	return &groups{m: map[groupKey]*group{}}
}

// load reads the committed offsets of stream s's groups as its state holds
// them: when delivery starts reading s, and whenever its state moved. A
// group whose stored offset is not the one this node knows takes it, and
// its consumer here, if any, continues from there.
func (g *groups) load(s Stream) error {
	stored := map[string]uint64{}
	err := s.LoadState(groupStatePrefix, func(k string, v []byte) error {
		if len(v) != 8 || len(k) == len(groupStatePrefix) {
			return fmt.Errorf("group state %q: malformed", k)
		}
		stored[k[len(groupStatePrefix):]] = binary.BigEndian.Uint64(v)
		return nil
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.Name(), err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, off := range stored {
		e := g.entryLocked(groupKey{group: name, stream: s.Name()})
		if e.durableKnown && e.durable == off {
			continue // what this node wrote, or already loaded
		}
		e.position, e.known = off, true
		e.durable, e.durableKnown = off, true
		close(e.changed)
		e.changed = make(chan struct{})
		if e.owner != nil {
			e.seeking = true
			e.owner.seekTo(off)
		}
	}
	return nil
}

// drop forgets the groups of a stream the log removed (their state went
// with it).
func (g *groups) drop(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.m {
		if k.stream == stream {
			delete(g.m, k)
		}
	}
}

// entryLocked returns the state of key, creating it.
func (g *groups) entryLocked(key groupKey) *group {
	e := g.m[key]
	if e == nil {
		e = &group{changed: make(chan struct{})}
		g.m[key] = e
	}
	return e
}

// position returns the group's committed offset in a stream as this node
// knows it; ok is false for a group that never committed there.
func (g *groups) position(key groupKey) (uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.m[key]
	if e == nil || !e.known {
		return 0, false
	}
	return e.position, true
}

// acquire makes t the owner of key in stream s; it fails, naming the
// holder's client, when another client holds the group there.
func (g *groups) acquire(key groupKey, t *tap, s Stream) (ok bool, holder string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entryLocked(key)
	if o := e.owner; o != nil && o != t && o.c.id != t.c.id {
		if o.ctx.Err() == nil {
			return false, o.c.id
		}
		s.Unclaim(key.claim(), o.c.id) // it ended; its release is on the way
	}
	if ok, holder := s.Claim(key.claim(), t.c.id); !ok {
		return false, holder
	}
	e.owner = t
	return true, ""
}

// release gives key up, if t still owns it.
func (g *groups) release(key groupKey, t *tap) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[key]; e != nil && e.owner == t {
		e.owner = nil
		t.r.stream.Unclaim(key.claim(), t.c.id)
	}
}

// advance moves the committed offset forward as the owner's consumer
// acknowledges; t must still own the group. It is written within the
// writer's interval.
func (g *groups) advance(key groupKey, t *tap, off uint64) {
	g.mu.Lock()
	e := g.m[key]
	if e == nil || e.owner != t || e.seeking || (e.known && off <= e.position) {
		g.mu.Unlock()
		return
	}
	e.position, e.known = off, true
	g.mu.Unlock()
	g.w.put(key.ref(), encodeOffset(off), nil)
}

// commit sets the committed offset (forward or back) and tells the owner,
// if any, to continue from there. done is called once it is durable.
func (g *groups) commit(key groupKey, off uint64, done func(error)) {
	g.mu.Lock()
	e := g.entryLocked(key)
	e.position, e.known = off, true
	owner := e.owner
	if owner != nil {
		e.seeking = true
		owner.seekTo(off)
	}
	g.mu.Unlock()
	g.w.put(key.ref(), encodeOffset(off), done)
}

// sought is the owner's report that it continues from the last commit.
func (g *groups) sought(key groupKey, t *tap) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[key]; e != nil && e.owner == t {
		e.seeking = false
	}
}

// written is the stateWriter's report that a group's offset is durable.
func (g *groups) written(key groupKey, val []byte) {
	if len(val) != 8 {
		return
	}
	off := binary.BigEndian.Uint64(val)
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entryLocked(key)
	if e.durableKnown && e.durable == off {
		return
	}
	e.durable, e.durableKnown = off, true
	close(e.changed)
	e.changed = make(chan struct{})
}

// watch returns the group's durable committed offset (ok false when it has
// none yet) and a channel closed when it changes.
func (g *groups) watch(key groupKey) (off uint64, ok bool, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entryLocked(key)
	return e.durable, e.durableKnown, e.changed
}

// errBadCommit marks a publish to $offsets/<group>/<stream> whose payload
// is not an offset the group can be moved to; the message says why and is
// the refusal's reason string.
var errBadCommit = errors.New("bad $offsets commit")

// maxOffsetDigits is the length of the largest uint64 in decimal.
const maxOffsetDigits = 20

// commitOffsetOf checks the payload of a commit published to
// $offsets/<group>/<stream> against stream s. It returns the offset to
// store and, when that is not the one asked for, a notice saying why.
//
// The payload is a plain decimal: ASCII digits only, no sign, space,
// prefix or exponent (" 5" or "+5" is more likely a client bug than an
// offset, and a commit cannot be taken back).
//
// Offsets are checked against the stream as it is now:
//   - above the log end (Committed): refused, not clamped. The group would
//     otherwise wait, receiving nothing, until the log reached that offset,
//     and then silently skip everything published meanwhile; clamping
//     would hide the client's mistake (an offset from another stream, or
//     from another cluster) behind a success. The end itself is valid: it
//     means "consumed everything so far".
//   - below the log start (FirstOffset): stored as the log start, as
//     Kafka's auto.offset.reset=earliest would move such a consumer. The
//     records below are gone by retention; a consumer restoring an offset
//     it saved before they expired did nothing wrong, and the group reads
//     from the log start either way. $offsets then shows where the group
//     really is.
func commitOffsetOf(payload []byte, s Stream) (off uint64, notice string, err error) {
	if len(payload) == 0 || len(payload) > maxOffsetDigits {
		return 0, "", fmt.Errorf("%w: payload %q: want a decimal offset of 1 to %d digits", errBadCommit, payload, maxOffsetDigits)
	}
	for _, b := range payload {
		if b < '0' || b > '9' {
			return 0, "", fmt.Errorf("%w: payload %q: want a plain decimal offset (digits only: no spaces, signs or prefixes)", errBadCommit, payload)
		}
	}
	off, err = strconv.ParseUint(string(payload), 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("%w: payload %q: above the largest offset", errBadCommit, payload)
	}
	end, first := s.Committed(), s.FirstOffset()
	switch {
	case off > end:
		return 0, "", fmt.Errorf("%w: offset %d is beyond the end of stream %q (%d); commit at most %d",
			errBadCommit, off, s.Name(), end, end)
	case off < first:
		return first, fmt.Sprintf("offset %d is below the log start %d of stream %q (retention); committed %d",
			off, first, s.Name(), first), nil
	}
	return off, "", nil
}

func encodeOffset(off uint64) []byte { return binary.BigEndian.AppendUint64(nil, off) }
