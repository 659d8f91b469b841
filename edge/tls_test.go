package edge

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	dto "github.com/prometheus/client_model/go"

	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// testPKI is a CA, a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files in a temporary directory.
type testPKI struct {
	dir                       string
	caFile, certFile, keyFile string
	clientCert, clientKey     string
	pool                      *x509.CertPool
	client                    tls.Certificate
}

func newTestPKI(tb testing.TB, clientCN string) *testPKI {
	tb.Helper()
	p := &testPKI{dir: tb.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "peat test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(ca)
	p.caFile = p.writePEM(tb, "ca.pem", "CERTIFICATE", caDER)
	issue := func(name string, serial int64, tmpl *x509.Certificate) (string, string, tls.Certificate) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		cf := p.writePEM(tb, name+".pem", "CERTIFICATE", der)
		kf := p.writePEM(tb, name+".key", "EC PRIVATE KEY", kder)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			tb.Fatal(err)
		}
		return cf, kf, pair
	}
	p.certFile, p.keyFile, _ = issue("server", 2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	})
	p.clientCert, p.clientKey, p.client = issue("client", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: clientCN},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	})
	return p
}

func (p *testPKI) writePEM(tb testing.TB, name, typ string, der []byte) string {
	tb.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// dialTLS connects over TLS, with the client certificate when withCert.
func (p *testPKI) dialTLS(tb testing.TB, n *Node, withCert bool) net.Conn {
	tb.Helper()
	cfg := &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1"}
	if withCert {
		cfg.Certificates = []tls.Certificate{p.client}
	}
	conn, err := tls.Dial("tcp", n.MQTTAddr().String(), cfg)
	if err != nil {
		tb.Fatalf("TLS dial: %v", err)
	}
	return conn
}

// tlsNode starts a node with TLS on its MQTT listener: client
// certificates verified when given and taken as the user name, alice by
// password, and an ACL giving the certificate's user its own subtree.
func tlsNode(tb testing.TB, p *testPKI, clientAuth string) *Node {
	tb.Helper()
	dir := tb.TempDir()
	cfg := testConfig(tb)
	cfg.MQTT.TLS = TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.caFile,
		ClientAuth: clientAuth, CertIdentity: true}
	cfg.MQTT.ConnectTimeout = Duration(500 * time.Millisecond)
	cfg.Auth.UsersFile = writeAuthFile(tb, dir, "users", userLine(tb, "alice", "pw-a"))
	cfg.Auth.ACLFile = writeAuthFile(tb, dir, "acl", `
allow readwrite user:sensor-1 devices/sensor-1/#
allow readwrite user:alice    #
`)
	return startNode(tb, cfg)
}

