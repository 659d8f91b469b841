package edge

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"

	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/mqtt"
)

// AuthConfig is who may connect and what they may do (edge/auth).
type AuthConfig struct {
	// UsersFile holds "name:hash" lines (`peat passwd`, or Mosquitto's
	// mosquitto_passwd); empty: user names are not checked.
	UsersFile string `yaml:"users_file"`
	// ACLFile holds the topic rules; empty: a client let in may do
	// everything.
	ACLFile string `yaml:"acl_file"`
	// AllowAnonymous lets in clients without a user name (and, without a
	// users file, with any). Needed to serve the network without users.
	AllowAnonymous bool `yaml:"allow_anonymous"`
	// MaxConcurrentHashes bounds the password hashes computed at once;
	// 0 is one less than the CPUs, at least 1.
	MaxConcurrentHashes int `yaml:"max_concurrent_hashes"`
}

// TLSConfig is a listener's TLS.
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile holds the CAs that sign client certificates.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is none, request (verify a certificate if one is given)
	// or require.
	ClientAuth string `yaml:"client_auth"`
	// CertIdentity makes a client certificate's CN (else its first SAN)
	// the client's user name, with no password.
	CertIdentity bool `yaml:"cert_identity"`
}

// enabled reports whether the listener serves TLS.
func (t TLSConfig) enabled() bool { return t.CertFile != "" }

// hasAuth reports whether clients of listener l are authenticated: by
// password, or by a certificate every client must present.
func (c Config) hasAuth(l mqttListener) bool {
	return c.Auth.UsersFile != "" || (l.tls.CertIdentity && l.tls.ClientAuth == "require")
}

// certIdentity reports whether some listener takes user names from
// client certificates.
func (c Config) certIdentity() bool {
	for _, l := range c.mqttListeners() {
		if l.tls.CertIdentity {
			return true
		}
	}
	return false
}

// validateSecurity adds the problems of the auth and TLS fields, and
// refuses a listener reachable from the network that would let anyone in
// or carry passwords in the clear, unless the config says so explicitly.
func (c Config) validateSecurity(add func(path, format string, args ...any)) {
	c.validateHTTPSecurity(add)
	if c.Auth.MaxConcurrentHashes < 0 {
		add("auth.max_concurrent_hashes", "must be 0 (automatic) or positive, got %d", c.Auth.MaxConcurrentHashes)
	}
	anyAuth := false
	for _, l := range c.mqttListeners() {
		c.validateListenerSecurity(l, add)
		anyAuth = anyAuth || c.hasAuth(l)
	}
	if c.Auth.ACLFile != "" && !anyAuth && !c.Auth.AllowAnonymous {
		add("auth.acl_file", "without auth.users_file every client is anonymous, and anonymous clients are refused: "+
			"set auth.users_file, or auth.allow_anonymous: true to apply the ACL to anonymous clients")
	}
}

// validateListenerSecurity checks one listener's TLS fields and the
// fail-safe rules: a listener reachable from the network needs auth and
// TLS, or an explicit opt-out.
func (c Config) validateListenerSecurity(l mqttListener, add func(path, format string, args ...any)) {
	t := l.tls
	switch t.ClientAuth {
	case "", "none", "request", "require":
	default:
		add(l.field("tls.client_auth"), "must be none, request or require, got %q", t.ClientAuth)
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		add(l.field("tls"), "cert_file and key_file go together")
	}
	if t.ClientCAFile != "" && !t.enabled() {
		add(l.field("tls.client_ca_file"), "needs %s and key_file (TLS)", l.field("tls.cert_file"))
	}
	if (t.ClientAuth == "request" || t.ClientAuth == "require") && t.ClientCAFile == "" {
		add(l.field("tls.client_auth"), "%s needs %s to verify client certificates", t.ClientAuth, l.field("tls.client_ca_file"))
	}
	if t.CertIdentity && (t.ClientAuth == "" || t.ClientAuth == "none") {
		add(l.field("tls.cert_identity"), "needs %s request or require", l.field("tls.client_auth"))
	}
	if l.listen == "" || checkHostPort(l.listen) != "" || loopback(l.listen) {
		return
	}
	if !c.hasAuth(l) && !c.Auth.AllowAnonymous {
		add(l.field("listen"), "%q is reachable from the network and nobody is authenticated: set auth.users_file "+
			"(write it with `peat passwd`), or set auth.allow_anonymous: true to let any client in", l.listen)
	}
	if !t.enabled() && !l.allowPlaintext {
		add(l.field("listen"), "%q is reachable from the network without TLS: set %s and "+
			"%s, or set %s: true to send passwords and messages in the clear",
			l.listen, l.field("tls.cert_file"), l.field("tls.key_file"), l.field("allow_plaintext"))
	}
}

