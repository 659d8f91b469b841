package edge

import (
	"crypto/tls"
	"net"
	"testing"
)

// A TLS 1.2 client offering only CBC suites gets no handshake from the
// MQTT or the HTTP listener; one offering an AEAD suite does. (The site's
// own TLS is 1.3 only, where every suite is AEAD.)
func TestNode_TLS12OnlyAEADSuites(t *testing.T) {
	p := newTestPKI(t, "unused")
	cfg := testConfig(t)
	cfg.MQTT.TLS = TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile}
	cfg.HTTP.TLS = HTTPTLSConfig{CertFile: p.certFile, KeyFile: p.keyFile}
	n := startNode(t, cfg)
	handshake := func(addr net.Addr, suite uint16) error {
		conn, err := tls.Dial("tcp", addr.String(), &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1",
			MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}})
		if err == nil {
			conn.Close()
		}
		return err
	}
	for name, addr := range map[string]net.Addr{"mqtt": n.MQTTAddr(), "http": n.HTTPAddr()} {
		for _, s := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA} {
			if err := handshake(addr, s); err == nil {
				t.Errorf("%s: a TLS 1.2 handshake with %s succeeded", name, tls.CipherSuiteName(s))
			}
		}
		for _, s := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256} {
			if err := handshake(addr, s); err != nil {
				t.Errorf("%s: TLS 1.2 with %s: %v", name, tls.CipherSuiteName(s), err)
			}
		}
	}
}
