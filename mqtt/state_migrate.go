package mqtt

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
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
// stay where they are until a start that has the stream.
func migrateState(l Log, logger *slog.Logger) error {
	st := l.State()
	moves := map[string]map[string][]byte{} // stream -> its state puts
	put := func(stream string, ref stateRef, val []byte) {
		if moves[stream] == nil {
			moves[stream] = map[string][]byte{}
		}
		moves[stream][ref.key] = val
	}
	var dels []string
	rewrite := map[string][]byte{}

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

	err = st.LoadState(sessionStatePrefix, func(k string, v []byte) error {
		var s session
		if err := msgpack.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		if len(s.Legacy) == 0 {
			return nil
		}
		id := strings.TrimPrefix(k, sessionStatePrefix)
		for name, off := range s.Legacy {
			c, ok := legacyCursor(l, name)
			if !ok {
				continue
			}
			put(c.stream, c.ref(id), binary.BigEndian.AppendUint64(nil, off))
			delete(s.Legacy, name)
		}
		b, err := msgpack.Marshal(&s)
		if err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		rewrite[k] = b
		return nil
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
