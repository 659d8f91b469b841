// Package sinktest holds test fixtures for sinks: a real Mosquitto
// started on a free loopback port, a fault proxy (connection reset, black
// hole, delay) that also counts the QoS 1 PUBLISHes in flight through it,
// and a subscriber that keeps what the upstream got.
package sinktest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
)

// StartMosquitto runs mosquitto (MosquittoBinary) on a free loopback port with
// extra config lines (global options such as max_inflight_messages), and
// returns its address. It is stopped at cleanup.
func StartMosquitto(t testing.TB, extra ...string) string {
	t.Helper()
	return runMosquitto(t, []string{""}, extra)[0]
}

// StartMosquittoTLS runs mosquitto with a TLS listener (certFile, keyFile)
// and a plain one beside it, and returns both addresses.
func StartMosquittoTLS(t testing.TB, certFile, keyFile string) (tlsAddr, plainAddr string) {
	t.Helper()
	addrs := runMosquitto(t, []string{"certfile " + certFile + "\nkeyfile " + keyFile, ""}, nil)
	return addrs[0], addrs[1]
}

// runMosquitto starts mosquitto with one listener per entry of listeners
// (each entry: that listener's option lines) and returns their addresses.
func runMosquitto(t testing.TB, listeners []string, extra []string) []string {
	t.Helper()
	bin := MosquittoBinary(t)
	conf := "allow_anonymous true\npersistence false\nmax_queued_messages 0\n"
	if os.Geteuid() == 0 {
		// Run as root, mosquitto would switch to the user mosquitto, who
		// cannot read the test's private temporary files.
		conf += "user root\n"
	}
	for _, l := range extra {
		conf += l + "\n"
	}
	var addrs []string
	for _, opts := range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		_, port, _ := net.SplitHostPort(addr)
		conf += "listener " + port + " 127.0.0.1\n"
		if opts != "" {
			conf += opts + "\n"
		}
		addrs = append(addrs, addr)
	}
	path := filepath.Join(t.TempDir(), "mosquitto.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path)
	dieWithParent(cmd)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		for {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				_ = c.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("mosquitto exited: %s", out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("mosquitto does not listen on %s: %s", addr, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return addrs
}

// MosquittoBinary is the mosquitto the tests run: $PEAT_MOSQUITTO, else
// the one scripts/mosquitto-current.sh built (scripts/.mosquitto), else
// the system's.
func MosquittoBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("PEAT_MOSQUITTO"); bin != "" {
		return bin
	}
	if dir, err := os.Getwd(); err == nil {
		for ; ; dir = filepath.Dir(dir) {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				if bin := filepath.Join(dir, "scripts", ".mosquitto", "mosquitto"); isExecutable(bin) {
					return bin
				}
				break
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	if bin, err := exec.LookPath("mosquitto"); err == nil {
		return bin
	}
	if isExecutable("/usr/sbin/mosquitto") {
		return "/usr/sbin/mosquitto"
	}
	t.Fatal("mosquitto not installed (scripts/test-deps.sh installs it)")
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// RequireReceiveMaximum fails t unless the mosquitto it runs keeps a
// client's Receive Maximum [MQTT-3.3.4-9]. 2.0.11 (Debian bookworm's)
// moves up to a window of queued messages into flight per PUBACK
// (mosquitto's bug #2306, fixed in 2.0.13): a test that bounds what is
// repeated after a lost connection cannot hold against it.
func RequireReceiveMaximum(t testing.TB) {
	t.Helper()
	bin := MosquittoBinary(t)
	out, _ := exec.Command(bin, "-h").Output()
	m := regexp.MustCompile(`mosquitto version (\d+)\.(\d+)\.(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("%s -h names no version:\n%s", bin, out)
	}
	v := [3]int{}
	for i := range v {
		v[i], _ = strconv.Atoi(string(m[i+1]))
	}
	if v[0] < 2 || v[0] == 2 && v[1] == 0 && v[2] < 13 {
		t.Fatalf("%s is mosquitto %d.%d.%d, which sends beyond the Receive Maximum "+
			"after a PUBACK; this test needs 2.0.13 or newer (scripts/mosquitto-current.sh builds one)", bin, v[0], v[1], v[2])
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// collector is an MQTT 3.1.1 subscriber on the upstream that keeps every
// payload it gets, in order.
type Collector struct {
	client paho.Client
	mu     sync.Mutex
	got    []string
	topics []string
}

func NewCollector(t testing.TB, addr, filter string) *Collector {
	t.Helper()
	c := &Collector{}
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("collector-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))).
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	c.client = paho.NewClient(opts)
	if tok := c.client.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("collector connect: %v", tok.Error())
	}
	tok := c.client.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
		c.mu.Lock()
		c.got = append(c.got, string(m.Payload()))
		c.topics = append(c.topics, m.Topic())
		c.mu.Unlock()
	})
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("collector subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { c.client.Disconnect(0) })
	return c
}

func (c *Collector) Payloads() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// Topics are the topics of what arrived, in order.
func (c *Collector) Topics() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.topics...)
}

// HasOffsets reports whether every offset below n has arrived, for a sink
// whose records carry their offset as payload. Wait for this, not for n
// messages: with repeats, n messages come before the last offsets do.
func (c *Collector) HasOffsets(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make([]bool, n)
	distinct := 0
	for _, p := range c.got {
		if off, err := strconv.Atoi(p); err == nil && off >= 0 && off < n && !seen[off] {
			seen[off] = true
			distinct++
		}
	}
	return distinct == n
}

// Fault modes of the proxy.
const (
	ModePass      int32 = iota
	ModeReset           // connections are reset, new ones too
	ModeBlackHole       // bytes vanish both ways; sockets stay open
	ModeDelay           // every chunk waits proxy.delay
)

// proxy sits between the sink and the upstream and injects faults. It
// also parses the MQTT packets passing through, to count QoS 1 PUBLISHes
// not yet acknowledged.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	mode   atomic.Int32
	delay  time.Duration

	// MaxOutstanding is the most QoS 1 PUBLISHes one connection had
	// without their PUBACK.
	MaxOutstanding atomic.Int64
	Conns          atomic.Int64 // connections accepted

	mu    sync.Mutex
	pairs map[*pair]struct{}
	wg    sync.WaitGroup
}

type pair struct {
	client, upstream net.Conn
	tainted          atomic.Bool // bytes were dropped: the MQTT stream is broken
	outstanding      atomic.Int64
}

func NewProxy(t testing.TB, target string, delay time.Duration) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: target, delay: delay, pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll(false)
		p.wg.Wait()
	})
	return p
}

func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// setMode switches the fault. Entering reset resets every connection;
// leaving a black hole closes the connections whose bytes were dropped.
func (p *Proxy) SetMode(m int32) {
	old := p.mode.Swap(m)
	switch {
	case m == ModeReset:
		p.closeAll(true)
	case old == ModeBlackHole && m != ModeBlackHole:
		p.mu.Lock()
		for pr := range p.pairs {
			if pr.tainted.Load() {
				_ = pr.client.Close()
				_ = pr.upstream.Close()
			}
		}
		p.mu.Unlock()
	}
}

func (p *Proxy) closeAll(reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		if reset {
			if tc, ok := pr.client.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
		_ = pr.client.Close()
		_ = pr.upstream.Close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.Conns.Add(1)
		if p.mode.Load() == ModeReset {
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c, upstream: u}
		p.mu.Lock()
		p.pairs[pr] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pr, c, u, true)
		go p.pipe(pr, u, c, false)
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies from src to dst under the current mode; toUpstream tells
// the direction, for counting.
func (p *Proxy) pipe(pr *pair, src, dst net.Conn, toUpstream bool) {
	defer p.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		p.mu.Lock()
		delete(p.pairs, pr)
		p.mu.Unlock()
	}()
	q := make(chan chunk, 4096)
	writerDone := make(chan struct{})
	go func() { // owned by pipe: ends when q closes or a write fails
		defer close(writerDone)
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(ch.b); err != nil {
				_ = src.Close()
				for range q {
				}
				return
			}
		}
	}()
	defer func() { close(q); <-writerDone }()
	var sc scanner
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			mode := p.mode.Load()
			if mode == ModeBlackHole || pr.tainted.Load() {
				pr.tainted.Store(true)
			} else {
				b := append([]byte(nil), buf[:n]...)
				sc.feed(b, func(typ byte) { p.count(pr, typ, toUpstream) })
				due := time.Now()
				if mode == ModeDelay {
					due = due.Add(p.delay)
				}
				q <- chunk{b: b, due: due}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) count(pr *pair, typ byte, toUpstream bool) {
	switch {
	case toUpstream && typ == packets.Publish:
		n := pr.outstanding.Add(1)
		for {
			m := p.MaxOutstanding.Load()
			if n <= m || p.MaxOutstanding.CompareAndSwap(m, n) {
				break
			}
		}
	case !toUpstream && typ == packets.Puback:
		pr.outstanding.Add(-1)
	}
}

// scanner finds packet boundaries in one direction of an MQTT stream.
type scanner struct{ buf []byte }

func (s *scanner) feed(b []byte, found func(typ byte)) {
	s.buf = append(s.buf, b...)
	for {
		if len(s.buf) < 2 {
			return
		}
		n, mult, i := 0, 1, 1
		for ; ; i++ {
			if i >= len(s.buf) || i > 4 {
				return
			}
			n += int(s.buf[i]&127) * mult
			mult *= 128
			if s.buf[i]&128 == 0 {
				break
			}
		}
		total := i + 1 + n
		if len(s.buf) < total {
			return
		}
		found(s.buf[0] >> 4)
		s.buf = s.buf[total:]
	}
}

// CheckInOrder checks what an upstream got from a sink whose records carry
// their offset as payload: every offset below n, first arrivals in order,
// and every repeat a rewind of at most window. It returns the repeats.
func CheckInOrder(t testing.TB, got []string, n, window int) (dups int) {
	t.Helper()
	seen := make([]bool, n)
	highest := -1
	for i, p := range got {
		off, err := strconv.Atoi(p)
		if err != nil || off < 0 || off >= n {
			t.Fatalf("upstream message %d: payload %q is no offset below %d", i, p, n)
		}
		switch {
		case off == highest+1:
			highest = off
		case off > highest+1:
			t.Fatalf("upstream message %d: offset %d after %d: a gap", i, off, highest)
		default:
			if highest-off >= window {
				t.Fatalf("upstream message %d: offset %d again after %d: a rewind beyond the window %d", i, off, highest, window)
			}
			dups++
		}
		seen[off] = true
	}
	for off, ok := range seen {
		if !ok {
			t.Fatalf("offset %d never reached the upstream (%d messages)", off, len(got))
		}
	}
	return dups
}

// WaitFor polls cond until it holds, failing after a generous deadline.
func WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", within, what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TLSFiles writes a fresh CA and a server certificate for 127.0.0.1 and
// localhost into dir, and returns their paths (PEM).
func TLSFiles(t testing.TB, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "peat test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}
