package mqtt

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// writeRecorder is a net.Conn that records each Write call.
type writeRecorder struct {
	net.Conn
	writes [][]byte
	fail   error
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	if w.fail != nil {
		return 0, w.fail
	}
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

func TestCorkConn(t *testing.T) {
	t.Run("uncorked writes go straight through", func(t *testing.T) {
		rec := &writeRecorder{}
		c := &corkConn{Conn: rec}
		c.Write([]byte("a"))
		c.Write([]byte("b"))
		if len(rec.writes) != 2 {
			t.Fatalf("got %d socket writes, want 2", len(rec.writes))
		}
	})
	t.Run("corked writes leave in one write on uncork", func(t *testing.T) {
		rec := &writeRecorder{}
		c := &corkConn{Conn: rec}
		c.cork()
		for _, p := range []string{"one", "two", "three"} {
			if n, err := c.Write([]byte(p)); err != nil || n != len(p) {
				t.Fatalf("Write(%q) = %d, %v", p, n, err)
			}
		}
		if len(rec.writes) != 0 {
			t.Fatalf("%d socket writes while corked, want 0", len(rec.writes))
		}
		c.cork() // nested: only the outer uncork flushes
		c.uncork()
		if len(rec.writes) != 0 {
			t.Fatal("inner uncork flushed")
		}
		if err := c.uncork(); err != nil {
			t.Fatal(err)
		}
		if len(rec.writes) != 1 || string(rec.writes[0]) != "onetwothree" {
			t.Fatalf("socket writes %q, want one write of onetwothree", rec.writes)
		}
	})
	t.Run("a full cork buffer is written without waiting", func(t *testing.T) {
		rec := &writeRecorder{}
		c := &corkConn{Conn: rec}
		c.cork()
		c.Write(make([]byte, corkLimit+1))
		if len(rec.writes) != 1 {
			t.Fatalf("got %d socket writes, want 1", len(rec.writes))
		}
		c.uncork()
	})
	t.Run("a failed flush is reported and sticks", func(t *testing.T) {
		boom := errors.New("broken pipe")
		rec := &writeRecorder{}
		c := &corkConn{Conn: rec}
		c.cork()
		c.Write([]byte("x"))
		rec.fail = boom
		if err := c.uncork(); !errors.Is(err, boom) {
			t.Fatalf("uncork = %v, want %v", err, boom)
		}
		if _, err := c.Write([]byte("y")); !errors.Is(err, boom) {
			t.Fatalf("Write after failure = %v, want %v", err, boom)
		}
	})
}