// loopback reports whether addr (host:port) binds only the loopback
// interface. An empty host, a wildcard address or a name other than
// localhost counts as reachable from the network.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newAuth reads the users and ACL files, when any auth is configured: nil
// when the broker lets everyone do everything (no users file, no ACL, no
// certificate identity). A file that cannot be read or holds a bad line
// fails the start, naming the field.
func (c Config) newAuth() (*auth.Auth, error) {
	if c.Auth.UsersFile == "" && c.Auth.ACLFile == "" && !c.certIdentity() {
		return nil, nil
	}
	a, err := auth.New(auth.Config{
		UsersFile:           c.Auth.UsersFile,
		ACLFile:             c.Auth.ACLFile,
		AllowAnonymous:      c.Auth.AllowAnonymous,
		CertIdentity:        c.certIdentity(),
		MaxConcurrentHashes: c.Auth.MaxConcurrentHashes,
	})
	if err != nil {
		return nil, fmt.Errorf("auth (auth.users_file, auth.acl_file): %w", err)
	}
	return a, nil
}

// mqttAuth adapts edge/auth to the broker's Auth interface. certIdentity
// names the listeners whose client certificates name users: a
// certificate shown to another listener identifies nobody.
type mqttAuth struct {
	a            *auth.Auth
	certIdentity map[string]bool
}

var _ mqtt.Auth = mqttAuth{}

func (m mqttAuth) Authenticate(l mqtt.Login) (mqtt.Access, string, bool) {
	if !m.certIdentity[l.Listener] {
		l.CertNames = nil
	}
	acc, why, ok := m.a.Authenticate(l.ClientID, l.Username, l.Password, l.CertNames)
	if !ok {
		return nil, why, false
	}
	return acc, "", true
}

// mqttTLS builds a listener's TLS configuration, nil without TLS.
func (l mqttListener) mqttTLS() (*tls.Config, *keyPair, error) {
	t := l.tls
	if !t.enabled() {
		return nil, nil, nil
	}
	cfg, kp, err := serverTLS(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", l.field("tls"), err)
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", l.field("tls.client_ca_file"), err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("%s: %s holds no PEM certificate", l.field("tls.client_ca_file"), t.ClientCAFile)
		}
		cfg.ClientCAs = pool
	}
	switch strings.ToLower(t.ClientAuth) {
	case "request":
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	case "require":
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, kp, nil
}

// serverTLS is a server TLS configuration with the key pair of certFile
// and keyFile, TLS 1.2 at least, with AEAD suites only (aeadSuites). Its
// certificate is read again by keyPair.reload (SIGHUP), so a renewed
// certificate needs no restart.
func serverTLS(certFile, keyFile string) (*tls.Config, *keyPair, error) {
	kp := &keyPair{certFile: certFile, keyFile: keyFile}
	if err := kp.reload(); err != nil {
		return nil, nil, err
	}
	return &tls.Config{GetCertificate: kp.get, MinVersion: tls.VersionTLS12, CipherSuites: aeadSuites}, kp, nil
}

// aeadSuites are the TLS 1.2 suites the MQTT and HTTP listeners offer:
// ECDHE with AES-GCM or ChaCha20-Poly1305. Go's defaults also have
// ECDHE with AES-CBC and HMAC-SHA1 (MAC-then-encrypt: Lucky13-class
// padding oracles), which no client needs: TLS 1.2 stacks have had GCM
// since about 2013. TLS 1.3 suites, all AEAD, are not
// configurable and unaffected; the site's own TLS is 1.3 only.
var aeadSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// keyPair is a listener's certificate and key, replaced as a whole when
// both files read well.
type keyPair struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func (k *keyPair) reload() error {
	pair, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	k.cur.Store(&pair)
	return nil
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return k.cur.Load(), nil }
