package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver, registered as "sqlite"
)

const schema = `
CREATE TABLE IF NOT EXISTS aggregates (
	topic TEXT PRIMARY KEY,
	count INTEGER NOT NULL,
	sum   REAL NOT NULL,
	min   REAL NOT NULL,
	max   REAL NOT NULL
);
-- One row: the filter this database aggregates and the offset of the last
-- record applied to it. It is written in the same transaction as the
-- aggregates, so the two never disagree.
CREATE TABLE IF NOT EXISTS position (
	id          INTEGER PRIMARY KEY CHECK (id = 1),
	filter      TEXT NOT NULL,
	last_offset INTEGER NOT NULL
);`

// Aggregate is what the store keeps per topic.
type Aggregate struct {
	Count         int64
	Sum, Min, Max float64
}

// Store holds the aggregates and the position in one SQLite database.
type Store struct {
	db     *sql.DB
	filter string
	last   int64 // offset of the last applied record, -1 for none
}

// OpenStore opens (creating if needed) the database at path for filter.
//
// WAL with synchronous=NORMAL does not fsync each commit: a power loss may
// roll back the last few transactions, but never half of one, so the
// aggregates and the position roll back together and those records are
// simply replayed. A kill -9 loses nothing that was committed.
func OpenStore(path, filter string) (*Store, error) {
	db, err := sql.Open("sqlite", path+"?_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=5000")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serialises writes anyway
	s := &Store{db: db, filter: filter, last: -1}
	if err := s.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) load() error {
	if _, err := s.db.Exec(schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	var filter string
	err := s.db.QueryRow(`SELECT filter, last_offset FROM position WHERE id = 1`).Scan(&filter, &s.last)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read position: %w", err)
	case filter != s.filter:
		return fmt.Errorf("it holds the aggregates of filter %q, not %q: use another --db", filter, s.filter)
	}
	return nil
}

// Resume is the <from> to replay from: the offset after the last applied
// record, or earliest for an empty database.
func (s *Store) Resume() string {
	if s.last < 0 {
		return "earliest"
	}
	return strconv.FormatInt(s.last+1, 10)
}

// Apply adds the record at offset to its topic's aggregate and stores
// offset as the position, in one transaction. A record at or below the
// position was applied already and is skipped, so redelivery is harmless.
// A payload that is not a decimal number only moves the position; Apply
// reports it with ErrNotNumber after committing.
func (s *Store) Apply(ctx context.Context, offset int64, topic string, payload []byte) error {
	if offset <= s.last {
		return nil
	}
	v, parseErr := strconv.ParseFloat(strings.TrimSpace(string(payload)), 64)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("apply offset %d: %w", offset, err)
	}
	defer tx.Rollback() // a no-op after Commit
	if parseErr == nil {
		_, err = tx.ExecContext(ctx, `
			INSERT INTO aggregates (topic, count, sum, min, max) VALUES (?1, 1, ?2, ?2, ?2)
			ON CONFLICT (topic) DO UPDATE SET
				count = count + 1,
				sum   = sum + excluded.sum,
				min   = MIN(min, excluded.min),
				max   = MAX(max, excluded.max)`, topic, v)
		if err != nil {
			return fmt.Errorf("apply offset %d to %s: %w", offset, topic, err)
		}
	}
	_, err = tx.ExecContext(ctx, `
		INSERT INTO position (id, filter, last_offset) VALUES (1, ?1, ?2)
		ON CONFLICT (id) DO UPDATE SET last_offset = excluded.last_offset`, s.filter, offset)
	if err != nil {
		return fmt.Errorf("store position %d: %w", offset, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit offset %d: %w", offset, err)
	}
	s.last = offset
	if parseErr != nil {
		return fmt.Errorf("%w: offset %d on %s: %q", ErrNotNumber, offset, topic, payload)
	}
	return nil
}

// ErrNotNumber reports a record skipped because its payload is not a number.
var ErrNotNumber = errors.New("payload is not a decimal number")

// Aggregates reads every topic's aggregate.
func (s *Store) Aggregates(ctx context.Context) (map[string]Aggregate, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT topic, count, sum, min, max FROM aggregates`)
	if err != nil {
		return nil, fmt.Errorf("read aggregates: %w", err)
	}
	defer rows.Close()
	out := make(map[string]Aggregate)
	for rows.Next() {
		var topic string
		var a Aggregate
		if err := rows.Scan(&topic, &a.Count, &a.Sum, &a.Min, &a.Max); err != nil {
			return nil, fmt.Errorf("read aggregates: %w", err)
		}
		out[topic] = a
	}
	return out, rows.Err()
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }
