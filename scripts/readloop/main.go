// Command readloop measures what a connection layer of Peat's own would
// save against mochi's: the memory 1,000 publishing sensors hold when each
// client is read by mochi's EstablishConnection, and when it is read by a
// shallow loop that still uses mochi's Client, SendConnack, write loop and
// packet decoding.
//
//	go build -o /tmp/readloop ./scripts/readloop
//	taskset -c 0 /tmp/readloop -mode own &     # or -mode mochi
//	taskset -c 1 go run ./cmd/peat-bench sensors --addr 127.0.0.1:18840 --pid $! \
//	    --connections 1000 --rate 1 --qos 1 --payload 32 --duration 25s --settle 8s
//	curl '127.0.0.1:18841/stats?gc=1'      # before the sensors disconnect
//
// Both modes acknowledge a QoS 1 publish from one shared goroutine, as
// Peat's ingest does, and store nothing. mochi's read goroutine waits for a
// packet with about 5 KB of stack in use (go run ./scripts/stackprobe), so
// its stack never shrinks below 16 KiB; the loop here waits with about 2 KB
// in use, and Go halves its stack to 8 KiB at a collection.
//
// The own mode is a measurement, not a broker: it answers CONNECT and
// QoS 1 PUBLISH and ends at DISCONNECT or a read error. It has no session
// takeover, wills, keep-alive, ACL or $SYS counting, which mochi's
// unexported attachClient does and a real connection layer would have to
// do again.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

func main() {
	mode := flag.String("mode", "mochi", "who reads each client: mochi (EstablishConnection) or own (a shallow loop)")
	mqttAddr := flag.String("mqtt", "127.0.0.1:18840", "MQTT listen address")
	httpAddr := flag.String("http", "127.0.0.1:18841", "address of GET /stats")
	flag.Parse()
	if *mode != "mochi" && *mode != "own" {
		fmt.Fprintf(os.Stderr, "readloop: -mode must be mochi or own, got %q\n", *mode)
		os.Exit(2)
	}
	err := serve(*mode, *mqttAddr, *httpAddr)
	fmt.Fprintln(os.Stderr, "readloop:", err)
	os.Exit(1)
}

// serve runs the broker until it fails; it returns only the failure.
func serve(mode, mqttAddr, httpAddr string) error {
	// Peat's capabilities and buffer sizes (mqtt/config.go defaults).
	caps := mochi.NewDefaultServerCapabilities()
	caps.ReceiveMaximum = 64
	caps.MaximumClientWritesPending = 64
	srv := mochi.New(&mochi.Options{
		Capabilities:            caps,
		ClientNetReadBufferSize: 2048, ClientNetWriteBufferSize: 2048,
		Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
		SysTopicResendInterval: 60,
	})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	a := newAcker()
	if err := srv.AddHook(&takeHook{a: a}, nil); err != nil {
		return err
	}
	http.HandleFunc("/stats", stats)
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	go http.Serve(hl, nil) //nolint:errcheck // ends with the process
	ln, err := net.Listen("tcp", mqttAddr)
	if err != nil {
		return err
	}
	if mode == "mochi" {
		if err := srv.AddListener(listeners.NewNet("mochi", ln)); err != nil {
			return err
		}
		if err := srv.Serve(); err != nil {
			return err
		}
		select {}
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveOwn(srv, a, c)
	}
}

// acker writes PUBACKs from one goroutine, as Peat's ack drainers do off
// the read goroutine.
type acker chan ackReq

type ackReq struct {
	cl *mochi.Client
	id uint16
}

func newAcker() acker {
	a := make(acker, 4096)
	go func() {
		for r := range a {
			_ = r.cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: r.id})
		}
	}()
	return a
}

// takeHook takes QoS 1 publishes in OnPacketRead, as Peat's ingest does,
// and hands mochi a PUBACK with packet id 0, which it ignores.
type takeHook struct {
	mochi.HookBase
	a acker
}

func (h *takeHook) ID() string { return "take" }

func (h *takeHook) Provides(b byte) bool { return b == mochi.OnPacketRead }

func (h *takeHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Qos == 1 {
		h.a <- ackReq{cl, pk.PacketID}
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}}, nil
	}
	return pk, nil
}

// serveOwn reads one client on a shallow goroutine. Packets live on the
// heap and are passed by pointer, so that the frames below the blocking
// read stay small: that is the whole point.
func serveOwn(srv *mochi.Server, a acker, c net.Conn) {
	cl := srv.NewClient(c, "own", "", false)
	go cl.WriteLoop()
	defer cl.Stop(nil)
	r := bufio.NewReaderSize(c, 512)
	pk := new(packets.Packet)
	if err := readPacket(r, 4, pk); err != nil || pk.FixedHeader.Type != packets.Connect {
		return
	}
	if !connect(srv, cl, pk) {
		return
	}
	defer srv.Clients.Delete(cl.ID)
	for readOne(cl, r, a) == nil {
	}
}

//go:noinline
func connect(srv *mochi.Server, cl *mochi.Client, pk *packets.Packet) bool {
	cl.ParseConnect("own", *pk)
	srv.Clients.Add(cl)
	return srv.SendConnack(cl, packets.CodeSuccess, false, nil) == nil
}

var errDisconnect = errors.New("disconnect")

//go:noinline
func readOne(cl *mochi.Client, r *bufio.Reader, a acker) error {
	pk := new(packets.Packet)
	if err := readPacket(r, cl.Properties.ProtocolVersion, pk); err != nil {
		return err
	}
	switch {
	case pk.FixedHeader.Type == packets.Disconnect:
		return errDisconnect
	case pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Qos == 1:
		a <- ackReq{cl, pk.PacketID}
	}
	return nil
}

// readPacket reads and decodes one CONNECT or PUBLISH into pk; other packet
// types are read and left undecoded.
func readPacket(r *bufio.Reader, version byte, pk *packets.Packet) error {
	b, err := r.ReadByte()
	if err != nil {
		return err
	}
	if err := pk.FixedHeader.Decode(b); err != nil {
		return err
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		return err
	}
	pk.FixedHeader.Remaining = n
	pk.ProtocolVersion = version
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	switch pk.FixedHeader.Type {
	case packets.Connect:
		return pk.ConnectDecode(body)
	case packets.Publish:
		return pk.PublishDecode(body)
	}
	return nil
}

// stats prints the stacks, heap and goroutines of the process, and its
// anonymous resident memory; with ?gc=1 after three collections, so that
// stacks have been shrunk and freed pages returned.
func stats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("gc") != "" {
		for range 3 {
			runtime.GC()
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(w, "stack_inuse_mb %.1f\nheap_inuse_mb %.1f\ngoroutines %d\n",
		float64(ms.StackInuse)/1e6, float64(ms.HeapInuse)/1e6, runtime.NumGoroutine())
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "RssAnon:") {
				fmt.Fprintln(w, strings.Join(strings.Fields(l), " "))
			}
		}
	}
}
