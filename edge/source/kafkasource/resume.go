package kafkasource

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// The position properties a source writes in its records (the source
// framework adds peat-source and peat-origin).
const (
	PropTopic     = source.PropPrefix + "kafka-topic"     // the Kafka topic
	PropPartition = source.PropPrefix + "kafka-partition" // its partition
	PropOffset    = source.PropPrefix + "kafka-offset"    // the record's offset there
	// PropNext, on the last record of each batch, is the next offset of
	// every partition the source reads once the batch is stored:
	// "<topic>/<partition>=<offset>,..." (Kafka topic names have neither
	// '/' nor '=' nor ','). It bounds the scan at a start: the newest
	// record that has it, and the records after it, say everything.
	PropNext = source.PropPrefix + "kafka-next"
)

// TP is one Kafka partition.
type TP struct {
	Topic     string
	Partition int32
}

func (tp TP) String() string { return tp.Topic + "/" + strconv.Itoa(int(tp.Partition)) }

// Positions is the next Kafka offset to read, by partition.
type Positions map[TP]int64

// String encodes p as PropNext's value, partitions in order.
func (p Positions) String() string {
	tps := make([]TP, 0, len(p))
	for tp := range p {
		tps = append(tps, tp)
	}
	slices.SortFunc(tps, func(a, b TP) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	var b strings.Builder
	for i, tp := range tps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(tp.String())
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(p[tp], 10))
	}
	return b.String()
}

// parsePositions reads a PropNext value.
func parsePositions(s string) (Positions, error) {
	p := Positions{}
	if s == "" {
		return p, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		t, n, ok2 := strings.Cut(k, "/")
		if !ok || !ok2 {
			return nil, fmt.Errorf("%q: want <topic>/<partition>=<offset>", part)
		}
		pn, err1 := strconv.ParseInt(n, 10, 32)
		off, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil || off < 0 {
			return nil, fmt.Errorf("%q: want <topic>/<partition>=<offset>", part)
		}
		p[TP{Topic: t, Partition: int32(pn)}] = off
	}
	return p, nil
}

// position is what one record says of the source's position: the
// partition and offset it came from (ok), and PropNext when it has it.
type position struct {
	tp   TP
	off  int64
	ok   bool
	next string
	has  bool // next is set
}

// positionOf reads r's position properties (the last of each name, so
// that nothing before them can pass for them).
func positionOf(r *logstore.Record) position {
	var p position
	var topic, part, off string
	var seen int
	for i := len(r.UserProperties) - 1; i >= 0; i-- {
		u := r.UserProperties[i]
		switch {
		case u.Key == PropTopic && seen&1 == 0:
			topic, seen = u.Value, seen|1
		case u.Key == PropPartition && seen&2 == 0:
			part, seen = u.Value, seen|2
		case u.Key == PropOffset && seen&4 == 0:
			off, seen = u.Value, seen|4
		case u.Key == PropNext && !p.has:
			p.next, p.has = u.Value, true
		}
	}
	if seen != 7 {
		return p
	}
	pn, err1 := strconv.ParseInt(part, 10, 32)
	o, err2 := strconv.ParseInt(off, 10, 64)
	if err1 == nil && err2 == nil && o >= 0 {
		p.tp, p.off, p.ok = TP{Topic: topic, Partition: int32(pn)}, o, true
	}
	return p
}

// positionProps are the position properties of a record from tp at off.
func positionProps(tp TP, off int64) []logstore.UserProperty {
	return []logstore.UserProperty{
		{Key: PropTopic, Value: tp.Topic},
		{Key: PropPartition, Value: strconv.Itoa(int(tp.Partition))},
		{Key: PropOffset, Value: strconv.FormatInt(off, 10)},
	}
}

// Resume reads where the source left off from its records in the log,
// newest first: each record names its partition and offset, and the
// last record of every batch carries the next offset of every partition
// (PropNext). The scan stops at the newest record with PropNext; a
// partition the records after it name is at the newest of those (they
// were stored after it, in the upstream's order). So a start reads about
// one batch, and a record is taken for stored only if it is in the log,
// which is the source's only checkpoint; it reads once every record the
// stream holds is committed (a new leader's predecessor may have left
// some that are not yet). The scan goes down to the
// source's mark at most: the offset of a record with PropNext, set now
// and then once that record is committed, so only a hint where to stop
// (a record below it is never newer than the one at it). scanned is how
// many records of the source it saw; found is false when the log holds
// none of its positions.
func Resume(ctx context.Context, r source.Resume) (pos Positions, scanned int, found bool, err error) {
	if err := r.WaitCommitted(ctx); err != nil {
		return nil, 0, false, err
	}
	from, _, err := r.Mark()
	if err != nil {
		return nil, 0, false, fmt.Errorf("load the mark: %w", err)
	}
	pos = Positions{}
	var base Positions
	var bad error
	err = r.Scan(ctx, from, func(rec *logstore.Record) bool {
		scanned++
		p := positionOf(rec)
		if p.ok {
			if _, newer := pos[p.tp]; !newer {
				pos[p.tp] = p.off + 1
			}
			found = true
		}
		if p.has {
			base, bad = parsePositions(p.next)
			found = true
			return false
		}
		return true
	})
	if err != nil {
		return nil, scanned, false, err
	}
	if bad != nil {
		return nil, scanned, false, fmt.Errorf("%s of a stored record: %w", PropNext, bad)
	}
	for tp, next := range base {
		if cur, ok := pos[tp]; !ok || cur < next {
			pos[tp] = next
		}
	}
	return pos, scanned, found, nil
}
