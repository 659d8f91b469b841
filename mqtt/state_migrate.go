package mqtt

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Peats of key layout 3 kept every consumer position in the log's State:
// groups under "g/<group>/<stream>", and a durable session's offsets in its
// "s/<client>" value (by stream name, or "$tap:<filter>" for a $replay).
// Positions now live in the stream they point into (groups.go,
// sessions.go). migrateState moves them there at start, for the streams
// the log has: the stream's entries are written first and the old ones
// deleted after, so a crash in between leaves both and the next start
// moves the same values again. Positions in streams the log does not have
// stay where they are until a start that has the stream, unless the
// stream is deleted first (ForgetLegacy).
func migrateState(l Log, logger *slog.Logger) error {
	legacyMu.Lock()
	defer legacyMu.Unlock()
	st := l.State()
	moves := map[string]map[string][]byte{} // stream -> its state puts
	put := func(stream string, ref stateRef, val []byte) {
		if moves[stream] == nil {
			moves[stream] = map[string][]byte{}
		}
		moves[stream][ref.key] = val
	}
	var dels []string

	err := st.LoadState(groupStatePrefix, func(k string, v []byte) error {
		rest := strings.TrimPrefix(k, groupStatePrefix)
		group, stream, ok := strings.Cut(rest, "/")
		if !ok || group == "" || len(v) != 8 {
			return fmt.Errorf("group state %q: malformed", k)
		}
		if l.Stream(stream) == nil {
			return nil
		}
		key := groupKey{group: group, stream: stream}
		put(stream, key.ref(), v)
		dels = append(dels, k)
		return nil
	})
	if err != nil {
		return fmt.Errorf("move consumer groups to their streams: %w", err)
	}

	rewrite, err := rewriteSessions(st, func(id string, s *session) bool {
		n := len(s.Legacy)
		for name, off := range s.Legacy {
			c, ok := legacyCursor(l, name)
			if !ok {
				continue
			}
			put(c.stream, c.ref(id), binary.BigEndian.AppendUint64(nil, off))
			delete(s.Legacy, name)
		}
		return len(s.Legacy) != n
	})
	if err != nil {
		return fmt.Errorf("move durable sessions' offsets to their streams: %w", err)
	}
	if len(moves) == 0 {
		return nil
	}

	n := 0
	for stream, puts := range moves {
		if err := writeStateChunks(l.Stream(stream), puts, nil, "", nil); err != nil {
			return fmt.Errorf("move consumer positions to stream %s: %w", stream, err)
		}
		n += len(puts)
	}
	if err := writeStateChunks(st, rewrite, dels, "", nil); err != nil {
		return fmt.Errorf("move consumer positions: delete the old entries: %w", err)
	}
	logger.Info("moved consumer positions into their streams' state", slog.Int("positions", n))
	return nil
}

// legacyCursor resolves a layout 3 session offset's name: a stream the log
// has, or a $replay filter that reaches exactly one stream.
func legacyCursor(l Log, name string) (cursorKey, bool) {
	filter, tap := strings.CutPrefix(name, "$tap:")
	if !tap {
		return cursorKey{stream: name}, l.Stream(name) != nil
	}
	ext, err := parseExtension(filter, time.Now())
	if err != nil || ext.kind != extReplay {
		return cursorKey{}, false
	}
	streams, err := streamsReached(l, ext.inner)
	if err != nil || len(streams) != 1 {
		return cursorKey{}, false
	}
	return cursorKey{stream: streams[0].Name(), tap: filter}, true
}

// legacyMu keeps migrateState and ForgetLegacy apart: a start must not
// read entries a deletion is dropping, and move them into a stream that
// the deletion made visible (a site empties a stream and serves it anew).
var legacyMu sync.Mutex

