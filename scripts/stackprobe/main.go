// Command stackprobe measures how much goroutine stack plain mochi uses to
// reach its hooks when a client publishes: the floor of Peat's memory per
// connected sensor, since mochi reads each client on a goroutine of its own.
//
//	go run ./scripts/stackprobe
//
// It runs mochi (go.mod's version) in process with an allow-all hook and a
// probe hook, connects one MQTT 3.1.1 client over loopback, publishes one
// QoS 1 message, and prints, at each hook and each time the read goroutine
// asks the connection for more bytes (where it waits while the client is
// silent), the bytes of stack in use below the goroutine's top and the size
// of the stack Go gave it. Go stacks grow by doubling, so a goroutine that
// once needed more than 16 KiB keeps 32 KiB until a GC finds it using less
// than a quarter of that; one that waits with more than 4 KiB in use keeps
// 16 KiB for as long as its client stays connected.
//
// linux/amd64 only: it reads the goroutine's stack bounds from the runtime's
// g structure (getg_amd64.s), which Go does not export.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"
	"unsafe"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// stackUse returns the caller's stack in use (from the stack's top) and the
// stack's size.
//
//go:noinline
func stackUse() (used, size uintptr) {
	var here byte
	lo, hi := stackBounds()
	return hi - uintptr(unsafe.Pointer(&here)), hi - lo
}

type probe struct {
	mochi.HookBase
	out chan string
}

func (p *probe) ID() string { return "stackprobe" }

func (p *probe) Provides(b byte) bool { return b == mochi.OnPacketRead || b == mochi.OnPublish }

func (p *probe) OnPacketRead(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	p.report("OnPacketRead", pk)
	return pk, nil
}

func (p *probe) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	p.report("OnPublish", pk)
	return pk, nil
}

func (p *probe) report(hook string, pk packets.Packet) {
	used, size := stackUse()
	p.out <- fmt.Sprintf("%-12s (packet type %d): %6d bytes of stack in use, stack size %6d", hook, pk.FixedHeader.Type, used, size)
}

// probeConn reports the read goroutine's stack each time mochi reads from
// the connection: where it blocks until the client sends again.
type probeConn struct {
	net.Conn
	out chan<- string
}

func (c probeConn) Read(b []byte) (int, error) {
	used, size := stackUse()
	c.out <- fmt.Sprintf("%-12s (waiting)      : %6d bytes of stack in use, stack size %6d", "conn.Read", used, size)
	return c.Conn.Read(b)
}

type probeListener struct {
	net.Listener
	out chan<- string
}

func (l probeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return probeConn{c, l.out}, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "stackprobe:", err)
		os.Exit(1)
	}
}

func run() error {
	if !supported {
		return fmt.Errorf("runs on linux/amd64 only")
	}
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	p := &probe{out: make(chan string, 16)}
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	if err := srv.AddHook(p, nil); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if err := srv.AddListener(listeners.NewNet("probe", probeListener{ln, p.out})); err != nil {
		ln.Close()
		return err
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	defer srv.Close()

	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	// CONNECT (3.1.1, clean session, keep-alive 60 s, client id "p"), then
	// PUBLISH QoS 1 to "t" with packet id 1 and payload "x".
	connect := []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, 1, 'p'}
	publish := []byte{0x32, 6, 0, 1, 't', 0, 1, 'x'}
	ack := make([]byte, 4)
	for _, step := range []struct {
		name     string
		pk       []byte
		wantType byte
	}{{"CONNECT", connect, 0x20}, {"PUBLISH", publish, 0x40}} {
		if _, err := c.Write(step.pk); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
		if ack[0] != step.wantType {
			return fmt.Errorf("%s: got packet 0x%02x, want 0x%02x", step.name, ack[0], step.wantType)
		}
	}
	// Three hook calls (OnPacketRead for each packet, OnPublish) and three
	// reads: before the CONNECT, before the PUBLISH, and the one that waits
	// for whatever the client sends next.
	timeout := time.After(5 * time.Second)
	for range 6 {
		select {
		case line := <-p.out:
			fmt.Println(line)
		case <-timeout:
			return fmt.Errorf("fewer reports than expected")
		}
	}
	return nil
}
