package faultnet

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// pair dials b from a and returns both ends.
func pair(t *testing.T, n *Network, a, b string) (client, server net.Conn) {
	t.Helper()
	ln, err := n.Listen(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			acc <- c
		}
		close(acc)
	}()
	client, err = n.Dialer(a)(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func readN(t *testing.T, c net.Conn, n int, within time.Duration) (string, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return string(b), err
}

func TestNetwork_Delivers(t *testing.T) {
	n := New()
	c, s := pair(t, n, "a", "b")
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if got, err := readN(t, s, 5, 10*time.Second); err != nil || got != "hello" {
		t.Fatalf("server read %q, %v", got, err)
	}
	s.Write([]byte("back"))
	if got, err := readN(t, c, 4, 10*time.Second); err != nil || got != "back" {
		t.Fatalf("client read %q, %v", got, err)
	}
	if c.RemoteAddr().String() != "b" || s.LocalAddr().String() != "b" {
		t.Fatalf("addresses %v %v", c.RemoteAddr(), s.LocalAddr())
	}
	c.Close()
	if _, err := readN(t, s, 1, 10*time.Second); err != io.EOF {
		t.Fatalf("read after the peer closed = %v, want EOF", err)
	}
}

func TestNetwork_DeadlineAndNoListener(t *testing.T) {
	n := New()
	_, s := pair(t, n, "a", "b")
	if _, err := readN(t, s, 1, 50*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent = %v, want a deadline error", err)
	}
	var ne net.Error
	if _, err := readN(t, s, 1, time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("deadline error %v is not a net.Error timeout", err)
	}
	if _, err := n.Dialer("a")(context.Background(), "nobody"); !errors.Is(err, ErrRefused) {
		t.Fatalf("dial to no listener = %v, want ErrRefused", err)
	}
}

func TestNetwork_Delay(t *testing.T) {
	n := New()
	c, s := pair(t, n, "a", "b")
	n.Delay("a", "b", 300*time.Millisecond)
	start := time.Now()
	c.Write([]byte("x"))
	n.Delay("a", "b", 0)
	c.Write([]byte("y")) // not before x: order is kept
	if _, err := readN(t, s, 1, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a delayed byte arrived early: %v", err)
	}
	if got, err := readN(t, s, 2, 10*time.Second); err != nil || got != "xy" {
		t.Fatalf("read %q, %v; want xy", got, err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("the delayed byte came before its delay")
	}
}

func TestNetwork_CutHoldsUntilHeal(t *testing.T) {
	n := New()
	c, s := pair(t, n, "a", "b")
	n.Cut("a", "b")
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatalf("write into a cut = %v, want it accepted", err)
	}
	if _, err := readN(t, s, 4, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read across a cut = %v, want nothing", err)
	}
	s.Write([]byte("ok")) // the other way still flows
	if got, err := readN(t, c, 2, 10*time.Second); err != nil || got != "ok" {
		t.Fatalf("reverse read %q, %v", got, err)
	}
	go func() { time.Sleep(50 * time.Millisecond); n.Heal("a", "b") }()
	if got, err := readN(t, s, 4, 10*time.Second); err != nil || got != "held" {
		t.Fatalf("read after heal %q, %v", got, err)
	}
}

func TestNetwork_PartitionAndDrop(t *testing.T) {
	n := New()
	c, s := pair(t, n, "a", "b")
	n.Partition("a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Dialer("a")(ctx, "b"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial across a partition = %v, want ErrUnreachable", err)
	}
	n.Heal("a", "b")
	n.Drop("a", "b")
	if _, err := readN(t, s, 1, 10*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a dropped connection = %v, want a reset", err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write on a dropped connection succeeded")
	}
}

// A stall holds what the connections open at the time carry, that way
// only, and until its end; a connection dialled during it flows at once.
func TestNetwork_StallHoldsOpenConnectionsOnly(t *testing.T) {
	n := New()
	ln, err := n.Listen("b")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() (client, server net.Conn) {
		t.Helper()
		c, err := n.Dialer("a")(context.Background(), "b")
		if err != nil {
			t.Fatal(err)
		}
		s := <-accepted
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	c, s := dial()
	start := time.Now()
	c.Write([]byte("before"))
	n.Stall("a", "b", 500*time.Millisecond)
	c.Write([]byte("during"))
	if _, err := readN(t, s, 6, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a stalled connection = %v, want nothing", err)
	}
	s.Write([]byte("ok")) // the other way is not stalled
	if got, err := readN(t, c, 2, 10*time.Second); err != nil || got != "ok" {
		t.Fatalf("reverse read %q, %v", got, err)
	}
	fc, fs := dial() // dialled during the stall: not held
	fc.Write([]byte("fresh"))
	if got, err := readN(t, fs, 5, 300*time.Millisecond); err != nil || got != "fresh" {
		t.Fatalf("read on a connection dialled during the stall: %q, %v", got, err)
	}
	c.Close()
	if got, err := readN(t, s, 12, 10*time.Second); err != nil || got != "beforeduring" {
		t.Fatalf("read after the stall %q, %v", got, err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("stalled bytes came after %v, before the stall's end", d)
	}
	if _, err := readN(t, s, 1, 10*time.Second); err != io.EOF {
		t.Fatalf("read after the peer closed = %v, want EOF", err)
	}
}