// ForgetLegacy deletes from the node's own state (l.State()) the
// positions a Peat of key layout 3 kept there that may point into stream
// name, which is about to be deleted: its groups ("g/<group>/<name>") and
// the sessions' offsets in it (Legacy[name]), and the sessions' $replay
// offsets whose filter reaches no single stream of l (the stream they
// were taken in is unknown, and may be this one). Otherwise a stream
// created later under the same name would take them over at its first
// start (migrateState) and its consumers resume at offsets of another
// stream. Callers run it before the deletion begins: a stop in between
// leaves the stream without these positions, never positions without
// their stream. A site's nodes call it (their durable sessions live in
// the site, not here); a single broker calls Broker.ForgetLegacy, which
// keeps its sessions in memory.
func ForgetLegacy(l Log, name string) error {
	return dropLegacy(l, name, func() (map[string][]byte, error) {
		return rewriteSessions(l.State(), func(_ string, s *session) bool { return s.forgetLegacy(l, name) })
	})
}

// ForgetLegacy is ForgetLegacy for this broker's log. A single broker
// holds its durable sessions in memory and writes them whole: their
// Legacy offsets go there too, and it returns once the sessions so
// changed are written.
func (b *Broker) ForgetLegacy(ctx context.Context, name string) error {
	l := b.deliv.log
	if _, site := l.(SiteSessions); site {
		return ForgetLegacy(l, name)
	}
	ss := b.deliv.sessions
	return dropLegacy(l, name, func() (map[string][]byte, error) {
		var ids []string
		ss.mu.Lock()
		for id, s := range ss.m {
			if s.forgetLegacy(l, name) {
				ids = append(ids, id)
			}
		}
		ss.mu.Unlock()
		written := make(chan error, len(ids))
		for _, id := range ids {
			ss.saveMetaDone(id, func(err error) { written <- err })
		}
		for range ids {
			select {
			case err := <-written:
				if err != nil {
					return nil, err
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, nil
	})
}

// dropLegacy deletes stream name's layout 3 groups from l's state, and
// writes the session values that sessions returns (by key) with them.
func dropLegacy(l Log, name string, sessions func() (map[string][]byte, error)) error {
	legacyMu.Lock()
	defer legacyMu.Unlock()
	st := l.State()
	dels, err := legacyGroups(st, name)
	if err != nil {
		return err
	}
	rewrite, err := sessions()
	if err != nil {
		return fmt.Errorf("forget stream %s's old session offsets: %w", name, err)
	}
	if err := writeStateChunks(st, rewrite, dels, "", nil); err != nil {
		return fmt.Errorf("forget stream %s's old consumer positions: %w", name, err)
	}
	return nil
}

// rewriteSessions returns the stored sessions with layout 3 offsets that
// edit changed (it reports whether it did), encoded again, by key.
func rewriteSessions(st StateStore, edit func(id string, s *session) bool) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := st.LoadState(sessionStatePrefix, func(k string, v []byte) error {
		var s session
		if err := msgpack.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		if len(s.Legacy) == 0 || !edit(strings.TrimPrefix(k, sessionStatePrefix), &s) {
			return nil
		}
		b, err := msgpack.Marshal(&s)
		if err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		out[k] = b
		return nil
	})
	return out, err
}

// legacyGroups returns the keys of stream name's groups in st, layout 3's.
func legacyGroups(st StateStore, name string) ([]string, error) {
	var keys []string
	err := st.LoadState(groupStatePrefix, func(k string, _ []byte) error {
		if _, stream, ok := strings.Cut(strings.TrimPrefix(k, groupStatePrefix), "/"); ok && stream == name {
			keys = append(keys, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("forget stream %s's old group offsets: %w", name, err)
	}
	return keys, nil
}

// forgetLegacy deletes s's layout 3 offsets that may point into stream
// name (ForgetLegacy) and reports whether it deleted any.
func (s *session) forgetLegacy(l Log, name string) bool {
	n := len(s.Legacy)
	for k := range s.Legacy {
		_, moves := legacyCursor(l, k)
		if k == name || strings.HasPrefix(k, "$tap:") && !moves {
			delete(s.Legacy, k)
		}
	}
	return len(s.Legacy) != n
}
