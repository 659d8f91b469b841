package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mosquittoSub is a running mosquitto_sub -v whose output lines are read
// as they come.
type mosquittoSub struct {
	t     testing.TB
	cmd   *exec.Cmd
	lines chan string // "topic payload"
	done  chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
}

// startMosquittoSub runs mosquitto_sub with args against addr. It is
// stopped at test cleanup if it still runs.
func startMosquittoSub(t testing.TB, addr string, args ...string) *mosquittoSub {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	path, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		t.Fatalf("mosquitto_sub not installed (scripts/test-deps.sh installs mosquitto-clients): %v", err)
	}
	cmd := exec.Command(path, append([]string{"-h", host, "-p", port, "-v"}, args...)...)
	s := &mosquittoSub{t: t, cmd: cmd, lines: make(chan string, 10000), done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &s.mu, w: &s.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto_sub: %v", err)
	}
	go func() { // owned by s: ends when mosquitto_sub closes stdout
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(s.stop)
	return s
}

// stop ends mosquitto_sub with SIGINT (it sends DISCONNECT and exits) and
// waits for it.
func (s *mosquittoSub) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// errors is what mosquitto_sub wrote to stderr.
func (s *mosquittoSub) errors() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// expect reads lines until every one of want has come, failing after a
// minute without progress or if mosquitto_sub exits first.
func (s *mosquittoSub) expect(want map[string]bool) {
	s.t.Helper()
	for len(want) > 0 {
		select {
		case line := <-s.lines:
			delete(want, line)
		case <-s.done:
			for len(s.lines) > 0 {
				delete(want, <-s.lines)
			}
			if len(want) > 0 {
				s.t.Fatalf("mosquitto_sub exited with %d messages missing; stderr:\n%s", len(want), s.errors())
			}
		case <-time.After(time.Minute):
			s.t.Fatalf("%d messages missing after a minute; stderr:\n%s", len(want), s.errors())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// mosquittoPub publishes each of lines as one QoS 1 message to topic.
func mosquittoPub(t testing.TB, addr, topic string, lines []string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-V", "5", "-q", "1", "-t", topic, "-l")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub: %v\n%s", err, out)
	}
}

// holdSubscribeProxy forwards loopback connections to addr, holding each
// client's packets after its CONNECT until the broker has sent that
// connection a PUBLISH. A client resuming a session then meets the broker's
// redeliveries with its SUBSCRIBE, as a client on a slower link or a busier
// machine does, whatever the timing here. It stops at test cleanup.
func holdSubscribeProxy(t testing.TB, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() { // owned by the cleanup above: ends when ln closes
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", addr)
			if err != nil {
				_ = client.Close()
				continue
			}
			published := make(chan struct{})
			var once sync.Once
			wg.Add(2)
			go func() { // client to broker; ends when either side closes
				defer wg.Done()
				defer server.Close()
				r := bufio.NewReader(client)
				if forwardPacket(r, server) != nil { // CONNECT
					return
				}
				<-published
				_, _ = io.Copy(server, r)
			}()
			go func() { // broker to client; ends when either side closes
				defer wg.Done()
				defer client.Close()
				defer once.Do(func() { close(published) })
				r := bufio.NewReader(server)
				for {
					typ, err := r.Peek(1)
					if err != nil || forwardPacket(r, client) != nil {
						return
					}
					if typ[0]>>4 == 3 { // PUBLISH
						once.Do(func() { close(published) })
					}
				}
			}()
			t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
		}
	}()
	return ln.Addr().String()
}

// forwardPacket copies one MQTT packet from r to w.
func forwardPacket(r *bufio.Reader, w io.Writer) error {
	head := make([]byte, 0, 5)
	b, err := r.ReadByte()
	if err != nil {
		return err
	}
	head = append(head, b)
	n, shift := 0, 0
	for {
		b, err := r.ReadByte()
		if err != nil {
			return err
		}
		head = append(head, b)
		n |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			break
		}
		shift += 7
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	_, err = io.CopyN(w, r, int64(n))
	return err
}

// mosquitto_sub -c with a session expiry reconnects to its stored session,
// gets what it missed and subscribes again (packet id 1) while
// redeliveries are in flight: its SUBSCRIBE is granted and every missed
// message arrives (it was once refused with 0x91, and mosquitto_sub
// printed "All subscription requests were denied").
func TestMosquittoSub_ResumesSessionAndResubscribes(t *testing.T) {
	p := startPeat(t, t.TempDir())
	args := []string{"-V", "5", "-c", "-x", "99999", "-q", "1", "-t", "r/+/+", "-i", "resume-sub"}

	sub := startMosquittoSub(t, p.mqttAddr, args...)
	// Subscribed once a message published now arrives.
	deadline := time.Now().Add(time.Minute)
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto_sub never received r/a/hello; stderr:\n%s", sub.errors())
		}
		mosquittoPub(t, p.mqttAddr, "r/a/hello", []string{"hello"})
		select {
		case line := <-sub.lines:
			got = line == "r/a/hello hello"
		case <-time.After(time.Second):
		}
	}
	sub.stop()

	const missed = 200
	lines := make([]string, missed)
	want := map[string]bool{}
	for i := range lines {
		lines[i] = fmt.Sprintf("m%d", i)
		want["r/b/c "+lines[i]] = true
	}
	mosquittoPub(t, p.mqttAddr, "r/b/c", lines)

	sub = startMosquittoSub(t, holdSubscribeProxy(t, p.mqttAddr), args...)
	sub.expect(want)
	mosquittoPub(t, p.mqttAddr, "r/b/c", []string{"live"})
	sub.expect(map[string]bool{"r/b/c live": true})
	if errs := sub.errors(); strings.Contains(errs, "denied") {
		t.Fatalf("mosquitto_sub: %s", errs)
	}
}
