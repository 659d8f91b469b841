package source

import (
	"context"
	"errors"
	"fmt"

	"github.com/peatmq/peat/logstore"
)

// scanChunk is how many records Scan reads at a time, walking back.
const scanChunk = 256

// resume is the Resume of one connection: the stream as this node (its
// leader, in a site) holds it.
type resume struct {
	s  *Source
	st Stream
}

var _ Resume = (*resume)(nil)

func (r *resume) Stream() string { return r.st.Name() }

func (r *resume) End() uint64 { return r.st.Committed() }

// WaitCommitted returns once the stream's watermark has reached the log
// end it has now: an empty append answers with the log end once the
// watermark has passed it (mqtt.Stream's contract: done means
// committed), so waiting for it is waiting for them.
func (r *resume) WaitCommitted(ctx context.Context) error {
	st := r.st
	done := make(chan error, 1)
	st.AppendAsync(nil, func(_ uint64, err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("wait for %s to commit what it holds: %w", st.Name(), err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *resume) Scan(ctx context.Context, from uint64, fn func(*logstore.Record) bool) error {
	end := r.st.Committed()
	for {
		lo := max(from, r.st.FirstOffset())
		if end <= lo {
			return nil
		}
		start := max(lo, end-min(end, scanChunk))
		recs, err := r.readRange(start, end)
		if errors.Is(err, logstore.ErrOffsetOutOfRange) {
			continue // retention moved the start: look again
		}
		if err != nil {
			return fmt.Errorf("source %s: scan %s at %d: %w", r.s.cfg.Name, r.st.Name(), start, err)
		}
		for i := len(recs) - 1; i >= 0; i-- {
			if Of(recs[i]) == r.s.cfg.Name && !fn(recs[i]) {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		end = start
	}
}

// readRange reads the records at offsets start up to end.
func (r *resume) readRange(start, end uint64) ([]*logstore.Record, error) {
	var out []*logstore.Record
	for next := start; next < end; {
		recs, err := r.st.Read(next, int(end-next), 0)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			break
		}
		for _, rec := range recs {
			if rec.Offset >= end {
				return out, nil
			}
			out = append(out, rec)
		}
		next = recs[len(recs)-1].Offset + 1
	}
	return out, nil
}

func (r *resume) Mark() (uint64, bool, error) {
	return r.s.cfg.Marks.Load(Group(r.s.cfg.Name), r.st.Name())
}

func (r *resume) SetMark(off uint64) error {
	return r.s.cfg.Marks.Commit(Group(r.s.cfg.Name), r.st.Name(), off)
}

// Of names the source that appended rec ("" for a record that came from
// no source).
func Of(rec *logstore.Record) string { return prop(rec, PropSource) }

// Origin names the upstream a source brought rec down from ("" for a
// record that came from no source): a sink whose own Origin this is skips
// the record.
func Origin(rec *logstore.Record) string { return prop(rec, PropOrigin) }

func prop(rec *logstore.Record, key string) string {
	for i := len(rec.UserProperties) - 1; i >= 0; i-- {
		if p := rec.UserProperties[i]; p.Key == key {
			return p.Value
		}
	}
	return ""
}