// A TLS listener with certificates as identity: the certificate's CN is
// the user the ACL knows; without one, a password; plain MQTT gets no
// CONNACK; and a client that never completes a handshake is closed by the
// connection guard, which runs in front of TLS.
func TestNode_TLSListener(t *testing.T) {
	p := newTestPKI(t, "sensor-1")
	n := tlsNode(t, p, "request")

	dev := mqtttest.Handshake(t, p.dialTLS(t, n, true), mqtttest.Connect{ClientID: "any-id", Version: 5, Clean: true, Keepalive: 60})
	if dev.Connack.ReasonCode != 0 {
		t.Fatalf("client with a certificate: CONNACK %#x", dev.Connack.ReasonCode)
	}
	dev.Publish("devices/sensor-1/t", 1, 1, "ok")
	if ack := dev.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Errorf("publish to its own subtree: PUBACK %#x", ack.ReasonCode)
	}
	dev.Publish("devices/sensor-2/t", 1, 2, "no")
	if ack := dev.ReadUntil(packets.Puback); ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Errorf("publish to another device's subtree: PUBACK %#x, want 0x87", ack.ReasonCode)
	}

	noCert := mqtttest.Handshake(t, p.dialTLS(t, n, false), mqtttest.Connect{ClientID: "x", Version: 5, Clean: true})
	if noCert.Connack.ReasonCode != packets.ErrBadUsernameOrPassword.Code {
		t.Errorf("no certificate, no password: CONNACK %#x, want 0x86", noCert.Connack.ReasonCode)
	}
	withPw := mqtttest.Handshake(t, p.dialTLS(t, n, false), mqtttest.Connect{ClientID: "y", Version: 4, Clean: true,
		Username: "alice", Password: "pw-a"})
	if withPw.Connack.ReasonCode != 0 {
		t.Errorf("alice by password over TLS: CONNACK %#x", withPw.Connack.ReasonCode)
	}

	plain, err := net.Dial("tcp", n.MQTTAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// A CONNECT in the clear: the TLS server sees no handshake.
	_, _ = plain.Write([]byte{0x10, 0x0c, 0x00, 0x04, 'M', 'Q', 'T', 'T', 0x04, 0x02, 0x00, 0x3c, 0x00, 0x00})
	_ = plain.SetReadDeadline(time.Now().Add(20 * time.Second))
	b := make([]byte, 1)
	if k, _ := plain.Read(b); k == 1 && b[0] == 0x20 {
		t.Error("plain MQTT on the TLS listener got a CONNACK")
	}

	// Counted and logged as a TLS refusal.
	testwait.Eventually(t, "a TLS handshake refusal counted", func() bool {
		var m dto.Metric
		if err := n.mqttMetrics.Closed.WithLabelValues(mqtt.ReasonTLSHandshake).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue() >= 1
	})

	silent, err := net.Dial("tcp", n.MQTTAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_ = silent.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := silent.Read(b); err == nil || isTimeout(err) {
		t.Errorf("a connection that never starts TLS is still open: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Debian's mosquitto_sub and mosquitto_pub against the TLS listener:
// --cafile with a password, and --cert/--key as the identity.
func TestNode_TLSWithMosquittoClients(t *testing.T) {
	subPath, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		t.Fatalf("mosquitto_sub not found (Debian: apt-get install mosquitto-clients): %v", err)
	}
	pubPath, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		t.Fatalf("mosquitto_pub not found (Debian: apt-get install mosquitto-clients): %v", err)
	}
	p := newTestPKI(t, "sensor-1")
	n := tlsNode(t, p, "request")
	host, port, _ := net.SplitHostPort(n.MQTTAddr().String())
	tlsArgs := []string{"-h", host, "-p", port, "--cafile", p.caFile}

	sub := exec.Command(subPath, append(tlsArgs, "-u", "alice", "-P", "pw-a", "-i", "watcher",
		"-t", "devices/#", "-v", "-C", "1", "-W", "30")...)
	out, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sub.Stderr = os.Stderr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Process.Kill(); _ = sub.Wait() })
	testwait.Eventually(t, "a client connected", func() bool { return n.mu.broker.Clients() >= 1 })

	// Without a certificate or a password: refused.
	if b, err := exec.Command(pubPath, append(tlsArgs, "-i", "anon", "-t", "devices/sensor-1/t", "-m", "x")...).CombinedOutput(); err == nil {
		t.Errorf("mosquitto_pub without certificate or password succeeded: %s", b)
	}
	// With the client certificate: the identity sensor-1 may publish there.
	if b, err := exec.Command(pubPath, append(tlsArgs, "--cert", p.clientCert, "--key", p.clientKey,
		"-i", "dev", "-q", "1", "-t", "devices/sensor-1/t", "-m", "21.5")...).CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub with a certificate: %v: %s", err, b)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "devices/sensor-1/t 21.5" {
		t.Fatalf("mosquitto_sub printed %q (%v), want the certificate user's publish", line, err)
	}
}

// Reload (SIGHUP) reads the listener's certificate again: a renewed one is
// served without a restart, and an unreadable one leaves the old in use.
func TestNode_TLSCertificateReload(t *testing.T) {
	p := newTestPKI(t, "sensor-1")
	n := tlsNode(t, p, "request")
	handshake := func(pool *x509.CertPool) error {
		conn, err := tls.Dial("tcp", n.MQTTAddr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err == nil {
			conn.Close()
		}
		return err
	}
	if err := handshake(p.pool); err != nil {
		t.Fatal(err)
	}
	q := newTestPKI(t, "other") // a server certificate from another CA
	for _, f := range [][2]string{{q.certFile, p.certFile}, {q.keyFile, p.keyFile}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := handshake(q.pool); err == nil {
		t.Fatal("the new certificate is served before the reload")
	}
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if err := handshake(q.pool); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	if err := os.WriteFile(p.certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err == nil {
		t.Fatal("Reload of a broken certificate succeeded")
	}
	if err := handshake(q.pool); err != nil {
		t.Fatalf("after a failed reload the renewed certificate is gone: %v", err)
	}
}
