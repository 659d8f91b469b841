package peatsource

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// Apply writes records into a mirror stream by the mirror rules
// (edge/mirror): mirror.Apply on a node's own stream, or a site's
// Log.Mirror, which runs it on the mirror stream's leader.
type Apply func(ctx context.Context, stream string, in []mirror.Incoming) ([]mirror.Result, []error)

// MirrorLog is log with the stream named stream written by apply: each
// record at its own Offset (the upstream's), never at the log end. It is
// the Log a peat source runs on (source.Config.Log).
func MirrorLog(log source.Log, stream string, apply Apply, logger *slog.Logger) source.Log {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &mirrorLog{Log: log, stream: stream, apply: apply, logger: logger}
}

type mirrorLog struct {
	source.Log
	stream string
	apply  Apply
	logger *slog.Logger
}

func (l *mirrorLog) Stream(name string) source.Stream {
	st := l.Log.Stream(name)
	if st == nil || name != l.stream {
		return st
	}
	return &mirrorStream{Stream: st, l: l}
}

// mirrorStream is a mirror stream as the source framework appends to it.
type mirrorStream struct {
	source.Stream
	l *mirrorLog
}

// AppendAsync writes recs at their offsets, by the mirror rules, and
// calls done with the first once all are stored (a record the mirror
// holds already counts as stored), or with the first refusal. The upstream
// delivers a replay in offset order and leaves out only what it cannot
// give (retention, gap markers, records the filter or its ACL do not
// reach), so each record is also the upstream's log start as far as the
// mirror is concerned (First): the offsets before it that the mirror
// lacks become gap markers. That holds only while nothing stored after a
// failed write: the peat source hands out one batch at a time, and the
// framework ends the connection on a failed append, so calls never
// overlap and none follows a failure on the same connection.
func (s *mirrorStream) AppendAsync(recs []*logstore.Record, done func(first uint64, err error)) {
	if len(recs) == 0 {
		done(s.Committed(), nil)
		return
	}
	in := make([]mirror.Incoming, len(recs))
	for i, r := range recs {
		in[i] = mirror.Incoming{Offset: r.Offset, First: r.Offset, Record: r}
	}
	go func() {
		before := s.Committed()
		res, errs := s.l.apply(context.Background(), s.Name(), in)
		for i, r := range res {
			if r == mirror.Refused {
				done(0, fmt.Errorf("mirror offset %d: %w", in[i].Offset, errs[i]))
				return
			}
		}
		next := before
		for i, x := range in {
			if res[i] == mirror.Appended && x.Offset > next {
				s.l.logger.Warn("peat source: offsets the upstream did not send are gap markers (or, in an empty mirror, before its log start)",
					slog.String("stream", s.Name()), slog.Uint64("from", next), slog.Uint64("to", x.Offset))
			}
			next = max(next, x.Offset+1)
		}
		done(in[0].Offset, nil)
	}()
}
