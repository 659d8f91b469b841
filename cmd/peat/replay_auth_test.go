package main

import (
	"bytes"
	"context"
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

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// selfSigned writes a self-signed certificate for 127.0.0.1, which is its
// own CA, and its key.
func selfSigned(tb testing.TB, dir string) (certFile, keyFile string) {
	tb.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return certFile, keyFile
}

// peat replay against a node with users, an ACL and TLS: --user with
// $PEAT_PASSWORD and --cafile get the records the ACL lets it read; a
// wrong password is refused with exit status 1.
func TestReplay_WithUserAndTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	users := filepath.Join(dir, "users")
	setPassword(t, users, "ops", "pw-ops")
	acl := filepath.Join(dir, "acl")
	if err := os.WriteFile(acl, []byte("deny read * sensors/secret\nallow readwrite user:ops #\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "peat.yaml")
	yaml := "auth: {users_file: " + users + ", acl_file: " + acl + "}\n" +
		"mqtt: {tls: {cert_file: " + cert + ", key_file: " + key + "}}\n"
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, t.TempDir(), "--config", conf)

	pool := x509.NewCertPool()
	pemBytes, _ := os.ReadFile(cert)
	pool.AppendCertsFromPEM(pemBytes)
	conn, err := tlsDial(p.mqttAddr, pool)
	if err != nil {
		t.Fatal(err)
	}
	pub := mqtttest.Handshake(t, conn, mqtttest.Connect{ClientID: "pub", Version: 5, Clean: true, Keepalive: 60,
		Username: "ops", Password: "pw-ops"})
	if pub.Connack.ReasonCode != 0 {
		t.Fatalf("publisher CONNACK %#x", pub.Connack.ReasonCode)
	}
	for i, topic := range []string{"sensors/a", "sensors/secret", "sensors/b"} {
		pub.Publish(topic, 1, uint16(i+1), "v")
		pub.ReadUntil(0x04) // PUBACK
	}

	run := func(pw string) (int, string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binPath, "replay", "--broker", p.mqttAddr, "--user", "ops",
			"--cafile", cert, "--idle", "0", "sensors/#")
		cmd.Env = append(cleanEnv(), "PEAT_PASSWORD="+pw)
		var out, errs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errs
		_ = cmd.Run()
		return cmd.ProcessState.ExitCode(), out.String(), errs.String()
	}
	code, out, errs := run("pw-ops")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], " sensors/a ") || !strings.Contains(lines[1], " sensors/b ") {
		t.Fatalf("printed:\n%s\nwant sensors/a and sensors/b only (the ACL denies sensors/secret)", out)
	}
	if code, _, errs := run("wrong"); code != 1 || !strings.Contains(errs, "0x86") {
		t.Errorf("wrong password: exit %d, stderr %q; want 1 and the reason code 0x86", code, errs)
	}
}

func tlsDial(addr string, pool *x509.CertPool) (net.Conn, error) {
	return tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
}

// The operator's commands against a node whose API asks for a token over
// TLS: PEAT_TOKEN and PEAT_CAFILE get the answer; without the token the
// node refuses and the command says so.
func TestOps_WithTokenAndTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens")
	var out, errs bytes.Buffer
	if code := token([]string{tokens, "ops", "read"}, &out, &errs); code != exitOK {
		t.Fatalf("peat token: %s", errs.String())
	}
	tok := strings.TrimSpace(out.String())
	conf := filepath.Join(dir, "peat.yaml")
	yaml := "http: {tokens_file: " + tokens + ", tls: {cert_file: " + cert + ", key_file: " + key + "}}\n"
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, t.TempDir(), "--config", conf)
	run := func(env ...string) (int, string) {
		cmd := exec.Command(binPath, "streams", "--http", "https://"+p.httpAddr)
		cmd.Env = append(cleanEnv(), env...)
		b, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(b)
	}
	if code, out := run("PEAT_TOKEN="+tok, "PEAT_CAFILE="+cert); code != 0 || !strings.Contains(out, "default") {
		t.Fatalf("with token: exit %d:\n%s", code, out)
	}
	if code, out := run("PEAT_CAFILE=" + cert); code == 0 || !strings.Contains(out, "401") {
		t.Fatalf("without token: exit %d:\n%s; want a failure naming 401", code, out)
	}
}
